// torch_monitor._C._monitors_of: the monitors a scripted module holds (the
// C++ monitorsOf), for torch_monitor.monitors_of.

#include "py_common.h"

#include <torch/csrc/jit/python/pybind_utils.h>

#include <torch_monitor/script/monitors_of.h>

namespace torch_monitor::python {

void initMonitorListing(py::module_& m) {
  m.def(
      "_monitors_of",
      [](const torch::jit::Module& module) {
        py::list out;
        for (const script::MonitorEntry& entry : script::monitorsOf(module)) {
          out.append(py::make_tuple(
              entry.path,
              entry.kind,
              py::cast(torch::jit::Object(entry.monitor.toObject()))));
        }
        return out;
      },
      py::arg("module"),
      "[(path, kind, monitor object), ...] of the torch_monitor monitors a "
      "torch._C.ScriptModule and its submodules hold");
  m.def(
      "_monitor_kind",
      [](const py::handle& value) -> std::string {
        // Only script objects can be monitors; anything else is not one.
        try {
          return script::monitorKind(
              c10::IValue(value.cast<torch::jit::Object>()._ivalue()));
        } catch (const py::cast_error&) {
          return "";
        }
      },
      py::arg("value"),
      "the class name of a torch_monitor monitor object "
      "(e.g. 'DifferenceMonitor'), or '' for any other value");
}

} // namespace torch_monitor::python
