#pragma once

#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>

#include <torch_monitor/export.h>

namespace torch_monitor::script {

// One monitor held by a scripted (or torch::jit::load'ed) module.
// Thread safety: a plain value; `monitor` is as thread-safe as its class.
struct MonitorEntry {
  // Where it is: the dotted path of the attribute from the module given,
  // e.g. "block._torch_monitor_difference_3" (the attribute names are
  // generated, hence this listing).
  std::string path;
  // Which monitor it is: "DifferenceMonitor", "InputMonitor",
  // "OutputMonitor", "StateMonitor", "MultiStateMonitor" or "Monitor" (a
  // Python subclass of torch_monitor.Monitor); all of these are
  // torch.classes.torch_monitor.DifferenceMonitor objects.
  std::string kind;
  // The torch.classes.torch_monitor object; for a DifferenceMonitor,
  // `monitor.toCustomClass<ScriptDifferenceMonitor>()`.
  c10::IValue monitor;
};

// Which monitor a torch_monitor monitor object is ("DifferenceMonitor",
// "OutputMonitor", ...; see MonitorEntry::kind), or "" for any other value.
// Thread safety: pure.
TORCH_MONITOR_API std::string monitorKind(const c10::IValue& value);

// Every torch_monitor monitor held by `module` or its submodules, in the
// module's attribute order, so a C++ program reads a loaded model's monitors
// without guessing attribute names. Thread safety: reads the module only;
// call it while nobody adds or removes attributes.
TORCH_MONITOR_API std::vector<MonitorEntry> monitorsOf(
    const torch::jit::Module& module);

// The monitors of monitorsOf(module) that have recorded nothing (peek() is
// None). Call it after running the model: a non-empty result usually means
// the model was run with `module.forward(inputs)`, which skips the forward
// hooks of `module` itself (so its monitors; submodules called inside
// forward() still run theirs); run `module(inputs)` instead. With
// `warn`, also warns (TORCH_WARN_ONCE: once per process) naming them.
// Thread safety: as monitorsOf().
TORCH_MONITOR_API std::vector<MonitorEntry> silentMonitors(
    const torch::jit::Module& module,
    bool warn = true);

} // namespace torch_monitor::script
