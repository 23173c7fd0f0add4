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

  // Before the step: observes the gradients, and copies the weights the
  // step will change (optimizers skip parameters without a gradient).
  void before();
  // After it: observes the weights and the updates, then counts the step.
  void after();

 private:
  using Watched = std::vector<std::pair<int64_t, at::Tensor>>;
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
};

} // namespace torch_monitor::watch
