// Python classes for the native sinks (the public, documented classes are
// the subclasses in torch_monitor/sinks.py), and the lookup that lets
// register_event_handler take a native sink without a Python callable in
// the event path.

#include "py_common.h"

#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/jit/api/object.h>

#include <c10/util/Exception.h>

#include <torch_monitor/event_handler.h>
#include <torch_monitor/script/script_sinks.h>
#include <torch_monitor/sinks/detail/buffered_file_writer.h>
#include <torch_monitor/sinks/sinks.h>

namespace torch_monitor::python {
namespace {

using sinks::ConsoleHandler;
using sinks::JsonLinesWriter;
using sinks::MemoryHandler;
using sinks::Sink;
using sinks::TensorBoardWriter;

// Collects the c10 warnings raised on this thread while a sink method runs
// (with the GIL released), then re-issues them as Python RuntimeWarnings:
// an unwritable log directory found by the constructor or by flush() is
// then seen, and filterable, like any Python warning. Warnings raised on the
// flusher thread have no Python caller; they go to c10's default (stderr),
// and every one of them is also listed by the sink's `problems`.
class WarningsToPython : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    messages_.push_back(warning.msg());
  }

  // Runs fn() without the GIL, then warns; raises if a warning filter turns
  // a warning into an error.
  template <typename Fn>
  static auto run(Fn&& fn) {
    WarningsToPython handler;
    using Result = decltype(fn());
    if constexpr (std::is_void_v<Result>) {
      {
        c10::WarningUtils::WarningHandlerGuard guard(&handler);
        py::gil_scoped_release noGil;
        fn();
      }
      handler.emit();
    } else {
      std::optional<Result> result;
      {
        c10::WarningUtils::WarningHandlerGuard guard(&handler);
        py::gil_scoped_release noGil;
        result.emplace(fn());
      }
      handler.emit();
      return std::move(*result);
    }
  }

 private:
  void emit() {
    for (const std::string& message : messages_) {
      if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) {
        throw py::error_already_set();
      }
    }
  }

  std::vector<std::string> messages_;
};

template <typename S, typename... Args>
std::shared_ptr<S> makeSink(Args&&... args) {
  return WarningsToPython::run(
      [&] { return std::make_shared<S>(std::forward<Args>(args)...); });
}

size_t bufferBytes(int64_t bytes) {
  TORCH_CHECK_VALUE(
      bytes > 0, "max_buffer_bytes must be positive, got ", bytes);
  return static_cast<size_t>(bytes);
}

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
  if (py::isinstance<EventHandler>(obj)) {
    return obj.cast<std::shared_ptr<EventHandler>>();
  }
  // A torch.classes.torch_monitor sink (e.g. read back from a scripted
  // module): a ScriptObject whose one slot is the C++ holder.
  if (py::isinstance<torch::jit::Object>(obj)) {
    const auto object = obj.cast<torch::jit::Object>()._ivalue();
    if (object->slots().size() == 1 && object->getSlot(0).isCapsule()) {
      const auto capsule = object->getSlot(0).toCapsule();
      if (const auto* holder =
              dynamic_cast<const script::ScriptSinkHolder*>(capsule.get())) {
        return holder->sink();
      }
    }
  }
  return nullptr;
}

void initSinks(py::module_& m) {
  py::class_<EventHandler, std::shared_ptr<EventHandler>>(
      m,
      "_NativeEventHandler",
      "An event handler implemented in C++: registered without any Python "
      "in the event path");

  py::class_<Sink, EventHandler, std::shared_ptr<Sink>>(m, "_Sink")
      .def(
          "register",
          [](Sink& self) { self.registerSelf(); },
          "Registers this sink as an event handler; a no-op while registered")
      .def(
          "unregister",
          [](Sink& self) { self.unregisterSelf(); },
          "Undoes register()")
      .def_property_readonly(
          "registered",
          [](const Sink& self) { return self.registeredSelf(); },
          "Whether register() (or `with`) registered it")
      .def(
          "flush",
          [](Sink& self) { WarningsToPython::run([&] { self.flush(); }); },
          "Writes what is buffered now, on the calling thread")
      .def(
          "close",
          [](Sink& self) { WarningsToPython::run([&] { self.close(); }); },
          "Unregisters (what register() did), flushes and releases the "
          "output; later events are ignored")
      .def_property_readonly("closed", &Sink::closed)
      .def_property_readonly(
          "dropped",
          &Sink::dropped,
          "Events or values lost: buffer full, failing output, overwritten")
      .def_property_readonly(
          "problems",
          &Sink::problems,
          "The distinct problems warned about so far")
      .def(
          "__enter__",
          [](py::object self) {
            self.cast<Sink&>().registerSelf();
            return self;
          })
      .def(
          "__exit__",
          [](Sink& self, py::handle, py::handle, py::handle) {
            WarningsToPython::run([&] { self.close(); });
            return false;
          })
      .def("__repr__", [](const Sink& self) {
        return self.description();
      });

  py::class_<TensorBoardWriter, Sink, std::shared_ptr<TensorBoardWriter>>(
      m, "_TensorBoardWriter")
      .def(
          py::init([](std::string logdir,
                      double flushInterval,
                      int64_t maxBufferBytes,
                      std::vector<std::string> eventNames,
                      std::string stepKey) {
            sinks::TensorBoardWriterOptions options;
            options.flushInterval =
                sinks::flushIntervalFromSeconds(flushInterval);
            options.maxBufferBytes = bufferBytes(maxBufferBytes);
            options.eventNames = std::move(eventNames);
            options.stepKey = std::move(stepKey);
            return makeSink<TensorBoardWriter>(
                std::move(logdir), std::move(options));
          }),
          py::arg("log_dir"),
          py::arg("flush_interval"),
          py::arg("max_buffer_bytes"),
          py::arg("event_names"),
          py::arg("step_key"))
      .def(
          "add_scalar",
          [](TensorBoardWriter& self,
             const std::string& tag,
             double value,
             int64_t step,
             std::optional<double> wallTime) {
            self.addScalar(
                tag,
                value,
                step,
                wallTime.value_or(std::numeric_limits<double>::quiet_NaN()));
          },
          py::arg("tag"),
          py::arg("scalar_value"),
          py::arg("global_step"),
          py::arg("walltime") = py::none())
      .def_property_readonly("log_dir", &TensorBoardWriter::logdir)
      .def_property_readonly("file_path", &TensorBoardWriter::filePath)
      .def_property_readonly(
          "flush_interval",
          [](const TensorBoardWriter& self) {
            return self.options().flushInterval.count() / 1000.0;
          })
      .def_property_readonly("event_names", [](const TensorBoardWriter& self) {
        return self.options().eventNames;
      });

  py::class_<JsonLinesWriter, Sink, std::shared_ptr<JsonLinesWriter>>(
      m, "_JsonLinesWriter")
      .def(
          py::init([](std::string path,
                      double flushInterval,
                      int64_t maxBufferBytes,
                      std::vector<std::string> eventNames,
                      bool append) {
            sinks::JsonLinesWriterOptions options;
            options.flushInterval =
                sinks::flushIntervalFromSeconds(flushInterval);
            options.maxBufferBytes = bufferBytes(maxBufferBytes);
            options.eventNames = std::move(eventNames);
            options.append = append;
            return makeSink<JsonLinesWriter>(
                std::move(path), std::move(options));
          }),
          py::arg("path"),
          py::arg("flush_interval"),
          py::arg("max_buffer_bytes"),
          py::arg("event_names"),
          py::arg("append").noconvert()) // a str is not a bool
      .def_property_readonly("path", &JsonLinesWriter::path);

  py::class_<ConsoleHandler, Sink, std::shared_ptr<ConsoleHandler>>(
      m, "_ConsoleHandler")
      .def(
          py::init([](const std::string& stream,
                      std::vector<std::string> eventNames) {
            return makeSink<ConsoleHandler>(
                sinks::consoleStreamFromName(stream), std::move(eventNames));
          }),
          py::arg("stream"),
          py::arg("event_names"))
      .def_property_readonly("stream", [](const ConsoleHandler& self) {
        return std::string(sinks::consoleStreamName(self.stream()));
      });

  py::class_<MemoryHandler, Sink, std::shared_ptr<MemoryHandler>>(
      m, "_MemoryHandler")
      .def(
          py::init([](int64_t capacity, std::vector<std::string> eventNames) {
            TORCH_CHECK_VALUE(
                capacity > 0,
                "MemoryHandler: capacity must be at least 1, got ",
                capacity);
            return makeSink<MemoryHandler>(
                static_cast<size_t>(capacity), std::move(eventNames));
          }),
          py::arg("capacity"),
          py::arg("event_names"))
      .def(
          "events",
          [](const MemoryHandler& self) {
            py::list out;
            for (Event& event : self.events()) {
              out.append(py::cast(std::move(event)));
            }
            return out;
          },
          "A list of the events held, oldest first")
      .def("clear", &MemoryHandler::clear, "Forgets every event held")
      .def("__len__", &MemoryHandler::size)
      .def_property_readonly("capacity", &MemoryHandler::capacity);

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
