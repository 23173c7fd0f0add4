#include <torch_monitor/step.h>

#include <c10/util/Exception.h>

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
  detail::trainingStep.store(step, std::memory_order_relaxed);
}

void clearStep() noexcept {
  detail::trainingStep.store(detail::kNoStep, std::memory_order_relaxed);
}

} // namespace torch_monitor
