#include "face.h"
#include "py_common.h"
#include "internals.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include <torch_monitor/event_handler.h>
#include <torch_monitor/script/watch.h>
#include <torch_monitor/sinks/sink.h>
#include <torch_monitor/watch/non_finite.h>

namespace torch_monitor::python {
namespace {

// The event being logged from Python on this thread, so Python handlers get
// the caller's own object rather than a copy.
thread_local const Event* tlLoggedEvent = nullptr;
thread_local PyObject* tlLoggedPyEvent = nullptr;

// Marks, for the duration of a log_event call, which Python object is being
// logged (restored on exit, so nested log_event calls work).
class LoggedFromPython {
 public:
  LoggedFromPython(const Event& event, PyObject* pyEvent)
      : outerEvent_(std::exchange(tlLoggedEvent, &event)),
        outerPyEvent_(std::exchange(tlLoggedPyEvent, pyEvent)) {}
  ~LoggedFromPython() {
    tlLoggedEvent = outerEvent_;
    tlLoggedPyEvent = outerPyEvent_;
  }

 private:
  const Event* outerEvent_;
  PyObject* outerPyEvent_;
};

// Set by the exit sequence once Python handlers are unregistered: a
// logEvent that found one of them before (on any thread) no longer calls it,
// so no library thread enters Python while the interpreter is finalised
// (taking the GIL then ends the thread by unwinding it, which terminates
// the process through the noexcept frames of our threads).
std::atomic<bool> pythonHandlersClosed{false};

// A Python callable registered as an event handler.
// Thread safety: handle() may run on any thread; it takes the GIL itself.
class PythonEventHandler : public EventHandler {
 public:
  explicit PythonEventHandler(py::object callable)
      : callable_(std::move(callable)) {}

  void handle(const Event& event) override {
    // Stats destroyed during interpreter shutdown still log; Python can no
    // longer run handlers then.
    if (pythonHandlersClosed.load(std::memory_order_acquire) ||
        !pythonIsUsable()) {
      return;
    }
    py::gil_scoped_acquire gil;
    callable_.get()(eventToPython(event));
  }

 private:
  PyRef callable_;
};

// Live Python handlers, so they can all be unregistered at interpreter exit
// (before the interpreter can no longer run them).
struct PythonHandlers {
  std::mutex mutex;
  std::vector<std::weak_ptr<EventHandler>> handlers;
};
PythonHandlers& pythonHandlers() {
  static auto* instance = new PythonHandlers();
  return *instance;
}

// What register_event_handler returns; only unregister_event_handler uses it.
struct EventHandlerHandle {
  std::shared_ptr<EventHandler> handler;
};

// torch_monitor.Event, set by initHandlers (after initEvent).
PyTypeObject* eventType = nullptr;

// log_event's other forms (log_event(name, data), keyword arguments), set by
// torch_monitor._events: one Python function that checks and explains, and
// that torch.compile and torch.export trace in place of this one.
PyObject* logEventOtherForms = nullptr;

// log_event(event) as a raw CPython function: through pybind11, the call and
// its type lookups cost about as much as torch.monitor's whole log_event;
// with no handler registered this returns after a type check and one load.
PyObject* fastLogEvent(
    PyObject* /*module*/,
    PyObject* const* args,
    Py_ssize_t nargs,
    PyObject* kwnames) {
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  bool knownKeywords = true;
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject* keyword = PyTuple_GET_ITEM(kwnames, i);
    knownKeywords = knownKeywords &&
        (PyUnicode_CompareWithASCIIString(keyword, "event") == 0 ||
         PyUnicode_CompareWithASCIIString(keyword, "data") == 0);
  }
  if (nargs + nkw < 1 || nargs + nkw > 2 || !knownKeywords) {
    PyErr_SetString(
        PyExc_TypeError,
        "log_event() takes exactly one argument (an Event) or two (a name "
        "and a dict of values: log_event(name, {'loss': loss}))");
    return nullptr;
  }
  PyObject* pyEvent = args[0];
  if (nargs != 1 || nkw != 0 || !PyObject_TypeCheck(pyEvent, eventType)) {
    if (logEventOtherForms != nullptr) {
      return PyObject_Vectorcall(logEventOtherForms, args, nargs, kwnames);
    }
    PyErr_Format(
        PyExc_TypeError,
        "log_event expects a torch_monitor.Event, got %s",
        Py_TYPE(pyEvent)->tp_name);
    return nullptr;
  }
  void* value = cppObjectOf(pyEvent);
  if (value == nullptr) {
    PyErr_SetString(
        PyExc_TypeError, "log_event: Event.__init__ was not called");
    return nullptr;
  }
  if (!hasEventHandlers()) {
    Py_RETURN_NONE;
  }
  return noneOrPythonError([&]() {
    const Event& event = *static_cast<const Event*>(value);
    const LoggedFromPython scope(event, pyEvent);
    // A Python Event's strings were checked as they were set.
    detail::dispatchEvent(event);
  });
}

} // namespace

void unregisterPythonHandlers() {
  std::vector<std::weak_ptr<EventHandler>> handlers;
  {
    auto& registry = pythonHandlers();
    std::lock_guard<std::mutex> guard(registry.mutex);
    handlers.swap(registry.handlers);
  }
  // Each PythonEventHandler is registered exactly once.
  for (const auto& weak : handlers) {
    if (auto handler = weak.lock()) {
      unregisterEventHandler(handler);
    }
  }
}

void closePythonHandlers() {
  unregisterPythonHandlers();
  pythonHandlersClosed.store(true, std::memory_order_release);
}

py::object eventToPython(const Event& event) {
  if (&event == tlLoggedEvent) {
    return py::reinterpret_borrow<py::object>(tlLoggedPyEvent);
  }
  return py::cast(event);
}

void initHandlers(py::module_& m) {
  py::class_<EventHandlerHandle> handle(
      m,
      "EventHandlerHandle",
      "Returned by register_event_handler; pass it to unregister_event_handler");
  handle.def("__reduce_ex__", [](const EventHandlerHandle&, py::handle) {
    throw py::type_error(
        "an EventHandlerHandle cannot be pickled or copied: it stands for a "
        "registration in this process");
  });
  // Only register_event_handler makes handles; __new__ raises instead of
  // handing out an empty one.
  initialiseOnNew(handle);

  m.def(
      "register_event_handler",
      [](Typed<EventHandlerHint> callable) {
        // A native sink (torch_monitor.TensorBoardWriter, ...) is registered
        // as the C++ handler it is: no GIL, no Python in the event path.
        if (auto native = nativeEventHandler(callable)) {
          // As sink.register() refuses it: a closed sink would drop every
          // event without counting it.
          const auto* sink = dynamic_cast<const sinks::Sink*>(native.get());
          if (sink != nullptr && sink->closed()) {
            throw py::value_error(
                "register_event_handler: " + sink->description() +
                " is closed; make a new sink to register");
          }
          registerEventHandler(native);
          return EventHandlerHandle{std::move(native)};
        }
        if (!PyCallable_Check(callable.ptr())) {
          throw py::type_error(
              "register_event_handler expects a callable taking one Event, "
              "got " +
              std::string(Py_TYPE(callable.ptr())->tp_name));
        }
        auto handler = std::make_shared<PythonEventHandler>(std::move(callable));
        {
          auto& registry = pythonHandlers();
          std::lock_guard<std::mutex> guard(registry.mutex);
          auto& list = registry.handlers;
          list.erase(
              std::remove_if(
                  list.begin(),
                  list.end(),
                  [](const auto& weak) { return weak.expired(); }),
              list.end());
          registry.handlers.emplace_back(handler);
        }
        registerEventHandler(handler);
        return EventHandlerHandle{std::move(handler)};
      },
      // The argument names are torch.monitor's, for callers using keywords.
      py::arg("callback"),
      "Calls callback(event) for every logged event; returns a handle");

  m.def(
      "unregister_event_handler",
      [](py::handle handle) {
        // A native sink may also be passed itself instead of its handle.
        if (auto native = nativeEventHandler(handle)) {
          unregisterEventHandler(native);
          return;
        }
        if (!py::isinstance<EventHandlerHandle>(handle)) {
          throw py::type_error(
              "unregister_event_handler expects what register_event_handler "
              "returned, got " +
              std::string(Py_TYPE(handle.ptr())->tp_name));
        }
        unregisterEventHandler(handle.cast<const EventHandlerHandle&>().handler);
      },
      py::arg("handler"),
      "Removes a handler (given its handle, or a native sink itself); an "
      "already removed one is a no-op");

  eventType = reinterpret_cast<PyTypeObject*>(m.attr("Event").ptr());
  static PyMethodDef logEventDef = {
      "log_event",
      reinterpret_cast<PyCFunction>(
          reinterpret_cast<void (*)()>(&fastLogEvent)),
      METH_FASTCALL | METH_KEYWORDS,
      "log_event(event, data=None)\n--\n\n"
      "log_event(event) calls every registered handler with the event, in "
      "registration order; log_event(name, data) logs an event named `name` "
      "holding `data` (numbers, one-element tensors, strings), also from "
      "code that torch.compile or torch.export traces"};
  PyObject* logEventFunction =
      PyCFunction_NewEx(&logEventDef, nullptr, m.attr("__name__").ptr());
  if (logEventFunction == nullptr ||
      PyModule_AddObject(m.ptr(), "log_event", logEventFunction) != 0) {
    Py_XDECREF(logEventFunction);
    throw py::error_already_set();
  }

  m.def(
      "_set_log_event_other_forms",
      [](py::object function) {
        Py_XDECREF(logEventOtherForms);
        logEventOtherForms = function.release().ptr(); // lives as the module
      },
      py::arg("function"),
      "Sets the function that handles log_event's forms other than "
      "log_event(event) (used by torch_monitor._events)");

  // watch(on_nonfinite="raise") raises FloatingPointError in Python (the
  // C++ default, c10::Error, would arrive as RuntimeError).
  watch::setNonFiniteRaiser([](const std::string& message) {
    if (pythonIsUsable()) {
      py::gil_scoped_acquire gil;
      PyErr_SetString(PyExc_FloatingPointError, message.c_str());
      throw py::error_already_set();
    }
  });
  m.def(
      "_set_watch_nonfinite_handler",
      [](py::handle recorder, py::object handler) {
        scriptObjectOf<script::ScriptWatch>(recorder, "recorder")
            ->recorder()
            ->setNonFiniteHandler(
                handler.is_none()
                    ? nullptr
                    : std::make_shared<PythonEventHandler>(std::move(handler)));
      },
      py::arg("recorder"),
      py::arg("handler"),
      "Gives each NonFinite event of a watch's recorder to a Python callable "
      "too (watch(on_nonfinite=callable)); what it raises propagates");

  m.def(
      "_unregister_python_handlers",
      &unregisterPythonHandlers,
      "Unregisters every Python handler (for tests; the exit sequence "
      "closes them for good)");
}

} // namespace torch_monitor::python
