#pragma once

#include <memory>

#include <torch/custom_class.h>

#include <torch_monitor/export.h>
#include <torch_monitor/watch/recorder.h>

namespace torch_monitor::script {

// torch.classes.torch_monitor.Watch: the recorder of a watch
// (watch/recorder.h) as a TorchScript object, which the Python watch()
// holds; its observations go through the op
// torch.ops.torch_monitor.watch_observe_ (registered beside it).
// Thread safety: as the recorder it holds.
class TORCH_MONITOR_API ScriptWatch : public torch::CustomClassHolder {
 public:
  // `writer`: the TensorBoardWriter object it was given (None for none),
  // kept for its configuration (the recorder holds the C++ writer).
  ScriptWatch(std::shared_ptr<watch::Recorder> recorder, c10::IValue writer)
      : recorder_(std::move(recorder)), writer_(std::move(writer)) {}
  ~ScriptWatch() override;

  const std::shared_ptr<watch::Recorder>& recorder() const noexcept {
    return recorder_;
  }
  const c10::IValue& writer() const noexcept {
    return writer_;
  }

 private:
  std::shared_ptr<watch::Recorder> recorder_;
  c10::IValue writer_;
};

// The class and the op, from the one TORCH_LIBRARY block
// (registration.cpp), after the sink classes (the class takes a writer).
void registerWatch(torch::Library& m);

} // namespace torch_monitor::script
