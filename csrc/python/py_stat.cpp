#include "py_common.h"
#include "pybind_internals.h"

#include <datetime.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/api/object.h>

#include <torch_monitor/detail/window_timer.h>
#include <torch_monitor/script/stat.h>

namespace torch_monitor::python {
namespace {

using script::ScriptStat;

// The Python face of a stat: a torch.ScriptObject (so torch.jit.script
// accepts it as an attribute of type torch.classes.torch_monitor.Stat, and
// scripted code reaches the same C++ object) that also keeps a direct
// pointer to the Stat for the fast Python add().
// Thread safety: as Stat<T>.
template <typename T>
struct PyStat : torch::jit::Object {
  explicit PyStat(c10::intrusive_ptr<ScriptStat<T>> scriptStat)
      : torch::jit::Object(c10::IValue(scriptStat).toObject()),
        holder(std::move(scriptStat)),
        stat(&holder->stat()) {}
  c10::intrusive_ptr<ScriptStat<T>> holder;
  Stat<T>* stat; // &holder->stat(), cached for the fast path
};

template <typename T>
constexpr const char* kClassName =
    std::is_same_v<T, double> ? "Stat" : "IntStat";

Aggregation aggregationFromPython(py::handle item) {
  if (py::isinstance<Aggregation>(item)) {
    return item.cast<Aggregation>();
  }
  if (PyUnicode_Check(item.ptr())) {
    return aggregationFromName(textFromPython(item, "aggregation name"));
  }
  if (PyLong_Check(item.ptr()) && !PyBool_Check(item.ptr())) {
    return aggregationFromInt(item.cast<int64_t>());
  }
  throw py::type_error(
      "aggregations must be torch_monitor.Aggregation members, names such as "
      "'mean', or ints 1..6; got " +
      std::string(Py_TYPE(item.ptr())->tp_name));
}

std::vector<Aggregation> aggregationsFromPython(py::handle aggregations) {
  if (PyUnicode_Check(aggregations.ptr()) ||
      !py::isinstance<py::iterable>(aggregations)) {
    throw py::type_error(
        "aggregations must be a sequence such as [Aggregation.MEAN, "
        "Aggregation.MAX], got " +
        std::string(Py_TYPE(aggregations.ptr())->tp_name));
  }
  std::vector<Aggregation> out;
  for (py::handle item : aggregations) {
    out.push_back(aggregationFromPython(item));
  }
  return out;
}

} // namespace

// Shared with WaitCounter (py_common.h).
std::chrono::milliseconds windowFromPython(py::handle window) {
  if (PyDateTimeAPI == nullptr) {
    PyDateTime_IMPORT;
  }
  if (PyDelta_Check(window.ptr())) {
    const int64_t days = PyDateTime_DELTA_GET_DAYS(window.ptr());
    const int64_t seconds = PyDateTime_DELTA_GET_SECONDS(window.ptr());
    const int64_t micros = PyDateTime_DELTA_GET_MICROSECONDS(window.ptr());
    TORCH_CHECK_VALUE(
        days >= 0,
        "window_size must not be negative, got ",
        py::repr(window).cast<std::string>());
    return std::chrono::milliseconds(
        days * 86400000 + seconds * 1000 + micros / 1000);
  }
  if (PyFloat_Check(window.ptr()) ||
      (PyLong_Check(window.ptr()) && !PyBool_Check(window.ptr()))) {
    const double seconds = PyFloat_AsDouble(window.ptr());
    if (seconds == -1.0 && PyErr_Occurred()) {
      // an int beyond the float range: far above the longest window
      PyErr_Clear();
      TORCH_CHECK_VALUE(
          false,
          "window_size must be at most ",
          Stat<double>::kMaxWindowMs / 1000,
          " s (datetime.timedelta.max), got ",
          py::repr(window).cast<std::string>());
    }
    return windowFromSeconds(seconds);
  }
  throw py::type_error(
      "window_size must be a datetime.timedelta or a number of seconds, got " +
      std::string(Py_TYPE(window.ptr())->tp_name));
}


py::object timedeltaFromMs(int64_t ms) {
  if (PyDateTimeAPI == nullptr) {
    PyDateTime_IMPORT;
  }
  return py::reinterpret_steal<py::object>(PyDelta_FromDSU(
      static_cast<int>(ms / 86400000),
      static_cast<int>((ms % 86400000) / 1000),
      static_cast<int>((ms % 1000) * 1000)));
}


// close_on_time: a bool, as torch.monitor takes flags (not a truthy object).
WindowClose windowCloseFromPython(py::handle closeOnTime) {
  if (!PyBool_Check(closeOnTime.ptr())) {
    throw py::type_error(
        "close_on_time must be a bool, got " +
        std::string(Py_TYPE(closeOnTime.ptr())->tp_name));
  }
  return closeOnTime.ptr() == Py_True ? WindowClose::ON_TIME
                                      : WindowClose::LAZY;
}

namespace {

// A count such as max_samples: an int (or an object with __index__, e.g. a
// NumPy integer), not a bool, in 1..2**63-1.
int64_t countFromPython(py::handle value, const char* what) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    throw py::type_error(
        std::string(what) + " must be an int, got " +
        Py_TYPE(value.ptr())->tp_name);
  }
  const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) {
    throw py::error_already_set();
  }
  int overflow = 0;
  const long long count = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (count == -1 && PyErr_Occurred()) {
    throw py::error_already_set();
  }
  TORCH_CHECK_VALUE(
      overflow == 0 && count >= 1,
      what,
      " must be between 1 and 2**63-1 (",
      Stat<double>::kUnlimitedSamples,
      ", the default: no limit), got ",
      py::repr(index).cast<std::string>());
  return count;
}

// A pickled state of any version (1: before close_on_time and steps; 2:
// before sync_ranks).
template <typename T>
typename ScriptStat<T>::State stateFromPython(const py::tuple& state) {
  if (state.size() == 5) {
    return ScriptStat<T>::upgrade(
        state.cast<typename ScriptStat<T>::StateV1>());
  }
  if (state.size() == 7) {
    return ScriptStat<T>::upgrade(
        state.cast<typename ScriptStat<T>::StateV2>());
  }
  return state.cast<typename ScriptStat<T>::State>();
}

template <typename T>
std::unique_ptr<PyStat<T>> pyStatFromState(
    const typename ScriptStat<T>::State& state) {
  return std::make_unique<PyStat<T>>(ScriptStat<T>::fromState(state));
}

template <typename T>
constexpr const char* kRestoreName =
    std::is_same_v<T, double> ? "_restore_stat" : "_restore_int_stat";

template <typename T>
typename ScriptStat<T>::State stateOf(const PyStat<T>& self) {
  return self.holder->state();
}

// add() as a raw CPython METH_O method: a pybind11 method costs ~90 ns a
// call, this ~15 ns, which is most of Stat.add's cost from Python.
template <typename T>
PyObject* fastAdd(PyObject* self, PyObject* arg) {
  void* value = cppObjectOf(self);
  if (value == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Stat.__init__ was not called");
    return nullptr;
  }
  constexpr bool kFloat = std::is_same_v<T, double>;
  const bool exact = kFloat ? PyFloat_CheckExact(arg) : PyLong_CheckExact(arg);
  if (!exact && THPVariable_Check(arg)) { // every element is one sample
    return noneOrPythonError([&]() {
      static_cast<PyStat<T>*>(value)->stat->add(THPVariable_Unpack(arg));
    });
  }
  T v;
  if constexpr (kFloat) {
    v = exact ? PyFloat_AS_DOUBLE(arg) : PyFloat_AsDouble(arg);
  } else {
    v = PyLong_AsLongLong(arg);
  }
  if (v == T(-1) && PyErr_Occurred()) {
    return nullptr;
  }
  return noneOrPythonError(
      [&]() { static_cast<PyStat<T>*>(value)->stat->add(v); });
}

template <typename T>
void defineStat(py::module_& m, const char* doc) {
  using Self = PyStat<T>;
  auto cls =
      py::class_<Self, torch::jit::Object>(m, kClassName<T>, doc)
          .def(
              py::init([](py::handle name,
                          py::handle aggregations,
                          py::handle windowSize,
                          py::handle maxSamples,
                          py::handle closeOnTime,
                          py::handle windowSteps,
                          py::handle syncRanks) {
                const auto group = rankGroupFromPython(syncRanks);
                auto self = std::make_unique<PyStat<T>>(ScriptStat<T>::make(
                    textFromPython(name, "Stat name"),
                    aggregationsFromPython(aggregations),
                    windowSize.is_none()
                        ? std::nullopt
                        : std::optional(windowFromPython(windowSize)),
                    windowSteps.is_none()
                        ? std::nullopt
                        : std::optional(
                              countFromPython(windowSteps, "window_steps")),
                    countFromPython(maxSamples, "max_samples"),
                    windowCloseFromPython(closeOnTime)));
                if (group) {
                  self->stat->syncRanks(*group);
                }
                return self;
              }),
              py::arg("name"),
              py::arg("aggregations"),
              py::arg("window_size") = py::none(),
              py::arg("max_samples") = py::int_(Stat<T>::kUnlimitedSamples),
              py::kw_only(),
              py::arg("close_on_time") = py::bool_(false),
              py::arg("window_steps") = py::none(),
              py::arg("sync_ranks") = py::bool_(false))
          .def(
              "get",
              [](const Self& self) { return self.stat->get(); },
              "The aggregates of the last closed window")
          .def_property_readonly(
              "count",
              [](const Self& self) { return self.stat->count(); },
              "Samples accepted in the open window")
          .def_property_readonly(
              "name", [](const Self& self) { return self.stat->name(); })
          .def_property_readonly(
              "window_size",
              [](const Self& self) -> py::object {
                if (self.stat->windowSteps() != 0) {
                  return py::none();
                }
                return timedeltaFromMs(self.stat->windowSize().count());
              },
              "The window as a timedelta (None for a window of steps)")
          .def_property_readonly(
              "window_steps",
              [](const Self& self) -> py::object {
                const int64_t steps = self.stat->windowSteps();
                return steps == 0 ? py::object(py::none())
                                  : py::object(py::int_(steps));
              },
              "The window in training steps (None for a time window)")
          .def_property_readonly(
              "max_samples",
              [](const Self& self) { return self.stat->maxSamples(); })
          .def_property_readonly(
              "close_on_time",
              [](const Self& self) {
                return self.stat->windowClose() == WindowClose::ON_TIME;
              },
              "Whether the window timer closes ended windows (their "
              "handlers then run on its thread)")
          .def_property_readonly(
              "sync_ranks",
              [](const Self& self) { return self.stat->syncsRanks(); },
              "Whether windows are merged across ranks (docs/distributed.md)")
          .def_property_readonly(
              "aggregations",
              [](const Self& self) { return self.stat->aggregations(); })
          // torch.ScriptObject's own pickling would rebuild a plain
          // ScriptObject and abort; a copy is a new stat with the same
          // configuration and an empty window. A factory (not copyreg's
          // __new__ + __setstate__, see initialiseOnNew) serves every
          // pickle protocol.
          .def(
              "__reduce_ex__",
              [](const Self& self, py::handle /*protocol*/) {
                return py::make_tuple(
                    py::module_::import("torch_monitor._C")
                        .attr(kRestoreName<T>),
                    py::make_tuple(stateOf(self)));
              })
          .def("__getstate__", [](const Self& self) { return stateOf(self); })
          // Shadows torch.ScriptObject's (which expects another state).
          // pybind11 runs __setstate__ only on an object not yet constructed,
          // which initialiseOnNew never hands out: on a live stat it does
          // nothing.
          .def("__setstate__", [](const Self&, py::handle) {})
          .def("__copy__", [](const Self& self) {
            return pyStatFromState<T>(stateOf(self));
          })
          .def("__deepcopy__", [](const Self& self, py::handle /*memo*/) {
            return pyStatFromState<T>(stateOf(self));
          })
          .def("__repr__", [](const Self& self) {
            return std::string(kClassName<T>) + "(name=" +
                py::repr(py::str(self.stat->name())).template cast<std::string>() +
                (self.stat->windowSteps() != 0
                     ? ", window_steps=" +
                         std::to_string(self.stat->windowSteps())
                     : ", window_size_ms=" +
                         std::to_string(self.stat->windowSize().count())) +
                ")";
          });

  static PyMethodDef addDef = {
      "add",
      reinterpret_cast<PyCFunction>(&fastAdd<T>),
      METH_O,
      "add(v): adds one sample to the current window"};
  PyObject* descriptor =
      PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &addDef);
  if (descriptor == nullptr ||
      PyObject_SetAttrString(cls.ptr(), "add", descriptor) != 0) {
    Py_XDECREF(descriptor);
    throw py::error_already_set();
  }
  Py_DECREF(descriptor);

  // torch.ScriptObject defines __getattr__ (to reach TorchScript methods by
  // name), which routes every attribute lookup through a slow generic hook
  // and disables CPython's LOAD_METHOD fast path: `stat.add(v)` cost ~45 ns
  // instead of ~25. Everything a Stat offers is a real attribute of this
  // class, so plain lookup is enough.
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_getattro = PyObject_GenericGetAttr;
  PyType_Modified(type);

  initialiseOnNew(cls);
  markFace(cls, kClassName<T>);
  m.def(
      kRestoreName<T>,
      [](const py::tuple& state) {
        return pyStatFromState<T>(stateFromPython<T>(state));
      },
      py::arg("state"),
      "Rebuilds a pickled stat (used by pickle)");
}

} // namespace

void initStats(py::module_& m) {
  defineStat<double>(
      m,
      "Stat(name, aggregations, window_size, max_samples=2**63-1, *, "
      "close_on_time=False): windowed aggregations of float samples, "
      "compatible with torch.monitor.Stat");
  defineStat<int64_t>(
      m,
      "IntStat(name, aggregations, window_size, max_samples=2**63-1, *, "
      "close_on_time=False): like Stat, for int samples; every aggregate is "
      "an int");
  m.def(
      "_close_all_stats",
      &closeAllStats,
      // Python handlers take the GIL themselves; closing a window may wait
      // for threads that add without it.
      py::call_guard<py::gil_scoped_release>(),
      "Logs the open window of every live Stat (called at interpreter exit, "
      "before Python handlers are removed)");
  m.def(
      "_stop_window_timer",
      &stopWindowTimer,
      // The timer's thread may be waiting for the GIL to run a handler.
      py::call_guard<py::gil_scoped_release>(),
      "Stops the thread that closes close_on_time windows, after the "
      "handlers it runs return (called at interpreter exit)");
}

} // namespace torch_monitor::python
