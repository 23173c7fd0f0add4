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
  explicit ScriptWatch(std::shared_ptr<watch::Recorder> recorder)
      : recorder_(std::move(recorder)) {}
  ~ScriptWatch() override;

  const std::shared_ptr<watch::Recorder>& recorder() const noexcept {
    return recorder_;
  }

 private:
  std::shared_ptr<watch::Recorder> recorder_;
};

// The class and the op, from the one TORCH_LIBRARY block
// (registration.cpp), after the sink classes (the class takes a writer).
void registerWatch(torch::Library& m);

} // namespace torch_monitor::script
