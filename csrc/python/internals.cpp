#include "internals.h"

namespace torch_monitor::python {
namespace py = pybind11;
namespace {

PyObject* getAttrOfInitialised(PyObject* obj, PyObject* name) {
  if (cppObjectOf(obj) == nullptr) {
    return refuseUninitialised(obj);
  }
  return PyObject_GenericGetAttr(obj, name);
}

PyObject* createInitialised(
    PyTypeObject* type,
    PyObject* args,
    PyObject* kwargs);

// The class given to initialiseOnNew that `type` is or derives from.
PyTypeObject* initialisedBase(PyTypeObject* type) {
  PyTypeObject* base = nullptr;
  for (PyTypeObject* t = type; t != nullptr; t = t->tp_base) {
    if (t->tp_new == &createInitialised) {
      base = t;
    }
  }
  return base;
}

// tp_new of the classes given to initialiseOnNew.
PyObject* createInitialised(
    PyTypeObject* type,
    PyObject* args,
    PyObject* kwargs) {
  PyObject* object = py::detail::pybind11_object_new(type, args, kwargs);
  if (object == nullptr) {
    return nullptr;
  }
  // Run __init__ now when it is the class's own: Python's call of __init__
  // right after `cls(...)` is then ignored by pybind11 (the instance is
  // already constructed). A subclass with an __init__ of its own keeps
  // Python's protocol, so that its __init__ runs once (pybind11 then checks
  // that it initialised the base).
  PyTypeObject* base = initialisedBase(type);
  bool initNow = type == base;
  if (!initNow && base != nullptr) {
    py::object own = py::reinterpret_steal<py::object>(
        PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__init__"));
    py::object inherited = py::reinterpret_steal<py::object>(
        PyObject_GetAttrString(reinterpret_cast<PyObject*>(base), "__init__"));
    if (!own || !inherited) {
      Py_DECREF(object);
      return nullptr;
    }
    initNow = own.is(inherited);
  }
  PyObject* empty = nullptr;
  if (initNow && args == nullptr) {
    args = empty = PyTuple_New(0);
  }
  if (initNow && (args == nullptr || type->tp_init(object, args, kwargs) < 0)) {
    Py_CLEAR(object);
  }
  Py_XDECREF(empty);
  return object;
}

// `__new__` as found in the class dict (`cls.__new__(cls, ...)`, or
// super().__new__ from a subclass); `self` is the class.
PyObject* newMethod(PyObject* self, PyObject* args, PyObject* kwargs) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  auto* cls = reinterpret_cast<PyTypeObject*>(self);
  if (n < 1 || !PyType_Check(PyTuple_GET_ITEM(args, 0)) ||
      !PyType_IsSubtype(
          reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(args, 0)), cls)) {
    PyErr_Format(
        PyExc_TypeError,
        "%s.__new__(X): X must be %s or a subclass of it",
        cls->tp_name,
        cls->tp_name);
    return nullptr;
  }
  PyObject* rest = PyTuple_GetSlice(args, 1, n);
  if (rest == nullptr) {
    return nullptr;
  }
  PyObject* object = createInitialised(
      reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(args, 0)), rest, kwargs);
  Py_DECREF(rest);
  return object;
}

} // namespace

bool pythonIsUsable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing(); // private before 3.13
#endif
}

void initialiseOnNew(py::handle cls) {
  // The definition must outlive the class; one serves every class, since
  // the function receives its class as `self`.
  static PyMethodDef def = {
      "__new__",
      reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&newMethod)),
      METH_VARARGS | METH_KEYWORDS,
      "Creates and initialises the object (arguments as for __init__)"};
  py::object function = py::reinterpret_steal<py::object>(
      PyCFunction_NewEx(&def, cls.ptr(), nullptr));
  // staticmethod(function), not PyStaticMethod_New: only the call copies
  // the function's __name__ and __doc__, which torch.compile reads when
  // traced code makes a face.
  py::object method = function
      ? py::reinterpret_steal<py::object>(PyObject_CallOneArg(
            reinterpret_cast<PyObject*>(&PyStaticMethod_Type), function.ptr()))
      : py::object();
  if (!method ||
      PyObject_SetAttrString(cls.ptr(), "__new__", method.ptr()) != 0) {
    throw py::error_already_set();
  }
  // Setting __new__ made tp_new the generic slot_tp_new. A C slot of our own
  // instead is faster, and makes CPython refuse the bypass
  // `object.__new__`-style calls of a base (pybind11_object.__new__(cls),
  // torch.ScriptObject.__new__(cls)) as "not safe".
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_new = &createInitialised;
  PyType_Modified(type);
}

py::object allocateUninitialised(py::handle type) {
  py::tuple noArguments;
  PyObject* object = py::detail::pybind11_object_new(
      reinterpret_cast<PyTypeObject*>(type.ptr()), noArguments.ptr(), nullptr);
  if (object == nullptr) {
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(object);
}

void constructInstance(py::handle instance, void* value) {
  auto* inst = reinterpret_cast<py::detail::instance*>(instance.ptr());
  py::detail::value_and_holder v_h =
      *py::detail::values_and_holders(inst).begin();
  v_h.value_ptr() = value;
  v_h.type->init_instance(inst, nullptr); // registers it, makes its holder
}

void addFastMethod(
    py::handle cls,
    const char* name,
    PyObject* (*function)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*),
    const char* doc) {
  auto* def = new PyMethodDef{
      name,
      reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(function)),
      METH_FASTCALL | METH_KEYWORDS,
      doc};
  PyObject* descriptor =
      PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), def);
  if (descriptor == nullptr ||
      PyObject_SetAttrString(cls.ptr(), def->ml_name, descriptor) != 0) {
    Py_XDECREF(descriptor);
    throw py::error_already_set();
  }
  Py_DECREF(descriptor);
}

void usePlainAttributes(py::handle cls) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_getattro = PyObject_GenericGetAttr;
  type->tp_setattro = PyObject_GenericSetAttr;
  PyType_Modified(type);
}

PyObject* moduleMember(PyObject* module, PyObject* name, bool* found) {
  static PyObject* const keys[] = {
      PyUnicode_InternFromString("_parameters"),
      PyUnicode_InternFromString("_buffers"),
      PyUnicode_InternFromString("_modules")};
  *found = false;
  PyObject* dict = PyObject_GenericGetDict(module, nullptr);
  if (dict == nullptr) {
    return nullptr;
  }
  for (PyObject* key : keys) {
    PyObject* members = PyDict_GetItemWithError(dict, key);
    if (members != nullptr && PyDict_Check(members)) {
      PyObject* value = PyDict_GetItemWithError(members, name);
      if (value != nullptr) {
        *found = true;
        Py_INCREF(value);
        Py_DECREF(dict);
        return value;
      }
    }
    if (PyErr_Occurred()) {
      Py_DECREF(dict);
      return nullptr;
    }
  }
  Py_DECREF(dict);
  return nullptr;
}

PyObject* refuseUninitialised(PyObject* obj) {
  PyErr_Format(
      PyExc_TypeError,
      "this %s object was never initialised (made with __new__ alone); "
      "create it by calling the class",
      Py_TYPE(obj)->tp_name);
  return nullptr;
}

void refuseUninitialisedUse(pybind11::handle cls) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_getattro = &getAttrOfInitialised;
  PyType_Modified(type);
}

} // namespace torch_monitor::python
