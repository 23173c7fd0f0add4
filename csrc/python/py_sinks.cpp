// Python faces of the sink classes torch.classes.torch_monitor.* (the
// public, documented classes are the subclasses in torch_monitor/sinks.py),
// and the lookup that lets register_event_handler take a native sink without
// a Python callable in the event path.

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

using sinks::ConsoleHandler;
using sinks::JsonLinesWriter;
using sinks::MemoryHandler;
using sinks::PrometheusExporter;
using sinks::PrometheusTextFile;
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

// The Python face of a sink: a torch.ScriptObject wrapping the
// torch.classes.torch_monitor object of the same name, so that Python,
// TorchScript, torch.compile and torch.export all see one object; the
// Python methods reach the C++ sink directly.
// Thread safety: as the sink.
struct PySink : torch::jit::Object {
  explicit PySink(const c10::IValue& object)
      : torch::jit::Object(object.toObject()),
        sink(script::ScriptSinkHolder::sinkOf(object)) {
    TORCH_INTERNAL_ASSERT(sink != nullptr, "not a sink object");
  }
  std::shared_ptr<Sink> sink;
};

// The face of one kind of sink. Thread safety: as S.
template <typename S>
struct PyTypedSink : PySink {
  explicit PyTypedSink(const c10::IValue& object)
      : PySink(object), typed(dynamic_cast<S*>(sink.get())) {
    TORCH_INTERNAL_ASSERT(typed != nullptr, "wrong sink class");
  }
  S* typed;
};

// Makes a face around new(args...) (a script::new<Sink> factory), turning
// the warnings of the constructor (an unwritable directory) into Python's.
template <typename S, typename New, typename... Args>
std::unique_ptr<PyTypedSink<S>> makeFace(New make, Args&&... args) {
  return WarningsToPython::run([&] {
    return std::make_unique<PyTypedSink<S>>(
        make(std::forward<Args>(args)...));
  });
}

// A sink stands for its output (a file, a stream, a buffer), like a
// logging.Logger: a copy of it, or of a module holding it, is the same sink
// (a second one would start a second file or an empty buffer), which also
// lets PyTorch 2 tracing, which deep-copies the objects it traces, see the
// very sink it will run. Pickling is refused: torch.ScriptObject's own would
// rebuild a bare ScriptObject.
void shareCopies(py::handle cls) {
  py::setattr(
      cls,
      "__copy__",
      py::cpp_function(
          [](py::object self) { return self; },
          py::name("__copy__"),
          py::is_method(cls)));
  py::setattr(
      cls,
      "__deepcopy__",
      py::cpp_function(
          [](py::object self, py::handle /*memo*/) { return self; },
          py::name("__deepcopy__"),
          py::is_method(cls)));
  py::setattr(
      cls,
      "__reduce_ex__",
      py::cpp_function(
          [](py::handle self, py::handle /*protocol*/) {
            throw py::type_error(
                std::string("a ") + Py_TYPE(self.ptr())->tp_name +
                " cannot be pickled: it stands for an output of this "
                "process; make a new one with the same arguments "
                "(TorchScript and torch.export archives save its "
                "configuration)");
          },
          py::name("__reduce_ex__"),
          py::is_method(cls)));
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
  // A sink's Python face, or a torch.classes.torch_monitor sink (e.g. read
  // back from a scripted module): both are ScriptObjects of a sink class.
  if (py::isinstance<torch::jit::Object>(obj)) {
    return script::ScriptSinkHolder::sinkOf(
        c10::IValue(obj.cast<torch::jit::Object>()._ivalue()));
  }
  return nullptr;
}

void initSinks(py::module_& m) {
  // Everything the Python classes offer is defined here or forwarded to the
  // TorchScript methods by torch_monitor._fake.make_traceable; the
  // TorchScript names of the shared methods (closed(), dropped(), ...) are
  // properties in Python, as the documented API has them.
  py::class_<PySink, torch::jit::Object> sink(m, "_Sink");
  sink.def(
          "register",
          [](PySink& self) { self.sink->registerSelf(); },
          "Registers this sink as an event handler; a no-op while registered")
      .def(
          "unregister",
          [](PySink& self) { self.sink->unregisterSelf(); },
          "Undoes register()")
      .def_property_readonly(
          "registered",
          [](const PySink& self) { return self.sink->registeredSelf(); },
          "Whether register() (or `with`) registered it")
      .def(
          "flush",
          [](PySink& self) { WarningsToPython::run([&] { self.sink->flush(); }); },
          "Writes what is buffered now, on the calling thread")
      .def(
          "close",
          [](PySink& self) { WarningsToPython::run([&] { self.sink->close(); }); },
          "Unregisters (what register() did), flushes and releases the "
          "output; later events are ignored")
      .def_property_readonly(
          "closed", [](const PySink& self) { return self.sink->closed(); })
      .def_property_readonly(
          "dropped",
          [](const PySink& self) { return self.sink->dropped(); },
          "Events or values lost: buffer full, failing output, overwritten")
      .def_property_readonly(
          "problems",
          [](const PySink& self) { return self.sink->problems(); },
          "The distinct problems warned about so far")
      .def(
          "__enter__",
          [](py::object self) {
            self.cast<PySink&>().sink->registerSelf();
            return self;
          })
      .def(
          "__exit__",
          [](PySink& self, py::handle, py::handle, py::handle) {
            WarningsToPython::run([&] { self.sink->close(); });
            return false;
          })
      .def("__repr__", [](const PySink& self) {
        return self.sink->description();
      })
      // torch.ScriptObject's __str__ would name the TorchScript class only.
      .def("__str__", [](const PySink& self) {
        return self.sink->description();
      });
  shareCopies(sink);

  using TensorBoardFace = PyTypedSink<TensorBoardWriter>;
  py::class_<TensorBoardFace, PySink> tensorBoard(m, "_TensorBoardWriter");
  tensorBoard
      .def(
          py::init([](std::string logdir,
                      double flushInterval,
                      int64_t maxBufferBytes,
                      std::vector<std::string> eventNames,
                      std::string stepKey,
                      const std::string& ranks) {
            return makeFace<TensorBoardWriter>(
                &script::newTensorBoardWriter,
                std::move(logdir),
                flushInterval,
                maxBufferBytes,
                std::move(eventNames),
                std::move(stepKey),
                ranks);
          }),
          py::arg("log_dir"),
          py::arg("flush_interval"),
          py::arg("max_buffer_bytes"),
          py::arg("event_names"),
          py::arg("step_key"),
          py::arg("ranks"))
      .def(
          "add_scalar",
          [](TensorBoardFace& self,
             const std::string& tag,
             double value,
             std::optional<int64_t> step,
             std::optional<double> wallTime) {
            self.typed->addScalar(
                tag,
                value,
                step,
                wallTime.value_or(std::numeric_limits<double>::quiet_NaN()));
          },
          py::arg("tag"),
          py::arg("scalar_value"),
          py::arg("global_step") = py::none(),
          py::arg("walltime") = py::none(),
          "Writes one point at global_step; None: at the training step "
          "(torch_monitor.set_step) when one is set, else at the tag's next "
          "counter value")
      .def(
          "add_histogram",
          [](TensorBoardFace& self,
             const std::string& tag,
             const std::optional<at::Tensor>& values,
             std::optional<int64_t> step,
             std::optional<double> wallTime) {
            // None (a monitor's peek() before its first step) writes
            // nothing, so that one line can feed a histogram every N steps.
            if (values) {
              self.typed->addHistogram(
                  tag,
                  *values,
                  step,
                  wallTime.value_or(std::numeric_limits<double>::quiet_NaN()));
            }
          },
          py::arg("tag"),
          py::arg("values"),
          py::arg("global_step") = py::none(),
          py::arg("walltime") = py::none(),
          "Writes the histogram of values' elements with SummaryWriter's "
          "default buckets at global_step (None: as add_scalar); values None "
          "writes nothing")
      .def_property_readonly(
          "log_dir",
          [](const TensorBoardFace& self) { return self.typed->logdir(); })
      .def_property_readonly(
          "file_path",
          [](const TensorBoardFace& self) { return self.typed->filePath(); })
      .def_property_readonly(
          "run_dir",
          [](const TensorBoardFace& self) { return self.typed->runDir(); })
      .def_property_readonly(
          "ranks",
          [](const TensorBoardFace& self) {
            return sinks::rankFilesName(self.typed->options().ranks);
          })
      .def_property_readonly(
          "flush_interval",
          [](const TensorBoardFace& self) {
            return self.typed->options().flushInterval.count() / 1000.0;
          })
      .def_property_readonly("event_names", [](const TensorBoardFace& self) {
        return self.typed->options().eventNames;
      });
  markFace(tensorBoard, "TensorBoardWriter");

  using JsonLinesFace = PyTypedSink<JsonLinesWriter>;
  py::class_<JsonLinesFace, PySink> jsonLines(m, "_JsonLinesWriter");
  jsonLines
      .def(
          py::init([](std::string path,
                      double flushInterval,
                      int64_t maxBufferBytes,
                      std::vector<std::string> eventNames,
                      bool append,
                      const std::string& ranks) {
            return makeFace<JsonLinesWriter>(
                &script::newJsonLinesWriter,
                std::move(path),
                flushInterval,
                maxBufferBytes,
                std::move(eventNames),
                append,
                ranks);
          }),
          py::arg("path"),
          py::arg("flush_interval"),
          py::arg("max_buffer_bytes"),
          py::arg("event_names"),
          py::arg("append").noconvert(), // a str is not a bool
          py::arg("ranks"))
      .def_property_readonly(
          "path", [](const JsonLinesFace& self) { return self.typed->path(); })
      .def_property_readonly(
          "file_path",
          [](const JsonLinesFace& self) { return self.typed->filePath(); })
      .def_property_readonly("ranks", [](const JsonLinesFace& self) {
        return sinks::rankFilesName(self.typed->options().ranks);
      });
  markFace(jsonLines, "JsonLinesWriter");

  using ConsoleFace = PyTypedSink<ConsoleHandler>;
  py::class_<ConsoleFace, PySink> console(m, "_ConsoleHandler");
  console
      .def(
          py::init([](const std::string& stream,
                      std::vector<std::string> eventNames) {
            return makeFace<ConsoleHandler>(
                &script::newConsoleHandler, stream, std::move(eventNames));
          }),
          py::arg("stream"),
          py::arg("event_names"))
      .def_property_readonly("stream", [](const ConsoleFace& self) {
        return std::string(sinks::consoleStreamName(self.typed->stream()));
      });
  markFace(console, "ConsoleHandler");

  using MemoryFace = PyTypedSink<MemoryHandler>;
  py::class_<MemoryFace, PySink> memory(m, "_MemoryHandler");
  memory
      .def(
          py::init([](int64_t capacity, std::vector<std::string> eventNames) {
            return makeFace<MemoryHandler>(
                &script::newMemoryHandler, capacity, std::move(eventNames));
          }),
          py::arg("capacity"),
          py::arg("event_names"))
      .def(
          "events",
          [](const MemoryFace& self) {
            py::list out;
            for (Event& event : self.typed->events()) {
              out.append(py::cast(std::move(event)));
            }
            return out;
          },
          "A list of the events held, oldest first")
      .def(
          "clear",
          [](MemoryFace& self) { self.typed->clear(); },
          "Forgets every event held")
      .def("__len__", [](const MemoryFace& self) { return self.typed->size(); })
      .def_property_readonly("capacity", [](const MemoryFace& self) {
        return self.typed->capacity();
      });
  markFace(memory, "MemoryHandler");

  using PrometheusFace = PyTypedSink<PrometheusExporter>;
  py::class_<PrometheusFace, PySink> prometheus(m, "_PrometheusExporter");
  prometheus
      .def(
          py::init([](int64_t port,
                      std::string host,
                      std::map<std::string, std::string> labels) {
            return makeFace<PrometheusExporter>(
                &script::newPrometheusExporter, port, std::move(host), labels);
          }),
          py::arg("port"),
          py::arg("host"),
          py::arg("labels"))
      .def_property_readonly(
          "port",
          [](const PrometheusFace& self) { return self.typed->port(); },
          "The port bound (the one picked when 0 was asked for)")
      .def_property_readonly(
          "host", [](const PrometheusFace& self) { return self.typed->host(); })
      .def_property_readonly(
          "labels",
          [](const PrometheusFace& self) { return self.typed->labels(); })
      .def_property_readonly(
          "serving",
          [](const PrometheusFace& self) { return self.typed->serving(); },
          "Whether the server runs in this process (False after close() and "
          "in a forked child)")
      .def(
          "render",
          [](const PrometheusFace& self) { return self.typed->render(); },
          "What a scrape of /metrics returns now");
  markFace(prometheus, "PrometheusExporter");

  using TextFileFace = PyTypedSink<PrometheusTextFile>;
  py::class_<TextFileFace, PySink> textFile(m, "_PrometheusTextFile");
  textFile
      .def(
          py::init([](std::string path,
                      std::map<std::string, std::string> labels) {
            return makeFace<PrometheusTextFile>(
                &script::newPrometheusTextFile, std::move(path), labels);
          }),
          py::arg("path"),
          py::arg("labels"))
      .def_property_readonly(
          "path", [](const TextFileFace& self) { return self.typed->path(); })
      .def_property_readonly("labels", [](const TextFileFace& self) {
        return self.typed->labels();
      });
  markFace(textFile, "PrometheusTextFile");

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
