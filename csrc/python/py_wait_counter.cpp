// WaitCounter's hand-written hot path: `with counter.guard(): ...`, which
// PyTorch's own code runs around every call it times (its benchmark:
// benchmarks/python/bench_python.py, "WaitCounter"). guard(), __enter__
// and __exit__ as raw CPython methods cost a few hundred ns together; the
// generic face calls cost ~5.7 us (torch.monitor's guard: ~0.8 us). The
// rest of WaitCounter's Python face is derived from its TorchScript schema
// (torch_monitor/_faces.py).

#include "face.h"
#include "py_common.h"
#include "internals.h"

#include <torch_monitor/script/wait_counter.h>

namespace torch_monitor::python {
namespace {

using script::ScriptWaitCounter;
using script::ScriptWaitCounterTracker;

// The WaitCounterTracker face class, which guard() makes an object of: set
// when that class is made, before any WaitCounter exists (kept for the
// process, as the class is).
PyObject* trackerClass = nullptr;

bool noArguments(const char* method, Py_ssize_t nargs, PyObject* kwnames) {
  return fastCallArguments(method, {}, nullptr, nargs, kwnames, nullptr);
}

PyObject* fastGuard(
    PyObject* self,
    PyObject* const* /*args*/,
    Py_ssize_t nargs,
    PyObject* kwnames) {
  if (!noArguments("WaitCounter.guard", nargs, kwnames)) {
    return nullptr;
  }
  Face* face = faceOf(self);
  if (face == nullptr) {
    return nullptr;
  }
  return resultOrPythonError([&] {
    auto counter = c10::intrusive_ptr<ScriptWaitCounter>::reclaim_copy(
        face->holder<ScriptWaitCounter>());
    c10::IValue tracker(
        c10::make_intrusive<ScriptWaitCounterTracker>(std::move(counter)));
    return newFace(trackerClass, torch::jit::Object(tracker.toObject()))
        .release()
        .ptr();
  });
}

PyObject* fastEnter(
    PyObject* self,
    PyObject* const* /*args*/,
    Py_ssize_t nargs,
    PyObject* kwnames) {
  if (!noArguments("WaitCounterTracker.__enter__", nargs, kwnames)) {
    return nullptr;
  }
  Face* face = faceOf(self);
  if (face == nullptr) {
    return nullptr;
  }
  return resultOrPythonError([&] {
    face->holder<ScriptWaitCounterTracker>()->enter();
    Py_INCREF(self); // `with counter.guard() as t:` binds the tracker
    return self;
  });
}

// __exit__(*exc_info): the exception, if any, is not the tracker's to
// handle (it returns None, so it propagates), and the unit is recorded
// either way, as torch.monitor's guard records it.
PyObject* fastExit(
    PyObject* self,
    PyObject* const* /*args*/,
    Py_ssize_t /*nargs*/,
    PyObject* kwnames) {
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0) {
    PyErr_SetString(
        PyExc_TypeError,
        "WaitCounterTracker.__exit__(*exc_info) takes its arguments by "
        "position only");
    return nullptr;
  }
  Face* face = faceOf(self);
  if (face == nullptr) {
    return nullptr;
  }
  return noneOrPythonError(
      [&] { face->holder<ScriptWaitCounterTracker>()->exit(); });
}

} // namespace

void initWaitCounters(py::module_& m) {
  m.def(
      "_install_wait_counter_tracker",
      [](py::handle cls) {
        trackerClass = py::reinterpret_borrow<py::object>(cls).release().ptr();
        addFastMethod(
            cls, "__enter__", &fastEnter,
            "__enter__($self)\n--\n\nStarts timing the unit of work; returns "
            "the tracker");
        addFastMethod(
            cls, "__exit__", &fastExit,
            "__exit__($self, /, *exc_info)\n--\n\nRecords the unit of work "
            "(also when it raised; the exception propagates)");
      },
      py::arg("cls"),
      "Gives the WaitCounterTracker face its fast __enter__ and __exit__, "
      "and makes it the class guard() returns");
  m.def(
      "_install_wait_counter_guard",
      [](py::handle cls) {
        TORCH_INTERNAL_ASSERT(
            trackerClass != nullptr,
            "the WaitCounterTracker face is made before WaitCounter's");
        // The doc of the method it replaces: the schema's.
        static const std::string doc = "guard($self)\n--\n\n" +
            py::str(cls.attr("guard").attr("__doc__")).cast<std::string>();
        addFastMethod(cls, "guard", &fastGuard, doc.c_str());
      },
      py::arg("cls"),
      "Gives the WaitCounter face its fast guard()");
}

} // namespace torch_monitor::python
