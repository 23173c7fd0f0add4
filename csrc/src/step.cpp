#include <torch_monitor/step.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <vector>

#include <c10/util/Exception.h>

#include <torch_monitor/detail/call_each.h>
#include <torch_monitor/detail/fork_safe_locks.h>
#include <torch_monitor/detail/text.h>

namespace torch_monitor {

namespace detail {
std::atomic<int64_t> trainingStep{kNoStep};

namespace {

using Listeners = std::vector<std::shared_ptr<StepListener>>;

// Copy-on-write: setStep() tells the list it found, outside the lock, so a
// listener may set the step, log events (whose handlers may add or remove
// listeners) without deadlocking.
struct StepListenerRegistry {
  std::mutex mutex;
  // Taken on every set_step(): a child of fork() finds it free.
  ForkSafeLocks forkLocks{ForkLockMode::kInner, {&mutex}};
  std::shared_ptr<const Listeners> listeners;
  std::atomic<bool> any{false};

  // Never destroyed: a watch may be removed during static destruction.
  static StepListenerRegistry& get() {
    static auto* registry = new StepListenerRegistry();
    return *registry;
  }
};

// Calls tell(listener) for each listener, then rethrows the first
// exception.
template <typename F>
void tellStepListeners(const F& tell) {
  StepListenerRegistry& r = StepListenerRegistry::get();
  if (!r.any.load(std::memory_order_acquire)) {
    return;
  }
  std::shared_ptr<const Listeners> listeners;
  {
    std::lock_guard<std::mutex> guard(r.mutex);
    listeners = r.listeners;
  }
  if (!listeners) {
    return;
  }
  callEach(*listeners, [&](const std::shared_ptr<StepListener>& listener) {
    tell(*listener);
  });
}

} // namespace

void addStepListener(std::shared_ptr<StepListener> listener) {
  StepListenerRegistry& r = StepListenerRegistry::get();
  std::lock_guard<std::mutex> guard(r.mutex);
  auto next = r.listeners ? std::make_shared<Listeners>(*r.listeners)
                          : std::make_shared<Listeners>();
  next->push_back(std::move(listener));
  r.listeners = std::move(next);
  r.any.store(true, std::memory_order_release);
}

void removeStepListener(const StepListener* listener) noexcept {
  StepListenerRegistry& r = StepListenerRegistry::get();
  std::lock_guard<std::mutex> guard(r.mutex);
  if (!r.listeners) {
    return;
  }
  auto next = std::make_shared<Listeners>();
  for (const auto& l : *r.listeners) {
    if (l.get() != listener) {
      next->push_back(l);
    }
  }
  r.any.store(!next->empty(), std::memory_order_release);
  r.listeners = next->empty() ? nullptr : std::move(next);
}

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
  const bool wentBack = previous && step < *previous;
  detail::tellStepListeners([&](detail::StepListener& listener) {
    if (wentBack) {
      listener.onStepWentBack(step, *previous);
    }
    listener.onStep(step);
  });
}

void clearStep() noexcept {
  const std::optional<int64_t> previous = getStep();
  detail::trainingStep.store(detail::kNoStep, std::memory_order_relaxed);
  if (previous && *previous > 0) {
    try {
      // Step windows read step 0 now.
      detail::tellStepListeners([&](detail::StepListener& listener) {
        listener.onStepWentBack(0, *previous);
      });
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
