#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/custom_class.h>

#include <torch_monitor/export.h>
#include <torch_monitor/sinks/sink.h>

namespace torch_monitor::script {

// Base of the custom classes of the sinks
// (torch.classes.torch_monitor.TensorBoardWriter, JsonLinesWriter,
// ConsoleHandler, MemoryHandler): each holds the same C++ sink object a C++
// program would make. The Python sink classes are faces of these objects,
// and register_event_handler finds the sink through this base to register
// it without wrapping it in a Python callable.
// Thread safety: as the sink it holds.
class TORCH_MONITOR_API ScriptSinkHolder : public torch::CustomClassHolder {
 public:
  explicit ScriptSinkHolder(std::shared_ptr<sinks::Sink> sink)
      : sink_(std::move(sink)) {}
  ~ScriptSinkHolder() override; // out of line: one exported type_info

  const std::shared_ptr<sinks::Sink>& sink() const noexcept {
    return sink_;
  }

  // The sink inside `object` when it is one of the sink classes' objects,
  // nullptr for any other value.
  static std::shared_ptr<sinks::Sink> sinkOf(const c10::IValue& object);

 private:
  std::shared_ptr<sinks::Sink> sink_;
};

} // namespace torch_monitor::script
