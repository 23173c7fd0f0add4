#pragma once

// The one Python face of every torch.classes.torch_monitor object.
//
// torch_monitor._C.Face is a torch.ScriptObject subclass (so torch.jit.script
// takes a face as an attribute of its custom-class type, and scripted code
// reaches the very C++ object Python uses). torch_monitor/_faces.py derives
// each object's Python class from it and from the object's TorchScript
// schema; this file holds only what has to be C++: making and wrapping the
// custom-class object, the generic call of a TorchScript method (warnings as
// Python RuntimeWarnings, the GIL released), identity, and the typed access
// the hand-written hot paths use.

#include <pybind11/pybind11.h>
#include <torch/csrc/jit/api/object.h>
#include <torch/custom_class.h>

#include "internals.h"

namespace torch_monitor::python {

namespace py = pybind11;

// The custom-class object a face (or a plain torch.ScriptObject) wraps;
// nullptr for any other value.
const c10::ivalue::Object* wrappedObject(py::handle obj);

// Thread safety: as the wrapped object; the Python object itself is used
// with the GIL held.
struct Face : torch::jit::Object {
  explicit Face(torch::jit::Object object);
  // The custom-class instance (the object's one slot), cached for the hot
  // paths: holder<T>() is one pointer read.
  template <typename T>
  T* holder() const noexcept {
    return static_cast<T*>(holder_);
  }

 private:
  torch::CustomClassHolder* holder_;
};

// A new face of class `cls` (a face class) wrapping `object`, a
// custom-class object of that class: made in C++, without the Python
// torch.ScriptObject a call of Face.__init__ would need.
py::object newFace(py::handle cls, torch::jit::Object object);

// The Face of `obj` when obj is an initialised face, else nullptr with a
// Python TypeError set. For raw CPython methods (hot paths), which
// pybind11's checks do not cover; inline, as it runs on every Stat.add.
inline Face* faceOf(PyObject* obj) {
  void* face = cppObjectOf(obj);
  if (__builtin_expect(face == nullptr, 0)) {
    refuseUninitialised(obj);
    return nullptr;
  }
  return static_cast<Face*>(face);
}

// The custom-class object of type T that `obj` wraps: a face or a plain
// torch.ScriptObject of that class. TypeError naming `what` for anything
// else (another class's object included: a static cast would be undefined).
template <typename T>
c10::intrusive_ptr<T> scriptObjectOf(py::handle obj, const char* what) {
  const c10::ClassTypePtr expected =
      c10::getCustomClassType<c10::intrusive_ptr<T>>();
  const c10::ivalue::Object* object = wrappedObject(obj);
  if (object == nullptr || object->type() != expected) {
    throw py::type_error(
        std::string(what) + " must be a " + expected->repr_str() + ", got " +
        Py_TYPE(obj.ptr())->tp_name);
  }
  return c10::IValue(obj.cast<const torch::jit::Object&>()._ivalue())
      .toCustomClass<T>();
}

// Gives a face class the policy every face follows: cls.__new__(cls, ...)
// initialises the object as cls(...) does (none is ever left
// uninitialised), and attribute lookup and assignment are plain
// (usePlainAttributes: the methods are the class's, and an attribute that
// cannot be set is an AttributeError).
void hardenFaceClass(py::handle cls);

void initFaces(py::module_& m);

} // namespace torch_monitor::python
