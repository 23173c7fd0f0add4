#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include <torch/custom_class.h>

#include <torch_monitor/wait_counter.h>

namespace torch_monitor::script {

// The TorchScript face of WaitCounter: torch.classes.torch_monitor.
// WaitCounter, a handle of the process's counter of its key
// (sharedWaitCounter). The Python binding wraps the very same object.
// Thread safety: as WaitCounter.
class ScriptWaitCounter : public torch::CustomClassHolder {
 public:
  ScriptWaitCounter(
      const std::string& key,
      std::chrono::milliseconds window,
      WindowClose windowClose)
      : counter_(sharedWaitCounter(key, window, windowClose)) {}

  WaitCounter& counter() noexcept {
    return *counter_;
  }
  const WaitCounter& counter() const noexcept {
    return *counter_;
  }

 private:
  const std::shared_ptr<WaitCounter> counter_;
};

// What WaitCounter.guard() returns in Python and TorchScript: times one unit
// of work at a time, from enter() (__enter__) to exit() (__exit__), so that
// `with counter.guard():` works in both. It keeps its counter alive.
// Thread safety: no concurrent call causes a data race; entering it again
// before exit() throws.
class ScriptWaitCounterTracker : public torch::CustomClassHolder {
 public:
  explicit ScriptWaitCounterTracker(c10::intrusive_ptr<ScriptWaitCounter> c)
      : counter_(std::move(c)) {}

  // Starts timing; throws c10::Error if a unit is already being timed.
  void enter();
  // Records the unit started by enter(); does nothing when none is (an
  // __exit__ without __enter__, or a second one). Event handler exceptions
  // propagate.
  void exit();

  const c10::intrusive_ptr<ScriptWaitCounter>& counter() const noexcept {
    return counter_;
  }

 private:
  const c10::intrusive_ptr<ScriptWaitCounter> counter_;
  std::mutex mutex_; // guards guard_
  std::optional<WaitCounter::Guard> guard_;
};

} // namespace torch_monitor::script
