#include "face.h"

#include "py_common.h"
#include "internals.h"

#include <optional>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/custom_class.h>

namespace torch_monitor::python {
namespace {

// Collects the c10 warnings raised on this thread while a face's C++ code
// runs (with the GIL released), then issues them as Python RuntimeWarnings,
// so an unwritable log directory found by a constructor or flush() is seen,
// and filtered, like any Python warning. (Warnings of background threads go
// through torch_monitor/background_warnings.h instead.)
class WarningsToPython : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    messages_.push_back(warning.msg());
  }

  // Runs fn() without the GIL, then warns; raises if a warning filter turns
  // a warning into an error.
  template <typename Fn>
  static void run(Fn&& fn) {
    WarningsToPython handler;
    {
      c10::WarningUtils::WarningHandlerGuard guard(&handler);
      py::gil_scoped_release noGil;
      fn();
    }
    for (const std::string& message : handler.messages_) {
      if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) {
        throw py::error_already_set();
      }
    }
  }

 private:
  std::vector<std::string> messages_;
};

c10::ClassTypePtr scriptClass(const std::string& name) {
  return torch::getCustomClass("__torch__.torch.classes.torch_monitor." + name);
}

// `obj` as an IValue when it is a plain value (an exact float, int, bool,
// str or None, or a list of str), for an argument of type Any or of the
// value's own type: torch's conversion (toIValue) infers an Any's type by
// importing modules and running isinstance checks in Python, three quarters
// of a Stat's construction (callgrind), and checks a str against tensors
// first. nullopt for anything else, which torch converts.
std::optional<c10::IValue> plainValue(PyObject* obj) {
  if (obj == Py_None) {
    return c10::IValue();
  }
  if (PyFloat_CheckExact(obj)) {
    return c10::IValue(PyFloat_AS_DOUBLE(obj));
  }
  if (PyBool_Check(obj)) {
    return c10::IValue(obj == Py_True);
  }
  if (PyLong_CheckExact(obj)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow == 0 && !(v == -1 && PyErr_Occurred())) {
      return c10::IValue(static_cast<int64_t>(v));
    }
    PyErr_Clear();
    return std::nullopt;
  }
  if (PyUnicode_CheckExact(obj)) {
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(obj, &size);
    if (text == nullptr) { // a lone surrogate: torch's message
      PyErr_Clear();
      return std::nullopt;
    }
    return c10::IValue(std::string(text, size));
  }
  if (!PyList_CheckExact(obj) || PyList_GET_SIZE(obj) == 0) {
    return std::nullopt;
  }
  c10::List<std::string> items;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(obj); ++i) {
    PyObject* item = PyList_GET_ITEM(obj, i);
    std::optional<c10::IValue> value;
    if (PyUnicode_CheckExact(item)) {
      value = plainValue(item);
    }
    if (!value) {
      return std::nullopt;
    }
    items.push_back(value->toStringRef());
  }
  return c10::IValue(std::move(items));
}

// Runs `method` of `self` with Python arguments matched to its schema (names,
// defaults, keyword-only) exactly as TorchScript callers would pass them;
// returns the result as a Python object.
py::object runMethod(
    torch::jit::Function& method,
    const c10::IValue& self,
    const py::tuple& args,
    const py::dict& kwargs) {
  const c10::FunctionSchema& schema = method.getSchema();
  const std::vector<c10::Argument>& arguments = schema.arguments();
  torch::jit::Stack stack;
  try {
    if (kwargs.empty() && args.size() + 1 == arguments.size()) {
      // Every argument by position, as the faces call: plain values are
      // converted here (plainValue).
      stack.reserve(arguments.size());
      stack.push_back(self);
      for (size_t i = 1; i < arguments.size(); ++i) {
        py::handle arg = args[i - 1];
        const c10::TypePtr& type = arguments[i].type();
        std::optional<c10::IValue> value = plainValue(arg.ptr());
        if (value && type->kind() != c10::TypeKind::AnyType &&
            *value->type() != *type) {
          value.reset(); // e.g. an int for a float: torch converts it
        }
        stack.push_back(
            value ? std::move(*value)
                  : torch::jit::argumentToIValue(schema, i, arg));
      }
    } else {
      stack = torch::jit::createStackForSchema(
          schema,
          torch::jit::tuple_slice(args),
          py::reinterpret_borrow<py::kwargs>(kwargs),
          self);
    }
  } catch (const torch::jit::schema_match_error& e) {
    throw py::type_error(e.what());
  }
  WarningsToPython::run([&] { method.run(stack); });
  return torch::jit::toPyObject(std::move(stack.back()));
}

// A new object of torch.classes.torch_monitor.<name>, made by `initMethod`
// ("__init__" with the constructor's arguments, "__setstate__" with a
// pickled state).
torch::jit::Object newObject(
    const std::string& name,
    const char* initMethod,
    const py::tuple& args,
    const py::dict& kwargs) {
  const c10::ClassTypePtr type = scriptClass(name);
  TORCH_CHECK(type != nullptr, "torch_monitor has no class ", name);
  torch::jit::Object object(c10::ivalue::Object::create(type, 1));
  torch::jit::Function* init = type->findMethod(initMethod);
  TORCH_CHECK(init != nullptr, name, " has no ", initMethod, " method");
  runMethod(*init, object._ivalue(), args, kwargs);
  return object;
}

} // namespace

const c10::ivalue::Object* wrappedObject(py::handle obj) {
  if (!py::isinstance<torch::jit::Object>(obj)) {
    return nullptr;
  }
  return obj.cast<const torch::jit::Object&>()._ivalue().get();
}

namespace {

// The C++ object (custom-class holder) in the one slot of what `obj`
// wraps; nullptr for anything else.
const void* wrappedHolder(py::handle obj) {
  const c10::ivalue::Object* object = wrappedObject(obj);
  if (object == nullptr || object->slots().size() != 1 ||
      !object->slots()[0].isCapsule()) {
    return nullptr;
  }
  return object->slots()[0].toCapsule().get();
}

} // namespace

Face::Face(torch::jit::Object object) : torch::jit::Object(std::move(object)) {
  const auto& slots = _ivalue()->slots();
  TORCH_INTERNAL_ASSERT(
      slots.size() == 1 && slots[0].isCapsule(), "not a custom-class object");
  holder_ = slots[0].toCapsule().get();
}

namespace {

// Makes `face`, a face never initialised, wrap the object `make()`
// returns (made only once the face is known to be one).
template <typename Make>
void initialiseFace(py::handle face, Make&& make) {
  // A type check, not py::isinstance (a registry lookup and Python's
  // isinstance protocol: 8% of a WaitCounter's construction).
  static auto* const faceType =
      reinterpret_cast<PyTypeObject*>(py::type::of<Face>().ptr());
  if (!PyObject_TypeCheck(face.ptr(), faceType) ||
      cppObjectOf(face.ptr()) != nullptr) {
    throw py::type_error(
        std::string("a face never initialised is needed, got ") +
        Py_TYPE(face.ptr())->tp_name);
  }
  auto value = std::make_unique<Face>(make());
  constructInstance(face, value.release());
}

} // namespace

py::object newFace(py::handle cls, torch::jit::Object object) {
  py::object face = allocateUninitialised(cls);
  initialiseFace(face, [&] { return std::move(object); });
  return face;
}

void hardenFaceClass(py::handle cls) {
  initialiseOnNew(cls);
  usePlainAttributes(cls);
}

void initFaces(py::module_& m) {
  py::class_<Face, torch::jit::Object> face(
      m,
      "Face",
      "Base of the Python faces of torch.classes.torch_monitor objects "
      "(torch_monitor/_faces.py makes them from the TorchScript schemas)");
  face.def(
          "_call",
          [](const Face& self,
             const std::string& name,
             const py::tuple& args,
             const py::dict& kwargs) {
            torch::jit::Function* method = self.type()->findMethod(name);
            TORCH_CHECK(
                method != nullptr, self.type()->name()->name(), " has no method ", name);
            return runMethod(*method, self._ivalue(), args, kwargs);
          },
          py::arg("name"),
          py::arg("args"),
          py::arg("kwargs"),
          "Calls the TorchScript method `name` (warnings become Python "
          "RuntimeWarnings; the GIL is released while it runs)")
      // A face is the C++ object it wraps: equal, and hashed, by that
      // object. A face equals the torch.ScriptObject read back from a
      // scripted module or returned by a method (a monitor's reducer()),
      // though each such read makes a new TorchScript object around it;
      // PyTorch 2 compares the objects it lifts into a graph. (A plain
      // torch.ScriptObject hashes by that TorchScript object: wrapped in
      // its face it hashes as the face does.)
      .def(
          "__eq__",
          [](py::handle self, py::handle other) -> py::object {
            const void* theirs = wrappedHolder(other);
            if (theirs == nullptr) {
              return py::reinterpret_borrow<py::object>(Py_NotImplemented);
            }
            return py::bool_(wrappedHolder(self) == theirs);
          })
      .def(
          "__ne__",
          [](py::handle self, py::handle other) -> py::object {
            const void* theirs = wrappedHolder(other);
            if (theirs == nullptr) {
              return py::reinterpret_borrow<py::object>(Py_NotImplemented);
            }
            return py::bool_(wrappedHolder(self) != theirs);
          })
      .def(
          "__hash__",
          [](py::handle self) {
            return std::hash<const void*>{}(wrappedHolder(self));
          })
      // Shadows torch.ScriptObject's, whose pybind11 pickle support would
      // construct the object again and terminate the process; faces pickle
      // through __reduce_ex__ (torch_monitor/_faces.py), so on a live object
      // this does nothing.
      .def("__setstate__", [](const Face&, py::handle) {});
  m.def(
      "_init_face",
      [](py::handle face, const std::string& name, const py::tuple& args) {
        initialiseFace(
            face, [&] { return newObject(name, "__init__", args, py::dict()); });
      },
      py::arg("face"),
      py::arg("name"),
      py::arg("args"),
      "Makes `face` (never initialised) wrap a new "
      "torch.classes.torch_monitor.<name>(*args) (warnings become Python "
      "RuntimeWarnings)");
  m.def(
      "_restore_script_object",
      [](const std::string& name, const py::handle& state) {
        return newObject(name, "__setstate__", py::make_tuple(state), py::dict());
      },
      py::arg("name"),
      py::arg("state"),
      "A torch.classes.torch_monitor.<name> rebuilt from its pickled state");
  m.def(
      "_script_methods",
      [](const std::string& name) {
        const c10::ClassTypePtr type = scriptClass(name);
        TORCH_CHECK(type != nullptr, "torch_monitor has no class ", name);
        py::list out;
        for (torch::jit::Function* method : type->methods()) {
          out.append(py::make_tuple(
              method->getSchema(), std::string(method->doc_string())));
        }
        return out;
      },
      py::arg("name"),
      "[(schema, doc)] of the methods of torch.classes.torch_monitor.<name>, "
      "in registration order");
  m.def(
      "_harden_face_class",
      &hardenFaceClass,
      py::arg("cls"),
      "Makes cls.__new__(cls, ...) initialise the object as cls(...) does "
      "(so none is ever left uninitialised), and gives the class plain "
      "attribute lookup and assignment (torch.ScriptObject's hooks would "
      "slow every lookup, and raise RuntimeError for an attribute that "
      "cannot be set)");
  m.def(
      "_wrap",
      [](py::handle cls, const torch::jit::Object& scriptObject) {
        return newFace(cls, scriptObject);
      },
      py::arg("cls"),
      py::arg("script_object"),
      "The face of class `cls` for an existing torch.ScriptObject of its "
      "class (read back from a scripted module, or restored)");
  m.def(
      "_face_initialised",
      [](py::handle obj) { return cppObjectOf(obj.ptr()) != nullptr; },
      py::arg("face"),
      "Whether the face wraps an object (its __init__ ran)");
  m.def(
      "_text",
      &textFromPython,
      py::arg("value"),
      py::arg("where"),
      "`value` (a str, or bytes holding UTF-8) as text for C++: the faces' "
      "check of every name, path and key, the one the binding's own "
      "arguments get (no lone surrogate, no NUL; errors name `where`)");
}

} // namespace torch_monitor::python
