#pragma once

// watch(model) for C++ LibTorch programs: every parameter's gradient,
// weight and update, and every submodule's output and output gradient, as
// windowed statistics with the same keys and events as Python's
// torch_monitor.watch (docs/watch.md):
//
//   torch_monitor::WatchOptions options;
//   options.what = {"grad", "update"};
//   options.windowSteps = 100;
//   torch_monitor::Watch watch(model, options);
//   for (int64_t step = 0; step < steps; ++step) {
//     torch_monitor::setStep(step);
//     optimizer.zero_grad();
//     loss(model->forward(x)).backward();
//     watch.step([&] { optimizer.step(); });   // C++ optimizers have no hooks
//   }
//
// Needs only a declaration of torch::nn::Module; the work is in watch.cpp.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch_monitor/export.h>
#include <torch_monitor/nn/hooks.h>
#include <torch_monitor/watch/recorder.h>
#include <torch_monitor/watch/step_observer.h>

namespace torch {
namespace nn {
class Module;
} // namespace nn
} // namespace torch

namespace torch_monitor {

// What a Watch observes and how it windows it; a plain value. The same
// arguments as Python's watch() (there, keywords).
struct WatchOptions {
  // Any of "grad", "weight", "update", "output", "output_grad". Gradients
  // by default, the kind cheap enough to leave on: an update copies the
  // weights before every step (docs/watch.md, "Cost").
  std::vector<std::string> what{"grad"};
  // Exactly one window: training steps, or time.
  int64_t windowSteps = 0;
  std::chrono::milliseconds windowSize{0};
  // Observe on steps divisible by `every`.
  int64_t every = 1;
  // Regular expressions (ECMAScript, searched anywhere in the path as
  // Python's re.search does) over parameter paths ("fc1.weight") and
  // module paths ("fc1"); each must match something.
  std::optional<std::string> include;
  std::optional<std::string> exclude;
  // A histogram of each watched tensor every histogramsEvery steps (0:
  // none), written by `writer`.
  int64_t histogramsEvery = 0;
  std::shared_ptr<sinks::TensorBoardWriter> writer;
  // Add the CUDA allocator's counters to each window's event.
  bool memory = false;
  // Merge the windows of every rank on rank 0; `group` nullptr: the
  // process default group (setDefaultRankGroup).
  bool syncRanks = false;
  std::shared_ptr<const RankGroup> group;
  // After each "torch_monitor.NonFinite" event (at the step change after
  // the step that saw NaN or inf): `onNonFiniteHandler` gets the event,
  // then Warn warns and Raise throws c10::Error naming the keys and steps
  // (from setStep() or step(), after every listener of the step ran).
  watch::OnNonFinite onNonFinite = watch::OnNonFinite::Log;
  std::shared_ptr<EventHandler> onNonFiniteHandler;
  // With windowSize: close each window when it ends, on the window timer's
  // thread, even if no step change comes (a stalled run still logs).
  bool closeOnTime = false;
};

// Watches a torch::nn::Module until remove() or destruction.
//
// - "grad", "weight" and "update" are observed in step(), which wraps the
//   optimizer step: the gradients before it (as the optimizer uses them),
//   the weights after it, and their change across it. C++ optimizers have
//   no hooks, so this one call is how the watch sees the step. "update"
//   keeps one copy of each watched parameter (made at the first step).
// - "output" and "output_grad" are observed by forward hooks
//   (torch_monitor/nn/hooks.h): for submodules called through
//   torch_monitor::nn::call, since C++ forward() is not virtual. The root
//   module is not observed.
// - Tied parameters (one tensor under two names) are watched once, under
//   their first name; frozen ones (requires_grad false) not at all. The
//   keys are Python's for the same model (watch/plan.h).
// - The statistics stay on the device of the model's first parameter
//   (create the watch after moving the model); nothing waits for the
//   device but a window's close.
// Throws c10::ValueError for an unknown kind, a regular expression that
// matches nothing, no window or two.
// Thread safety: step(), close() and remove() may be called from any
// thread; observations and window closes are serialised by the recorder.
class TORCH_MONITOR_API Watch {
 public:
  Watch(torch::nn::Module& model, WatchOptions options);
  // A holder (torch::nn::Linear), a std::shared_ptr<M> or an M&.
  template <typename M>
  Watch(M&& model, WatchOptions options)
      : Watch(nn::detail::moduleOf(model), std::move(options)) {}
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  // Runs `optimizerStep` (e.g. [&] { optimizer.step(); }) with the
  // observations around it; see the class comment. `gradientsAfter`: the
  // step computes the gradients itself (a closure): they are observed
  // after it, as its last call of the closure left them.
  void step(
      const std::function<void()>& optimizerStep,
      bool gradientsAfter = false);
  // step() for anything with a step() method (a torch::optim::Optimizer).
  template <typename Optimizer>
  auto step(Optimizer& optimizer)
      -> decltype(optimizer.step(), void()) {
    step(std::function<void()>([&optimizer] { optimizer.step(); }));
  }
  // step() of an optimizer that calls `closure` for the loss and the
  // gradients (torch::optim::LBFGS).
  template <typename Optimizer, typename Closure>
  auto step(Optimizer& optimizer, Closure&& closure)
      -> decltype(optimizer.step(closure), void()) {
    step(
        std::function<void()>([&] { optimizer.step(closure); }),
        /*gradientsAfter=*/true);
  }

  // Closes and logs the open window now.
  void close();
  // Logs the open window and removes every hook. Idempotent.
  void remove();

  // "<path>.<kind>" of every key, in slot order.
  std::vector<std::string> keys() const;
  const std::shared_ptr<watch::Recorder>& recorder() const noexcept {
    return recorder_;
  }

 private:
  std::shared_ptr<watch::Recorder> recorder_;
  std::unique_ptr<watch::StepObserver> steps_; // grad, weight, update
  std::vector<nn::HookHandle> hooks_;
};

} // namespace torch_monitor
