#pragma once

#include <memory>

#include <torch/custom_class.h>

#include <torch_monitor/export.h>
#include <torch_monitor/watch/recorder.h>
#include <torch_monitor/watch/step_observer.h>

namespace torch_monitor::script {

// torch.classes.torch_monitor.Watch: the recorder of a watch
// (watch/recorder.h) as a TorchScript object, which the Python watch()
// holds; its hooks' observations go through the op
// torch.ops.torch_monitor.watch_observe_ (registered beside it), those of
// optimizer steps through its StepObserver.
// Thread safety: as the recorder it holds.
class TORCH_MONITOR_API ScriptWatch : public torch::CustomClassHolder {
 public:
  // `writer`: the TensorBoardWriter object it was given (None for none),
  // kept for its configuration (the recorder holds the C++ writer).
  ScriptWatch(std::shared_ptr<watch::Recorder> recorder, c10::IValue writer)
      : recorder_(std::move(recorder)),
        writer_(std::move(writer)),
        steps_(std::make_shared<watch::StepObserver>(
            recorder_, std::vector<int64_t>(), std::vector<at::Tensor>())) {}
  ~ScriptWatch() override;

  const std::shared_ptr<watch::Recorder>& recorder() const noexcept {
    return recorder_;
  }
  const c10::IValue& writer() const noexcept {
    return writer_;
  }
  // What optimizer steps show it: nothing but their count until
  // watch_steps() names the parameters (once, before the first step).
  watch::StepObserver& steps() const noexcept {
    return *steps_;
  }
  void setSteps(std::shared_ptr<watch::StepObserver> steps) {
    steps_ = std::move(steps);
  }

 private:
  std::shared_ptr<watch::Recorder> recorder_;
  c10::IValue writer_;
  std::shared_ptr<watch::StepObserver> steps_;
};

// The class and the op, from the one TORCH_LIBRARY block
// (registration.cpp), after the sink classes (the class takes a writer).
void registerWatch(torch::Library& m);

} // namespace torch_monitor::script
