#include "pybind_internals.h"

namespace torch_monitor::python {
namespace {

PyObject* getAttrOfInitialised(PyObject* obj, PyObject* name) {
  if (cppObjectOf(obj) == nullptr) {
    PyErr_Format(
        PyExc_TypeError,
        "this %s object was never initialised (made with __new__ alone); "
        "create it by calling the class",
        Py_TYPE(obj)->tp_name);
    return nullptr;
  }
  return PyObject_GenericGetAttr(obj, name);
}

} // namespace

void refuseUninitialisedUse(pybind11::handle cls) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_getattro = &getAttrOfInitialised;
  PyType_Modified(type);
}

} // namespace torch_monitor::python
