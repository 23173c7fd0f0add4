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

// New objects of the sink classes, made exactly as their TorchScript
// constructors make them (same arguments, checks and defaults); the Python
// sink classes wrap these.
TORCH_MONITOR_API c10::IValue newTensorBoardWriter(
    std::string logdir,
    double flushIntervalSeconds,
    int64_t maxBufferBytes,
    std::vector<std::string> eventNames,
    std::string stepKey,
    const std::string& ranks);
TORCH_MONITOR_API c10::IValue newJsonLinesWriter(
    std::string path,
    double flushIntervalSeconds,
    int64_t maxBufferBytes,
    std::vector<std::string> eventNames,
    bool append,
    const std::string& ranks);
TORCH_MONITOR_API c10::IValue newConsoleHandler(
    const std::string& stream,
    std::vector<std::string> eventNames);
TORCH_MONITOR_API c10::IValue newMemoryHandler(
    int64_t capacity,
    std::vector<std::string> eventNames);
TORCH_MONITOR_API c10::IValue newPrometheusExporter(
    int64_t port,
    std::string host,
    const std::map<std::string, std::string>& labels);
TORCH_MONITOR_API c10::IValue newPrometheusTextFile(
    std::string path,
    const std::map<std::string, std::string>& labels);

} // namespace torch_monitor::script
