#pragma once

// The binding's uses of CPython's and pybind11's internals, gathered here
// (and only here: test/python/test_internals.py fails when one appears in
// another file): reading an instance's C++ object without a cast (the raw
// CPython methods of the hot paths), telling whether one was ever
// initialised, type slots, raw method descriptors, and the type names of
// signatures (Typed).
// test/python/test_reliability_monitors.py fails loudly if a pybind11
// upgrade changes what these rely on (objects made with __new__ alone must
// raise TypeError, pickling must round-trip); every face is made through
// constructInstance, so every test that makes one guards it.

#include <pybind11/pybind11.h>

namespace torch_monitor::python {

namespace py = pybind11;

// The C++ object of a pybind11 instance of a single registered class;
// nullptr when it was never initialised (made with __new__ alone).
inline void* cppObjectOf(PyObject* obj) {
  auto* inst = reinterpret_cast<pybind11::detail::instance*>(obj);
  return inst->simple_layout
      ? inst->simple_value_holder[0]
      : pybind11::detail::values_and_holders(inst).begin()->value_ptr();
}

// Sets the TypeError for an instance never initialised (made with __new__
// alone) and returns nullptr.
PyObject* refuseUninitialised(PyObject* obj);

// Makes every attribute lookup on an uninitialised instance of `cls` raise
// TypeError instead of reaching methods that would dereference its missing
// C++ object (pybind11 does not check). Costs one pointer test per lookup.
// The class must use plain (generic) attribute lookup otherwise.
void refuseUninitialisedUse(pybind11::handle cls);

// Makes `cls.__new__(cls, ...)` also run `cls.__init__`: pybind11 would
// otherwise hand out an object whose C++ value was never constructed, and
// every method of it (and of torch.ScriptObject, and torch.jit.script)
// would read garbage. `cls.__new__(cls)` without arguments then raises
// __init__'s TypeError. Pickling must go through __reduce_ex__ (a factory),
// not copyreg's __new__ + __setstate__.
// (Replaces the class's tp_new with one built on pybind11::detail::
// pybind11_object_new; test_reliability_core.py's __new__ tests guard it.)
void initialiseOnNew(pybind11::handle cls);

// A new, not yet initialised instance of `type` (a class given to
// initialiseOnNew or derived from one), for code that initialises it at
// once (wrapping an existing object): its __new__ would run __init__.
py::object allocateUninitialised(py::handle type);

// Makes `value` the C++ object of `instance` (made by allocateUninitialised),
// which owns it from now on: what pybind11's constructors do after their
// C++ constructor ran, without a call through Python and the Python
// torch.ScriptObject it would take (WaitCounter.guard() makes a face per
// call). `value` must come from `new` of the instance's registered C++
// type.
void constructInstance(py::handle instance, void* value);

// A hot path's CPython method: `function` (METH_FASTCALL | METH_KEYWORDS)
// as method `name` of class `cls`; `doc` starts with its text signature
// ("add($self, value)\n--\n\n..."). Called on an object of another
// class, CPython refuses it before it runs. Its definition is kept for the
// process (the class points at it).
void addFastMethod(
    py::handle cls,
    const char* name,
    PyObject* (*function)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*),
    const char* doc);

// Gives `cls` plain attribute lookup and assignment: torch.ScriptObject's
// __getattr__ hook would slow every lookup, and only with plain lookup does
// CPython call a method without binding it first (`stat.add(v)`: 21 ns,
// against 56 ns with any other lookup function;
// benchmarks/python/bench_python.py); its __setattr__ would raise
// RuntimeError ("does not have an attribute") where Python code expects
// AttributeError (`stat.name = "x"`: a read-only property). For classes
// given to initialiseOnNew, whose instances are always initialised.
void usePlainAttributes(py::handle cls);

// The parameter, buffer or submodule `name` of nn.Module `module`, read
// straight from nn.Module's private dicts (_parameters, _buffers,
// _modules): plain getattr first fails the generic lookup (building an
// AttributeError) and then runs Module.__getattr__ in Python, about 0.3 us
// per level of a monitor's path. nn.Module keeps those names out of
// __dict__ and off the class, so the order is the same. *found says whether
// it was one of them (then a new reference); nullptr with *found false and
// no error set means: not there, use getattr.
PyObject* moduleMember(PyObject* module, PyObject* name, bool* found);

// Whether Python may still run: false during and after interpreter
// finalization, when C++ state freed late (a handler, a monitor or a reducer
// held by a static or a TorchScript module) must not call into Python.
// Before Python 3.13 this reads CPython's private _Py_IsFinalizing;
// test/python/test_reliability_core.py's exit tests fail (a crash at exit)
// if it stops telling.
bool pythonIsUsable();

// A Python object the binding checks itself (with its own checks and
// messages), typed for signatures as `Hint::name` says: what help() and the
// generated stub (_C.pyi) show where py::object would say Any. Loading
// accepts any object. The name reaches pybind11's signatures through its
// detail::handle_type_name (below); test_stubs.py fails if an upgrade
// stops that (the stub would say Any again).
template <typename Hint>
class Typed : public py::object {
 public:
  PYBIND11_OBJECT_DEFAULT(Typed, py::object, Typed::any)

 private:
  static int any(PyObject*) {
    return 1;
  }
};
// The hints (Python spellings; _C.pyi defines Event and Face).
struct EventDataHint {
  static constexpr auto name =
      py::detail::const_name("dict[str, str | float | int | bool]");
};
struct EventHandlerHint {
  // A callable, or a native sink (a face of a torch_monitor sink class).
  static constexpr auto name =
      py::detail::const_name("Callable[[Event], object] | Face");
};
struct TextHint {
  static constexpr auto name = py::detail::const_name("str");
};
struct TimestampHint {
  static constexpr auto name =
      py::detail::const_name("datetime.datetime");
};
struct StepHint {
  static constexpr auto name = py::detail::const_name("int | None");
};
using EventData = Typed<EventDataHint>;

} // namespace torch_monitor::python

namespace pybind11::detail {
template <typename Hint>
struct handle_type_name<torch_monitor::python::Typed<Hint>> {
  static constexpr auto name = Hint::name;
};
} // namespace pybind11::detail
