#pragma once

// Shared pieces of the Python binding torch_monitor._C.

#include <chrono>
#include <exception>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include <pybind11/pybind11.h>

#include <torch_monitor/event.h>
#include <torch_monitor/event_handler.h>
#include <torch_monitor/stat.h>

namespace torch_monitor {
struct RankGroup;
} // namespace torch_monitor

namespace torch_monitor::python {

namespace py = pybind11;

// Sets the Python error matching a C++ exception: c10's typed errors become
// ValueError/TypeError/IndexError, other c10::Error RuntimeError without the
// C++ backtrace. Used by the exception translator and by the raw CPython
// methods that bypass pybind11.
void setPythonError(const std::exception& e);

// Runs `body` inside a raw CPython method (one that bypasses pybind11 and so
// its exception translators) and returns what it returns (a new reference),
// or nullptr with the Python error matching what `body` threw (a pending
// Python error is restored as it was; anything that is no std::exception
// becomes a RuntimeError rather than escaping into CPython).
template <typename F>
PyObject* resultOrPythonError(F&& body) {
  try {
    return body();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    setPythonError(e);
  } catch (...) { // e.g. a C++ event handler throwing an int
    PyErr_SetString(
        PyExc_RuntimeError,
        "torch_monitor: C++ code threw an exception that is not a "
        "std::exception");
  }
  return nullptr;
}

// resultOrPythonError for a `body` that returns nothing: None.
template <typename F>
PyObject* noneOrPythonError(F&& body) {
  return resultOrPythonError([&]() -> PyObject* {
    body();
    Py_RETURN_NONE;
  });
}

// The arguments of a raw METH_FASTCALL | METH_KEYWORDS method, given by
// position or by their schema names (as TorchScript and compiled code may
// call them): out[i] is the argument named names[i]. False with a TypeError
// naming `method` and its arguments for any other call (one missing or given
// twice, an unknown keyword, too many). The one parser of the hand-written
// hot paths, so that they take the keywords their schemas name.
// Inline for the usual call, all arguments by position (Stat.add's ~20 ns
// would feel a function call); keywords and errors take the slow path.
bool fastCallArgumentsByKeyword(
    const char* method,
    std::initializer_list<const char*> names,
    PyObject* const* args,
    Py_ssize_t nargs,
    PyObject* kwnames,
    PyObject** out);
inline bool fastCallArguments(
    const char* method,
    std::initializer_list<const char*> names,
    PyObject* const* args,
    Py_ssize_t nargs,
    PyObject* kwnames,
    PyObject** out) {
  if (__builtin_expect(
          kwnames == nullptr &&
              nargs == static_cast<Py_ssize_t>(names.size()),
          1)) {
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      out[i] = args[i];
    }
    return true;
  }
  return fastCallArgumentsByKeyword(method, names, args, nargs, kwnames, out);
}

// pythonIsUsable() (whether Python may still run) is in internals.h:
// before Python 3.13 it needs CPython's private _Py_IsFinalizing.

// Owns a Python object from C++ state that may be dropped on any thread
// without the GIL (a monitor or a criterion destroyed by a TorchScript
// module, or at interpreter exit): the reference is dropped with the GIL
// held, or leaked once the interpreter is gone.
// Thread safety: get() needs the GIL; destruction may happen on any thread.
class PyRef {
 public:
  explicit PyRef(py::object object) : object_(std::move(object)) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef();
  const py::object& get() const noexcept {
    return object_;
  }

 private:
  py::object object_;
};

// datetime <-> Event timestamps. Returned datetimes are naive local time (as
// torch.monitor); aware inputs are converted through their tzinfo.
py::object timestampToPython(int64_t epochMicros);
int64_t timestampFromPython(py::handle datetime);

// Event.data <-> dict. Unsupported values raise TypeError (or OverflowError
// for ints outside int64) naming the key.
py::dict dataToPython(const std::unordered_map<std::string, data_value_t>& data);
std::unordered_map<std::string, data_value_t> dataFromPython(py::handle dict);

// The Python object for an event handed to Python handlers: the caller's own
// object when the event was logged from Python, a new Event otherwise.
py::object eventToPython(const Event& event);

// A str (or bytes holding UTF-8) that crosses into C++: ValueError naming
// `what` (e.g. "Stat name") for a lone surrogate, invalid UTF-8 or a NUL,
// TypeError for anything else.
std::string textFromPython(py::handle obj, const std::string& what);

// What a Python callback (a map_, op_, criterion or fold) returned as the
// tensor it must be: TypeError naming `what` for anything else.
at::Tensor tensorFromPython(py::handle obj, const std::string& what);

// A rank group from a torch.distributed Store object, this process' rank in
// it, its size and the merge deadline in seconds (py_rank_sync.cpp).
std::shared_ptr<const RankGroup> groupFromPython(
    py::handle store,
    int64_t rank,
    int64_t worldSize,
    double deadlineSeconds);

void initAggregation(py::module_& m);
void initEvent(py::module_& m);
void initHandlers(py::module_& m);
void initStats(py::module_& m);
void initWaitCounters(py::module_& m);
void initReducers(py::module_& m);
void initCustomReducers(py::module_& m);
void initMonitors(py::module_& m);
void initMonitorListing(py::module_& m);
void initTesting(py::module_& m);
void initSinks(py::module_& m);
void initFaces(py::module_& m);
void initProcessRank(py::module_& m);
void initBackgroundWarnings();
void initRankSync(py::module_& m);
void initExit(py::module_& m);

// The exit sequence's parts kept by other files of the binding (py_exit.cpp
// runs them in order).
// Unregisters every Python handler (py_handlers.cpp).
void unregisterPythonHandlers();
// Unregisters them for good: a handler some thread found registered before
// is not called either. Needs no GIL.
void closePythonHandlers();
// From now on background warnings are queued, not issued at the main
// thread's next bytecode (py_background_warnings.cpp).
void holdBackgroundWarnings();
// With the GIL: issues the queued warnings as RuntimeWarnings, sends later
// ones to stderr; throws py::error_already_set (after issuing the others)
// when a filter turned one into an error.
void issueHeldBackgroundWarnings();

// The C++ handler inside `obj` when it is a native sink (a torch_monitor
// sink class, or a torch.classes.torch_monitor sink ScriptObject), so that
// register_event_handler registers it directly; nullptr otherwise.
std::shared_ptr<EventHandler> nativeEventHandler(py::handle obj);

} // namespace torch_monitor::python
