#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include <torch_monitor/export.h>

namespace torch_monitor {

// The process-wide training step: what the training loop calls its
// optimizer step. Stat events carry the step current when their window
// closed, sinks write points at it, and Stats built with window steps close
// their windows when it crosses a multiple of their length.
// Thread safety: setStep and getStep may be called from any thread; a
// reader sees some value that was set, never a torn one.

namespace detail {
inline constexpr int64_t kNoStep = std::numeric_limits<int64_t>::min();
TORCH_MONITOR_API extern std::atomic<int64_t> trainingStep;

// Told of step changes after the step is stored, on the thread that
// changed it: how a watch (watch/recorder.h) closes its windows at the step
// that ends them and opens or shuts its device-side gate for the next step,
// with nothing to do per observation, and how Stats with step windows
// close a window the step went back from (live_stats.h). setStep() pays one
// atomic load while no listener exists. A listener's exception reaches
// setStep()'s caller after every listener ran (as a handler's reaches
// logEvent's).
// Thread safety: add/remove from any thread; a listener removed while a
// setStep() is telling it may be told once more (by that call).
class TORCH_MONITOR_API StepListener {
 public:
  virtual ~StepListener() = default;
  // After every setStep().
  virtual void onStep(int64_t /*step*/) {}
  // When the step goes back: setStep(step) below the step the run had
  // `reached`, or clearStep() from a step above 0 (step windows then read
  // step 0). Told before onStep().
  virtual void onStepWentBack(int64_t /*step*/, int64_t /*reached*/) {}
};
TORCH_MONITOR_API void addStepListener(std::shared_ptr<StepListener> listener);
TORCH_MONITOR_API void removeStepListener(const StepListener* listener) noexcept;
} // namespace detail

// Throws c10::ValueError, naming `what`, for a negative step: the one rule
// every step (setStep's, an Event's) follows.
TORCH_MONITOR_API void checkStep(int64_t step, std::string_view what);

// Sets the step. Throws c10::ValueError for a negative step (TensorBoard's
// step axis and step windows start at 0). A step before the last one (a run
// restarted from a checkpoint) closes the open windows of the Stats with
// step windows that do not hold it, logging them at the step reached; their
// next add() opens the window the new step is in. A handler exception of
// those events is rethrown once all are logged (the step is set).
TORCH_MONITOR_API void setStep(int64_t step);

// Forgets the step: getStep() is empty again, as before the first
// setStep(). Step windows then read step 0, which closes their open windows
// as setStep(0) would (a failing handler is reported as a warning).
TORCH_MONITOR_API void clearStep() noexcept;

// setStep(*step), or clearStep() for nothing: what the Python and
// TorchScript set_step(None) do.
inline void setOrClearStep(std::optional<int64_t> step) {
  if (step) {
    setStep(*step);
  } else {
    clearStep();
  }
}

// The step last set, or nothing before the first setStep().
inline std::optional<int64_t> getStep() noexcept {
  const int64_t step = detail::trainingStep.load(std::memory_order_relaxed);
  if (step == detail::kNoStep) {
    return std::nullopt;
  }
  return step;
}

// The step of a window closed before its end (at exit, on destruction, by a
// watch's remove() or close()): the one after the last step set, so that it
// never shares a step with the window that step's setStep() closed. Nothing
// before the first setStep(); the last step, 2**63-1, stays itself.
inline std::optional<int64_t> stepOfEarlyClose() noexcept {
  const std::optional<int64_t> step = getStep();
  if (step && *step < std::numeric_limits<int64_t>::max()) {
    return *step + 1;
  }
  return step;
}

} // namespace torch_monitor
