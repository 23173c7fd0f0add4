#pragma once

#include <memory>

#include <torch/custom_class.h>

#include <torch_monitor/export.h>
#include <torch_monitor/sinks/sink.h>

namespace torch_monitor::script {

// Base of the TorchScript faces of the sinks
// (torch.classes.torch_monitor.TensorBoardWriter, JsonLinesWriter,
// ConsoleHandler, MemoryHandler): each holds the same C++ sink object a C++
// program would make, and the Python binding finds it through this base to
// register a torch.classes sink without wrapping it in a Python callable.
// Thread safety: as the sink it holds.
class TORCH_MONITOR_API ScriptSinkHolder : public torch::CustomClassHolder {
 public:
  explicit ScriptSinkHolder(std::shared_ptr<sinks::Sink> sink)
      : sink_(std::move(sink)) {}
  ~ScriptSinkHolder() override; // out of line: one exported type_info

  const std::shared_ptr<sinks::Sink>& sink() const noexcept {
    return sink_;
  }

 private:
  std::shared_ptr<sinks::Sink> sink_;
};

} // namespace torch_monitor::script
