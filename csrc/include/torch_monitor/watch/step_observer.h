#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include <torch_monitor/export.h>
#include <torch_monitor/watch/recorder.h>

namespace torch_monitor::watch {

// What an optimizer step shows a watch: the gradients the step is about to
// use ("grad" keys), the weights after it ("weight") and their change across
// it ("update"). One code for both worlds: C++'s Watch::step runs it around
// the step it is given, Python's watch() from the optimizer's step hooks.
// Thread safety: before() and after() of a step are called in that order,
// by one thread at a time (the optimizer's).
class TORCH_MONITOR_API StepObserver {
 public:
  // keys[i] (of the recorder's "grad", "weight" or "update" keys) observes
  // the parameter parameters[i]. Throws c10::ValueError for another kind.
  StepObserver(
      std::shared_ptr<Recorder> recorder,
      const std::vector<int64_t>& keys,
      const std::vector<at::Tensor>& parameters);

  // Before the step: copies the weights the step will change (optimizers
  // skip parameters without a gradient) and observes the gradients. A step
  // that computes or rewrites the gradients itself (`gradientsAfter`: a
  // closure, as LBFGS and Lightning pass; GradScaler's fused path, whose
  // kernel unscales them) has them observed by after() instead, as the
  // step left them.
  void before(bool gradientsAfter = false);
  // After it: observes the weights and the updates, then counts the step.
  // A step the optimizer skipped (GradScaler found an inf) observes nothing
  // and is not counted, as when GradScaler does not call step() at all.
  void after(bool skipped = false);

 private:
  using Watched = std::vector<std::pair<int64_t, at::Tensor>>;
  void observeGradients();
  void forgetStep(); // this step's updates: none
  std::shared_ptr<Recorder> recorder_;
  Watched grads_;
  Watched weights_;
  Watched updates_;
  // One copy per update key, made at its first step and kept across steps.
  std::vector<at::Tensor> copies_;
  // This step's updates: the parameters, their copies and their keys.
  std::vector<at::Tensor> stepped_;
  std::vector<at::Tensor> before_;
  std::vector<int64_t> steppedKeys_;
  bool gradientsAfter_ = false; // this step's before() said so
};

} // namespace torch_monitor::watch
