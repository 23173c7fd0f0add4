#include <torch_monitor/step.h>

#include <exception>

#include <c10/util/Exception.h>

#include <torch_monitor/detail/live_stats.h>
#include <torch_monitor/detail/text.h>

namespace torch_monitor {

namespace detail {
std::atomic<int64_t> trainingStep{kNoStep};
} // namespace detail

void checkStep(int64_t step, std::string_view what) {
  TORCH_CHECK_VALUE(
      step >= 0,
      what,
      " must be in [0, 2**63-1], got ",
      step,
      "; pass the optimizer step counter, which starts at 0");
}

void setStep(int64_t step) {
  checkStep(step, "set_step(): the training step");
  const std::optional<int64_t> previous = getStep();
  // Stored first: an add() racing with the step change then reads the new
  // step and opens its new window (rather than refilling the old one).
  detail::trainingStep.store(step, std::memory_order_relaxed);
  if (previous && step < *previous) {
    detail::stepWentBack(step, previous);
  }
}

void clearStep() noexcept {
  const std::optional<int64_t> previous = getStep();
  detail::trainingStep.store(detail::kNoStep, std::memory_order_relaxed);
  if (previous && *previous > 0) {
    try {
      detail::stepWentBack(0, previous); // step windows read 0 now
    } catch (const std::exception& e) {
      TORCH_WARN(
          "torch_monitor: an event handler failed while clear_step() closed "
          "the step windows the step left: ",
          detail::errorMessage(e));
    } catch (...) {
      TORCH_WARN(
          "torch_monitor: an event handler failed while clear_step() closed "
          "the step windows the step left");
    }
  }
}

} // namespace torch_monitor
