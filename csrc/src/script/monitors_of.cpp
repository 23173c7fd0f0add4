#include <torch_monitor/script/monitors_of.h>

#include <c10/util/Exception.h>
#include <torch/csrc/jit/api/object.h>

#include <torch_monitor/script/difference_monitor.h>

namespace torch_monitor::script {
namespace {

constexpr const char* kClassPrefix = "__torch__.torch.classes.torch_monitor.";
constexpr const char* kMonitorSuffix = "Monitor";

} // namespace

// Every *Monitor class the library registers counts, so new monitor classes
// are listed without a change here. One class, DifferenceMonitor, is the core
// of every Python monitor (InputMonitor, OutputMonitor, ...): it says which
// one it serves.
std::string monitorKind(const c10::IValue& value) {
  if (!value.isObject()) {
    return "";
  }
  const auto name = value.toObjectRef().type()->name();
  if (!name) {
    return "";
  }
  const std::string qualified = name->qualifiedName();
  const std::string prefix = kClassPrefix;
  const std::string suffix = kMonitorSuffix;
  if (qualified.size() < prefix.size() + suffix.size() ||
      qualified.compare(0, prefix.size(), prefix) != 0 ||
      qualified.compare(
          qualified.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return "";
  }
  if (value.toObjectRef().type() ==
      c10::getCustomClassType<c10::intrusive_ptr<ScriptDifferenceMonitor>>()) {
    return value.toCustomClass<ScriptDifferenceMonitor>()->kind();
  }
  return qualified.substr(prefix.size());
}

namespace {

void collect(
    const torch::jit::Module& module,
    const std::string& prefix,
    std::vector<MonitorEntry>& out) {
  for (const auto& attribute : module.named_attributes(/*recurse=*/false)) {
    std::string kind = monitorKind(attribute.value);
    if (!kind.empty()) {
      out.push_back(
          MonitorEntry{prefix + attribute.name, std::move(kind), attribute.value});
    }
  }
  for (const auto& child : module.named_children()) {
    collect(child.value, prefix + child.name + ".", out);
  }
}

} // namespace

std::vector<MonitorEntry> monitorsOf(const torch::jit::Module& module) {
  std::vector<MonitorEntry> out;
  collect(module, "", out);
  return out;
}

std::vector<MonitorEntry> silentMonitors(
    const torch::jit::Module& module,
    bool warn) {
  std::vector<MonitorEntry> silent;
  for (MonitorEntry& entry : monitorsOf(module)) {
    torch::jit::Object object(entry.monitor.toObject());
    if (object.find_method("peek") && object.run_method("peek").isNone()) {
      silent.push_back(std::move(entry));
    }
  }
  if (warn && !silent.empty()) {
    std::string names;
    for (const MonitorEntry& entry : silent) {
      names += (names.empty() ? "" : ", ") + entry.path;
    }
    TORCH_WARN_ONCE(
        "torch_monitor: ",
        silent.size(),
        " monitor(s) of this module recorded nothing (",
        names,
        "). If the model ran, it was probably called as "
        "module.forward(inputs), which skips the forward hooks (and so the "
        "monitors) of that module: call module(inputs) instead.");
  }
  return silent;
}

} // namespace torch_monitor::script
