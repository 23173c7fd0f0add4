// The Python faces of WaitCounter and of what its guard() returns.

#include "py_common.h"
#include "pybind_internals.h"

#include <pybind11/stl.h>
#include <torch/csrc/jit/api/object.h>

#include <torch_monitor/script/wait_counter.h>

namespace torch_monitor::python {
namespace {

using script::ScriptWaitCounter;
using script::ScriptWaitCounterTracker;

// A face: a torch.ScriptObject (so torch.jit.script accepts it as an
// attribute of the TorchScript class, and scripted code reaches the same C++
// object) keeping a typed pointer to what it wraps.
// Thread safety: as the wrapped object.
template <typename Holder>
struct PyFace : torch::jit::Object {
  explicit PyFace(c10::intrusive_ptr<Holder> wrapped)
      : torch::jit::Object(c10::IValue(wrapped).toObject()),
        holder(std::move(wrapped)) {}
  c10::intrusive_ptr<Holder> holder;
};
using PyWaitCounter = PyFace<ScriptWaitCounter>;
using PyWaitCounterTracker = PyFace<ScriptWaitCounterTracker>;

std::unique_ptr<PyWaitCounter> counterFromState(const py::tuple& state) {
  TORCH_CHECK_VALUE(
      state.size() == 4,
      "a pickled WaitCounter state has 4 fields, got ",
      state.size());
  return std::make_unique<PyWaitCounter>(
      ScriptWaitCounter::fromState(c10::ivalue::Tuple::create(
          state[0].cast<int64_t>(),
          state[1].cast<std::string>(),
          state[2].cast<int64_t>(),
          state[3].cast<bool>())));
}

py::tuple stateOf(const PyWaitCounter& self) {
  const auto [version, key, windowMs, closeOnTime] = self.holder->state();
  return py::make_tuple(version, key, windowMs, closeOnTime);
}

// Everything the faces offer is a real attribute of their class (markFace
// adds the TorchScript methods they do not define), so plain lookup is
// enough; torch.ScriptObject's __getattr__ hook would slow every lookup.
void usePlainAttributeLookup(py::handle cls) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_getattro = PyObject_GenericGetAttr;
  PyType_Modified(type);
}

} // namespace

void initWaitCounters(py::module_& m) {
  py::class_<PyWaitCounterTracker, torch::jit::Object> tracker(
      m,
      "WaitCounterTracker",
      "What WaitCounter.guard() returns: a context manager timing one unit "
      "of work at a time, from __enter__ to __exit__ (torch.monitor's "
      "_WaitCounterTracker). Not constructible directly.");
  tracker
      .def(
          "__enter__",
          [](py::object self) {
            self.cast<PyWaitCounterTracker&>().holder->enter();
            return self;
          },
          "Starts timing; RuntimeError if this guard is already timing one")
      .def(
          "__exit__",
          [](PyWaitCounterTracker& self, const py::args& /*exc_info*/) {
            self.holder->exit();
          },
          "Records the unit of work started by __enter__ (nothing if none "
          "was); exceptions of the timed code propagate")
      // torch.ScriptObject's own pickling would rebuild a bare ScriptObject;
      // a unit of work in progress has no meaning elsewhere.
      .def("__reduce_ex__", [](const PyWaitCounterTracker&, py::handle) {
        throw py::type_error(
            "a WaitCounterTracker (a unit of work being timed) cannot be "
            "pickled or copied; pickle its WaitCounter and call guard() on "
            "the copy");
      });
  usePlainAttributeLookup(tracker);
  initialiseOnNew(tracker);
  markFace(tracker, "WaitCounterTracker");

  py::class_<PyWaitCounter, torch::jit::Object> counter(
      m,
      "WaitCounter",
      "WaitCounter(key, window_size=60.0, *, close_on_time=False): a named "
      "duration counter (torch.monitor's _WaitCounter). Each unit of work "
      "timed by `with counter.guard():` is one sample, its duration in "
      "microseconds, of a Stat named after the key, which logs count, sum "
      "(total), max and mean per window.");
  counter
      .def(
          py::init([](py::handle key,
                      py::handle windowSize,
                      py::handle closeOnTime) {
            return std::make_unique<PyWaitCounter>(
                c10::make_intrusive<ScriptWaitCounter>(
                    textFromPython(key, "WaitCounter key"),
                    windowFromPython(windowSize),
                    windowCloseFromPython(closeOnTime)));
          }),
          py::arg("key"),
          py::arg("window_size") =
              py::float_(double(WaitCounter::kDefaultWindow.count()) / 1000),
          py::kw_only(),
          py::arg("close_on_time") = py::bool_(false))
      .def(
          "guard",
          [](const PyWaitCounter& self) {
            return std::make_unique<PyWaitCounterTracker>(
                c10::make_intrusive<ScriptWaitCounterTracker>(self.holder));
          },
          "A context manager timing one unit of work: "
          "`with counter.guard(): ...`")
      .def(
          "get",
          [](const PyWaitCounter& self) {
            return self.holder->counter().stat().get();
          },
          "count, sum, max and mean (microseconds) of the last closed window")
      .def_property_readonly(
          "key",
          [](const PyWaitCounter& self) {
            return self.holder->counter().key();
          })
      .def_property_readonly(
          "window_size",
          [](const PyWaitCounter& self) {
            return timedeltaFromMs(
                self.holder->counter().stat().windowSize().count());
          })
      .def_property_readonly(
          "close_on_time",
          [](const PyWaitCounter& self) {
            return self.holder->counter().stat().windowClose() ==
                WindowClose::ON_TIME;
          })
      // A copy (or an unpickled one) is a new counter with the same
      // configuration, as for Stat; a factory serves every pickle protocol.
      .def(
          "__reduce_ex__",
          [](const PyWaitCounter& self, py::handle /*protocol*/) {
            return py::make_tuple(
                py::module_::import("torch_monitor._C")
                    .attr("_restore_wait_counter"),
                py::make_tuple(stateOf(self)));
          })
      .def(
          "__copy__",
          [](const PyWaitCounter& self) {
            return counterFromState(stateOf(self));
          })
      .def(
          "__deepcopy__",
          [](const PyWaitCounter& self, py::handle /*memo*/) {
            return counterFromState(stateOf(self));
          })
      .def("__repr__", [](const PyWaitCounter& self) {
        return "WaitCounter(key=" +
            py::repr(py::str(self.holder->counter().key()))
                .cast<std::string>() +
            ", window_size_ms=" +
            std::to_string(
                   self.holder->counter().stat().windowSize().count()) +
            ")";
      });
  usePlainAttributeLookup(counter);
  initialiseOnNew(counter);
  markFace(counter, "WaitCounter");
  m.def(
      "_restore_wait_counter",
      &counterFromState,
      py::arg("state"),
      "Rebuilds a pickled WaitCounter (used by pickle)");
}

} // namespace torch_monitor::python
