// The lookup that lets register_event_handler take a native sink (its face
// or a torch.classes.torch_monitor sink) without a Python callable in the
// event path, and the sinks' test hooks. The sinks' Python classes are
// derived from their TorchScript schemas (torch_monitor/_faces.py).

#include "py_common.h"

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/jit/api/object.h>
#include <torch/csrc/utils/pybind.h> // at::Tensor from and to Python

#include <c10/util/Exception.h>

#include <torch_monitor/event_handler.h>
#include <torch_monitor/script/sinks.h>
#include <torch_monitor/sinks/detail/buffered_file_writer.h>
#include <torch_monitor/sinks/sinks.h>

namespace torch_monitor::python {
namespace {

// An event carrying raw bytes (invalid UTF-8 included), which Python str
// cannot express and logEvent() refuses; only the tests use it, to check
// that the sinks still write valid files from such text (a C++ handler or
// an older producer could hand them one).
void logRawEvent(const py::bytes& name, const py::dict& data) {
  Event event;
  event.name = name;
  event.timestamp = std::chrono::system_clock::now();
  for (const auto& [key, value] : data) {
    std::string k = py::cast<py::bytes>(key);
    if (PyBytes_Check(value.ptr())) {
      event.data[k] = std::string(py::cast<py::bytes>(value));
    } else if (PyBool_Check(value.ptr())) {
      event.data[k] = value.ptr() == Py_True;
    } else if (PyLong_Check(value.ptr())) {
      event.data[k] = value.cast<int64_t>();
    } else {
      event.data[k] = value.cast<double>();
    }
  }
  torch_monitor::detail::dispatchEvent(event);
}

} // namespace

std::shared_ptr<EventHandler> nativeEventHandler(py::handle obj) {
  // A sink's Python face, or a torch.classes.torch_monitor sink (e.g. read
  // back from a scripted module): both are ScriptObjects of a sink class.
  if (py::isinstance<torch::jit::Object>(obj)) {
    return script::ScriptSinkHolder::sinkOf(
        c10::IValue(obj.cast<torch::jit::Object>()._ivalue()));
  }
  return nullptr;
}

void initSinks(py::module_& m) {
  m.def(
      "_sinks_set_write_error",
      &sinks::detail::BufferedFileWriter::setWriteErrorForTesting,
      py::arg("errno"),
      "Test hook: every file sink write fails with this errno (0: off)");
  m.def(
      "_sinks_log_raw_event",
      &logRawEvent,
      py::arg("name"),
      py::arg("data"),
      "Test hook: logs an event whose name, keys and bytes values are raw "
      "bytes (invalid UTF-8 allowed)");
}

} // namespace torch_monitor::python
