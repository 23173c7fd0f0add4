// Python face of the monitors: torch_monitor._C.DifferenceMonitorCore, a
// torch.ScriptObject around torch.classes.torch_monitor.DifferenceMonitor,
// and the C functions that the generated eager hooks call.
//
// A monitored module holds the core object as an attribute. Its hooks are
// generated Python functions (torch_monitor/monitors.py) so TorchScript can
// compile them; when not scripting they make one call into this file, which
// reads the module's mode, resolves the attribute path, converts the value
// and runs DifferenceMonitor::before/after, all in C++.

#include "face.h"
#include "py_common.h"
#include "internals.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/api/object.h>

#include <torch_monitor/nn/attribute_path.h>
#include <torch_monitor/script/difference_monitor.h>

namespace torch_monitor::python {
namespace {

using script::ScriptDifferenceMonitor;
using script::ScriptReducer;

constexpr const char* kReducerClass =
    "__torch__.torch.classes.torch_monitor.Reducer";

// An attribute value with no IValue equivalent (a dict, a custom object),
// carried through the monitor to the Python filter_/map_/op_ unchanged. It
// never reaches TorchScript: the default map rejects it by type.
// Thread safety: as PyRef; reading the object needs the GIL.
struct PythonValue final : c10::ivalue::PyObjectHolder {
  explicit PythonValue(py::object object) : ref(std::move(object)) {}
  PyObject* getPyObject() override {
    return ref.get().ptr();
  }
  c10::InferredType tryToInferType() override {
    return c10::InferredType("a Python object has no TorchScript type");
  }
  c10::IValue toIValue(const c10::TypePtr& type, std::optional<int32_t>)
      override {
    TORCH_CHECK_TYPE(
        false,
        "a Python attribute value cannot be converted to ",
        type->repr_str());
  }
  std::string toStr() override {
    py::gil_scoped_acquire gil;
    return py::str(ref.get()).cast<std::string>();
  }
  std::vector<at::Tensor> extractTensors() override {
    return {};
  }
  PyRef ref;
};

// -------------------------------------------------------------- conversion

// How deeply tuples and lists may nest in a monitored value. A list that
// contains itself would recurse forever (and a very deep one overflow the
// stack): both are refused, far beyond any real attribute's nesting.
constexpr int kMaxNesting = 64;

// The IValue the monitor sees for an attribute's Python value: tensors,
// None, numbers, strings, tuples and lists of them natively; anything else
// wrapped (see PythonValue). `name` (the monitor's) is for the error. Needs
// the GIL.
c10::IValue valueFromPython(PyObject* obj, const std::string& name, int depth = 0) {
  if ((PyTuple_Check(obj) || PyList_Check(obj)) && depth >= kMaxNesting) {
    throw py::value_error(
        "DifferenceMonitor '" + name + "': the attribute's value has tuples "
        "or lists nested more than " + std::to_string(kMaxNesting) +
        " levels deep (or a list that contains itself); monitor a tensor "
        "or a shallow tuple of tensors");
  }
  if (THPVariable_Check(obj)) {
    return THPVariable_Unpack(obj);
  }
  if (obj == Py_None) {
    return c10::IValue();
  }
  if (PyTuple_Check(obj)) {
    const Py_ssize_t n = PyTuple_GET_SIZE(obj);
    std::vector<c10::IValue> elements;
    elements.reserve(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      elements.push_back(
          valueFromPython(PyTuple_GET_ITEM(obj, i), name, depth + 1));
    }
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  if (PyBool_Check(obj)) {
    return obj == Py_True;
  }
  if (PyLong_Check(obj)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow == 0 && !(v == -1 && PyErr_Occurred())) {
      return static_cast<int64_t>(v);
    }
    PyErr_Clear();
  } else if (PyFloat_Check(obj)) {
    return PyFloat_AS_DOUBLE(obj);
  } else if (PyUnicode_Check(obj)) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(obj, &size);
    if (data != nullptr) {
      return std::string(data, size);
    }
    PyErr_Clear();
  } else if (PyList_Check(obj)) {
    c10::impl::GenericList list(c10::AnyType::get());
    const Py_ssize_t n = PyList_GET_SIZE(obj);
    list.reserve(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
      list.push_back(valueFromPython(PyList_GET_ITEM(obj, i), name, depth + 1));
    }
    return list;
  }
  return c10::IValue(c10::intrusive_ptr<c10::ivalue::PyObjectHolder>(
      c10::make_intrusive<PythonValue>(
          py::reinterpret_borrow<py::object>(obj))));
}

// The Python value handed to filter_/map_/op_. Needs the GIL.
py::object valueToPython(const c10::IValue& value) {
  if (value.isTensor()) {
    return py::reinterpret_steal<py::object>(
        THPVariable_Wrap(value.toTensor()));
  }
  if (value.isNone()) {
    return py::none();
  }
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    py::tuple out(elements.size());
    for (size_t i = 0; i < elements.size(); ++i) {
      out[i] = valueToPython(elements[i]);
    }
    return std::move(out);
  }
  if (value.isList()) {
    py::list out;
    for (const c10::IValue& element : value.toListRef()) {
      out.append(valueToPython(element));
    }
    return std::move(out);
  }
  if (value.isBool()) {
    return py::bool_(value.toBool());
  }
  if (value.isInt()) {
    return py::int_(value.toInt());
  }
  if (value.isDouble()) {
    return py::float_(value.toDouble());
  }
  if (value.isString()) {
    return py::str(value.toStringRef());
  }
  if (value.isPyObject()) {
    return py::reinterpret_borrow<py::object>(value.toPyObject());
  }
  TORCH_CHECK_TYPE(
      false,
      "a DifferenceMonitor value of kind ",
      value.tagKind(),
      " cannot be passed to a Python filter_, map_ or op_");
}

at::Tensor tensorFromResult(
    const py::handle& result,
    const char* what,
    const std::string& where) {
  TORCH_CHECK_TYPE(
      THPVariable_Check(result.ptr()),
      where,
      ": ",
      what,
      " must be a Tensor, got ",
      Py_TYPE(result.ptr())->tp_name);
  return THPVariable_Unpack(result.ptr());
}

// ------------------------------------------------- Python filter_/map_/op_

// Each wrapper takes the GIL itself: scripted forward() calls run without
// it. A Python exception propagates as py::error_already_set, and the eager
// hook re-raises the very exception.
DifferenceMonitor::Filter wrapFilter(std::shared_ptr<PyRef> fn) {
  return [fn](const c10::IValue& post, const c10::IValue& pre) {
    py::gil_scoped_acquire gil;
    py::object result = fn->get()(valueToPython(post), valueToPython(pre));
    const int truth = PyObject_IsTrue(result.ptr());
    if (truth < 0) {
      throw py::error_already_set();
    }
    return truth == 1;
  };
}

DifferenceMonitor::Map wrapMap(std::shared_ptr<PyRef> fn, std::string name) {
  return [fn, name](const c10::IValue& post, const c10::IValue& pre) {
    py::gil_scoped_acquire gil;
    py::object result = fn->get()(valueToPython(post), valueToPython(pre));
    const std::string where = "DifferenceMonitor '" + name + "'";
    TORCH_CHECK_TYPE(
        PyTuple_Check(result.ptr()) || PyList_Check(result.ptr()),
        where,
        ": map_ must return a tuple of tensors (the reducer's inputs, e.g. "
        "`(post - pre,)`), got ",
        Py_TYPE(result.ptr())->tp_name);
    std::vector<at::Tensor> inputs;
    for (py::handle item : result) {
      inputs.push_back(tensorFromResult(item, "every element map_ returns", where));
    }
    return inputs;
  };
}

DifferenceMonitor::Op wrapOp(std::shared_ptr<PyRef> fn, std::string name) {
  return [fn, name](const at::Tensor& post, const at::Tensor& pre) {
    py::gil_scoped_acquire gil;
    py::object result = fn->get()(
        py::reinterpret_steal<py::object>(THPVariable_Wrap(post)),
        py::reinterpret_steal<py::object>(THPVariable_Wrap(pre)));
    return tensorFromResult(
        result, "op_'s result", "DifferenceMonitor '" + name + "'");
  };
}

py::object checkedCallable(py::object fn, const char* argName) {
  if (fn.is_none()) {
    return fn;
  }
  if (!PyCallable_Check(fn.ptr())) {
    throw py::type_error(
        std::string(argName) + " must be a callable or None, got " +
        Py_TYPE(fn.ptr())->tp_name);
  }
  return fn;
}

// -------------------------------------------------------------- the object

// The Python face of a difference monitor: a Face (so torch.jit.script
// accepts it as a module attribute of type
// torch.classes.torch_monitor.DifferenceMonitor and scripted hooks reach the
// same C++ monitor) that also keeps what the eager hooks need: the path
// split into interned strings and the Python callables.
// Thread safety: as DifferenceMonitor (none); Python calls hold the GIL.
struct PyDifferenceMonitor : Face {
  PyDifferenceMonitor(
      const c10::intrusive_ptr<ScriptDifferenceMonitor>& object,
      py::object reducer_,
      const std::string& path,
      py::object filter_,
      py::object map_,
      py::object op_)
      : Face(torch::jit::Object(c10::IValue(object).toObject())),
        reducer(std::move(reducer_)),
        filter(checkedCallable(std::move(filter_), "filter_")),
        map(checkedCallable(std::move(map_), "map_")),
        op(checkedCallable(std::move(op_), "op_")) {
    // ValueError for an empty path or part, with AttributePath's message.
    const nn::AttributePath parsed(path);
    for (const std::string& part : parsed.parts()) {
      PyObject* interned = PyUnicode_InternFromString(part.c_str());
      if (interned == nullptr) {
        throw py::error_already_set();
      }
      parts.push_back(py::reinterpret_steal<py::object>(interned));
    }
    const std::string& name = monitor()->name();
    if (!filter.is_none()) {
      monitor()->setFilter(
          wrapFilter(std::make_shared<PyRef>(filter)));
    }
    if (!map.is_none()) {
      monitor()->setMap(wrapMap(std::make_shared<PyRef>(map), name));
    }
    if (!op.is_none()) {
      monitor()->setOp(wrapOp(std::make_shared<PyRef>(op), name));
    }
  }

  ScriptDifferenceMonitor& script() const noexcept {
    return *holder<ScriptDifferenceMonitor>();
  }

  // The C++ monitor: two pointer reads (the face caches the custom-class
  // object), cheap enough for the hooks.
  DifferenceMonitor* monitor() const noexcept {
    return &script().monitor();
  }

  // The reducer as given: a torch_monitor reducer (an nn.Module) or its
  // ScriptObject. Deep copies copy it through the memo, so copying a monitor
  // along with the reducer object shares one copy.
  py::object reducer;
  std::vector<py::object> parts; // the attribute path, interned
  py::object filter;
  py::object map;
  py::object op;
};

PyTypeObject* gMonitorType = nullptr; // DifferenceMonitorCore
PyTypeObject* gModuleType = nullptr; // torch.nn.Module
PyObject* gTrainingKey = nullptr;

// The torch.classes.torch_monitor.Reducer of `reducer`: the object itself, or
// what a Python reducer (torch_monitor.reducers) says a monitor feeds: its
// `script_reducer`, or a reducer calling it in Python when its forward is
// overridden or hooked.
c10::IValue scriptReducerFrom(const py::handle& given) {
  py::object reducer = py::reinterpret_borrow<py::object>(given);
  if (py::hasattr(given, "_monitor_feed")) {
    reducer = given.attr("_monitor_feed")();
  }
  const auto fail = [&]() {
    return py::type_error(
        "reducer must be a torch_monitor reducer (e.g. "
        "torch_monitor.PassthroughReducer(1.0)) or its "
        "torch.classes.torch_monitor.Reducer object, got " +
        std::string(Py_TYPE(given.ptr())->tp_name) +
        " (inferno's reducers are Python objects that the C++ monitor "
        "cannot feed)");
  };
  torch::jit::Object object;
  try {
    object = reducer.cast<torch::jit::Object>();
  } catch (const py::cast_error&) {
    throw fail();
  }
  const auto& type = object.type();
  if (!type->name() || type->name()->qualifiedName() != kReducerClass) {
    throw fail();
  }
  return c10::IValue(object._ivalue());
}

std::unique_ptr<PyDifferenceMonitor> makeMonitor(
    py::object reducer,
    const std::string& name,
    bool trainUpdate,
    bool evalUpdate,
    bool keepGraph,
    std::string kind,
    py::object filter,
    py::object map,
    py::object op) {
  auto object = c10::make_intrusive<ScriptDifferenceMonitor>(
      scriptReducerFrom(reducer),
      name,
      trainUpdate,
      evalUpdate,
      keepGraph,
      std::move(kind));
  return std::make_unique<PyDifferenceMonitor>(
      object,
      std::move(reducer),
      name,
      std::move(filter),
      std::move(map),
      std::move(op));
}

// The C++ object of a DifferenceMonitorCore (as faceOf: nullptr with a
// TypeError set for one never initialised).
PyDifferenceMonitor* unwrap(PyObject* obj) {
  return static_cast<PyDifferenceMonitor*>(faceOf(obj));
}

// ---------------------------------------------------- attribute resolution

// `obj.name` as nn.Module resolves it (see moduleMember), else getattr.
// New reference, or nullptr with the error set.
PyObject* getComponent(PyObject* obj, PyObject* name) {
  if (PyType_IsSubtype(Py_TYPE(obj), gModuleType)) {
    bool found = false;
    PyObject* value = moduleMember(obj, name, &found);
    if (found || value == nullptr && PyErr_Occurred()) {
      return value;
    }
  }
  return PyObject_GetAttr(obj, name);
}

// Replaces the pending AttributeError by one naming the monitor's whole path
// and the part that is missing (the original stays as __cause__).
void raiseMissing(
    PyObject* module,
    const PyDifferenceMonitor& self,
    size_t missing,
    PyObject* owner) {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  std::string where = "the module";
  if (missing > 0) {
    where.clear();
    for (size_t i = 0; i < missing; ++i) {
      where += (i ? "." : "") + py::str(self.parts[i]).cast<std::string>();
    }
    where = "'" + where + "' (" + Py_TYPE(owner)->tp_name + ")";
  }
  const std::string message = "DifferenceMonitor attribute path '" +
      self.monitor()->name() + "' does not resolve on " +
      Py_TYPE(module)->tp_name + ": " + where + " has no attribute '" +
      py::str(self.parts[missing]).cast<std::string>() +
      "'. Check the path (parts are joined by dots and resolved at every "
      "forward call through submodules, parameters, buffers and attributes)";
  PyObject* error =
      PyObject_CallFunction(PyExc_AttributeError, "s", message.c_str());
  if (error == nullptr) {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return;
  }
  if (value != nullptr) {
    if (traceback != nullptr) {
      PyException_SetTraceback(value, traceback);
    }
    PyException_SetCause(error, value); // steals value
    Py_INCREF(value);
    PyException_SetContext(error, value); // steals the new reference
  }
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  PyErr_SetObject(PyExc_AttributeError, error);
  Py_DECREF(error);
}

// The value at the monitor's path on `module`: a new reference, or nullptr
// with an AttributeError naming the path.
PyObject* resolvePath(PyObject* module, const PyDifferenceMonitor& self) {
  PyObject* current = module;
  Py_INCREF(current);
  for (size_t i = 0; i < self.parts.size(); ++i) {
    PyObject* next = getComponent(current, self.parts[i].ptr());
    if (next == nullptr) {
      if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        raiseMissing(module, self, i, current);
      }
      Py_DECREF(current);
      return nullptr;
    }
    Py_DECREF(current);
    current = next;
  }
  return current;
}

// -1 with an error set, else 0/1.
int trainingOf(PyObject* module, PyObject* dict) {
  PyObject* training = PyDict_GetItemWithError(dict, gTrainingKey);
  if (training != nullptr) {
    return PyObject_IsTrue(training);
  }
  if (PyErr_Occurred()) {
    return -1;
  }
  PyObject* attr = PyObject_GetAttr(module, gTrainingKey);
  if (attr == nullptr) {
    return -1;
  }
  const int truth = PyObject_IsTrue(attr);
  Py_DECREF(attr);
  return truth;
}

// The body of the eager hooks: `key` names the module attribute that holds
// the monitor (bound as the C function's self, so a deep copy of the module
// reaches its own copy of the monitor).
PyObject* runEagerHook(PyObject* key, PyObject* module, bool isBefore) {
  PyObject* dict = PyObject_GenericGetDict(module, nullptr);
  if (dict == nullptr) {
    return nullptr;
  }
  PyObject* core = PyDict_GetItemWithError(dict, key);
  if (core == nullptr || !PyObject_TypeCheck(core, gMonitorType)) {
    Py_DECREF(dict);
    if (!PyErr_Occurred()) {
      PyErr_Format(
          PyExc_RuntimeError,
          "a torch_monitor DifferenceMonitor hook on %s found no monitor in "
          "its attribute '%U' (was it deleted or replaced?); deregister() "
          "the monitor and register() it again",
          Py_TYPE(module)->tp_name,
          key);
    }
    return nullptr;
  }
  Py_INCREF(core); // a Python filter_ could delete the attribute meanwhile
  const int training = trainingOf(module, dict);
  Py_DECREF(dict);
  PyDifferenceMonitor* self = training < 0 ? nullptr : unwrap(core);
  PyObject* result = nullptr;
  if (self == nullptr) {
    // error set
  } else if (!self->monitor()->runsWhen(training == 1)) {
    result = Py_NewRef(Py_None);
  } else if (PyObject* value = resolvePath(module, *self)) {
    result = noneOrPythonError([&]() {
      const c10::IValue v = valueFromPython(value, self->monitor()->name());
      if (isBefore) {
        self->monitor()->before(v, training == 1);
      } else {
        self->monitor()->after(v, training == 1);
      }
    });
    Py_DECREF(value);
  }
  Py_DECREF(core);
  return result;
}

// before_hook(module)
PyObject* eagerBefore(PyObject* key, PyObject* module) {
  return runEagerHook(key, module, true);
}

// after_hook(module[, output]): the output is not needed, but the generated
// hook passes it so the call matches the hook's own arguments.
PyObject* eagerAfter(PyObject* key, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 2) {
    PyErr_SetString(
        PyExc_TypeError, "the after hook takes (module[, output])");
    return nullptr;
  }
  return runEagerHook(key, args[0], false);
}

PyMethodDef gEagerBeforeDef = {
    "difference_monitor_before",
    reinterpret_cast<PyCFunction>(&eagerBefore),
    METH_O,
    "eager forward pre-hook body of a DifferenceMonitor"};
PyMethodDef gEagerAfterDef = {
    "difference_monitor_after",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&eagerAfter)),
    METH_FASTCALL,
    "eager forward hook body of a DifferenceMonitor"};

// The monitor method a fast call runs.
enum class Hook { Before, After, Observe };

// The (value, training) arguments of a fast call, positional or by the
// schema's keywords; false with a TypeError set for any other call.
bool hookArguments(
    const char* method,
    PyObject* const* args,
    Py_ssize_t nargs,
    PyObject* kwnames,
    PyObject* (&out)[2]) {
  static const char* const kNames[2] = {"value", "training"};
  out[0] = out[1] = nullptr;
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  bool ok = nargs <= 2;
  for (Py_ssize_t i = 0; ok && i < nargs; ++i) {
    out[i] = args[i];
  }
  for (Py_ssize_t k = 0; ok && k < nkw; ++k) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, k);
    const int slot = PyUnicode_CompareWithASCIIString(name, kNames[0]) == 0 ? 0
        : PyUnicode_CompareWithASCIIString(name, kNames[1]) == 0            ? 1
                                                                            : -1;
    ok = slot >= 0 && out[slot] == nullptr;
    if (ok) {
      out[slot] = args[nargs + k];
    }
  }
  if (ok && out[0] != nullptr && out[1] != nullptr) {
    return true;
  }
  PyErr_Format(
      PyExc_TypeError,
      "%s(value, training) takes those 2 arguments (by position or keyword), "
      "got %zd positional and %zd keyword",
      method,
      nargs,
      nkw);
  return false;
}

// core.before/after/observe(value, training): the TorchScript methods,
// callable from Python at METH_FASTCALL cost.
template <Hook Which>
PyObject* fastCall(
    PyObject* obj,
    PyObject* const* args,
    Py_ssize_t nargs,
    PyObject* kwnames) {
  PyObject* given[2];
  if (!hookArguments(
          Which == Hook::Before     ? "before"
              : Which == Hook::After ? "after"
                                     : "observe",
          args,
          nargs,
          kwnames,
          given)) {
    return nullptr;
  }
  const int training = PyObject_IsTrue(given[1]);
  if (training < 0) {
    return nullptr;
  }
  PyDifferenceMonitor* self = unwrap(obj);
  if (self == nullptr) {
    return nullptr;
  }
  return noneOrPythonError([&]() {
    const c10::IValue v = valueFromPython(given[0], self->monitor()->name());
    if (Which == Hook::Before) {
      self->monitor()->before(v, training == 1);
    } else if (Which == Hook::After) {
      self->monitor()->after(v, training == 1);
    } else {
      self->monitor()->observe(v, training == 1);
    }
  });
}

std::unique_ptr<PyDifferenceMonitor> copyOf(
    const PyDifferenceMonitor& self,
    py::object reducer) {
  return makeMonitor(
      std::move(reducer),
      self.monitor()->name(),
      self.monitor()->trainUpdate(),
      self.monitor()->evalUpdate(),
      self.monitor()->keepGraph(),
      self.script().kind(),
      self.filter,
      self.map,
      self.op);
}

// How a thread holding the GIL waits for a reducer's or monitor's lock: the
// holder may be a TorchScript thread calling a Python criterion or map_,
// which needs the GIL to finish.
void waitReleasingGil(std::recursive_mutex& mutex) {
  if (PyGILState_Check() == 1) {
    Py_BEGIN_ALLOW_THREADS
    mutex.lock();
    Py_END_ALLOW_THREADS
  } else {
    mutex.lock();
  }
}

} // namespace

void initMonitors(py::module_& m) {
  torch_monitor::detail::setBlockingWait(&waitReleasingGil);
  using Self = PyDifferenceMonitor;
  auto cls =
      py::class_<Self, Face>(
          m,
          "DifferenceMonitorCore",
          "DifferenceMonitorCore(reducer, name, train_update=True, "
          "eval_update=True, keep_graph=False, kind='DifferenceMonitor', *, "
          "filter_=None, map_=None, op_=None): the C++ "
          "state of a DifferenceMonitor, a "
          "torch.classes.torch_monitor.DifferenceMonitor object (the "
          "TorchScript constructor's arguments, then the Python callables "
          "TorchScript cannot hold). "
          "torch_monitor.DifferenceMonitor stores it on the monitored module; "
          "use that class.")
          .def(
              py::init(&makeMonitor),
              py::arg("reducer"),
              py::arg("name"),
              py::arg("train_update") = true,
              py::arg("eval_update") = true,
              py::arg("keep_graph") = false,
              py::arg("kind") = ScriptDifferenceMonitor::kDefaultKind,
              py::kw_only(),
              py::arg("filter_") = py::none(),
              py::arg("map_") = py::none(),
              py::arg("op_") = py::none())
          // The Python callables as given (TorchScript cannot hold them):
          // the Python monitor reads them back, and copies take them along.
          // Every TorchScript method (kind(), name(), train_update(),
          // reducer(), peek(), ...) comes from the schema
          // (_faces.forward_script_methods), as in a scripted model.
          .def_readonly("filter_", &Self::filter)
          .def_readonly("map_", &Self::map)
          .def_readonly("op_", &Self::op)
          // Pickled like torch.jit.save pickles the class (refused with
          // Python callables), through __reduce_ex__ so that every protocol
          // works: protocols 0 and 1 would otherwise rebuild the object
          // with object.__new__, which aborts the process for a pybind11
          // class, and torch.ScriptObject's own pickling would rebuild a
          // plain ScriptObject.
          .def(
              "__reduce_ex__",
              [](const Self& self, int /*protocol*/) {
                auto [version, name, train, eval, reducer, keepGraph, kind] =
                    self.script().state();
                // The reducer as given (the torch_monitor reducer module,
                // which pickles with every protocol), not its ScriptObject:
                // torch.ScriptObject aborts under protocols 0 and 1.
                py::tuple state = py::make_tuple(
                    version, name, train, eval, self.reducer, keepGraph, kind);
                return py::make_tuple(
                    py::module_::import("torch_monitor._C")
                        .attr("_difference_monitor_core_from_state"),
                    py::make_tuple(state));
              })
          // A copy is a new monitor with the same configuration and
          // callables; a shallow copy feeds the same reducer, a deep copy a
          // deep copy of it (through `memo`, so copying a module together
          // with its Python reducer object shares one reducer copy).
          .def(
              "__copy__",
              [](const Self& self) { return copyOf(self, self.reducer); })
          .def(
              "__deepcopy__",
              [](const Self& self, py::dict memo) {
                py::object reducer =
                    py::module_::import("copy").attr("deepcopy")(
                        self.reducer, memo);
                return copyOf(self, std::move(reducer));
              })
          .def("__repr__", [](const Self& self) {
            return "DifferenceMonitorCore(name=" +
                py::repr(py::str(self.monitor()->name())).cast<std::string>() +
                ", train_update=" +
                (self.monitor()->trainUpdate() ? "True" : "False") +
                ", eval_update=" +
                (self.monitor()->evalUpdate() ? "True" : "False") + ")";
          });

  static PyMethodDef beforeDef = {
      "before",
      reinterpret_cast<PyCFunction>(
          reinterpret_cast<void (*)()>(&fastCall<Hook::Before>)),
      METH_FASTCALL | METH_KEYWORDS,
      "before(value, training): captures the value (the pre-hook's part)"};
  static PyMethodDef afterDef = {
      "after",
      reinterpret_cast<PyCFunction>(
          reinterpret_cast<void (*)()>(&fastCall<Hook::After>)),
      METH_FASTCALL | METH_KEYWORDS,
      "after(value, training): feeds op(value, captured) to the reducer"};
  static PyMethodDef observeDef = {
      "observe",
      reinterpret_cast<PyCFunction>(
          reinterpret_cast<void (*)()>(&fastCall<Hook::Observe>)),
      METH_FASTCALL | METH_KEYWORDS,
      "observe(value, training): feeds map_(value) to the reducer (the hook "
      "of InputMonitor, OutputMonitor, StateMonitor, MultiStateMonitor)"};
  addRawMethod(cls, &beforeDef);
  addRawMethod(cls, &afterDef);
  addRawMethod(cls, &observeDef);

  // As every face (an object made with __new__ alone read garbage in its
  // slots: repr, ==, hash); pickling goes through __reduce_ex__, a factory.
  hardenFaceClass(cls);
  // Its TorchScript class: _faces.forward_script_methods gives it every
  // method of that class it does not define, and _fake makes it traceable.
  cls.attr("_script_class") = "DifferenceMonitor";
  gMonitorType = reinterpret_cast<PyTypeObject*>(cls.ptr());

  gModuleType = reinterpret_cast<PyTypeObject*>(
      py::object(py::module_::import("torch.nn").attr("Module"))
          .release()
          .ptr());
  gTrainingKey = PyUnicode_InternFromString("training");

  m.def(
      "_check_monitor_path",
      [](py::handle core, py::handle module) {
        PyDifferenceMonitor* self = unwrap(core.ptr());
        PyObject* value = self == nullptr ? nullptr : resolvePath(module.ptr(), *self);
        if (value == nullptr) {
          throw py::error_already_set();
        }
        Py_DECREF(value);
      },
      py::arg("core"),
      py::arg("module"),
      "Raises the AttributeError a forward would (naming the path and the "
      "missing part) when the monitor's path does not resolve on `module`");
  m.def(
      "_difference_monitor_core_from_state",
      [](const py::tuple& state) {
        if (state.size() != 7 || !py::isinstance<py::int_>(state[0]) ||
            state[0].cast<int64_t>() !=
                ScriptDifferenceMonitor::kStateVersion) {
          throw py::value_error(
              "cannot unpickle a DifferenceMonitorCore of another "
              "torch_monitor version; load it with the release that saved it");
        }
        return makeMonitor(
            state[4],
            state[1].cast<std::string>(),
            state[2].cast<bool>(),
            state[3].cast<bool>(),
            state[5].cast<bool>(),
            state[6].cast<std::string>(),
            py::none(),
            py::none(),
            py::none());
      },
      py::arg("state"),
      "rebuilds a pickled DifferenceMonitorCore");

  m.def(
      "_difference_default_map",
      [](py::handle post, py::handle pre, py::object op) {
        const std::string name = "default map_";
        const c10::IValue postValue = valueFromPython(post.ptr(), name);
        const c10::IValue preValue = valueFromPython(pre.ptr(), name);
        DifferenceMonitor::Op opFn;
        if (!checkedCallable(op, "op_").is_none()) {
          opFn = wrapOp(std::make_shared<PyRef>(op), name);
        }
        std::vector<at::Tensor> out;
        {
          py::gil_scoped_release noGil; // a Python op_ takes it back
          out = DifferenceMonitor::defaultMap(postValue, preValue, opFn);
        }
        py::tuple result(out.size());
        for (size_t i = 0; i < out.size(); ++i) {
          result[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(out[i]));
        }
        return result;
      },
      py::arg("post"),
      py::arg("pre"),
      py::arg("op") = py::none(),
      "DifferenceMonitor's default map_: op_ (default post - pre) "
      "element-wise over tuples (zip) or once, a None side counting as zeros");

  m.def(
      "_attribute_path_parts",
      [](const std::string& path) {
        py::list out;
        const nn::AttributePath parsed(path);
        for (const std::string& part : parsed.parts()) {
          const char* kind = "key";
          switch (nn::pathPartKind(part)) {
            case nn::PathPartKind::Attribute:
              kind = "attribute";
              break;
            case nn::PathPartKind::Index:
              kind = "index";
              break;
            case nn::PathPartKind::Key:
              break;
          }
          out.append(py::make_tuple(kind, part));
        }
        return out;
      },
      py::arg("path"),
      "[(kind, text), ...] of a dotted attribute path, kind being "
      "'attribute', 'index' (ModuleList/Sequential) or 'key' (ModuleDict); "
      "ValueError for an empty path or part");

  m.def(
      "_difference_monitor_hooks",
      // The declared type names the pair in the stub: torch 2.13's pybind11
      // (3.0.4) infers it from make_tuple, torch 2.11's (3.0.1) only "tuple".
      [](py::str key) -> py::typing::Tuple<py::object, py::object> {
        PyObject* before = PyCFunction_NewEx(&gEagerBeforeDef, key.ptr(), nullptr);
        if (before == nullptr) {
          throw py::error_already_set();
        }
        py::object beforeFn = py::reinterpret_steal<py::object>(before);
        PyObject* after = PyCFunction_NewEx(&gEagerAfterDef, key.ptr(), nullptr);
        if (after == nullptr) {
          throw py::error_already_set();
        }
        return py::make_tuple(
            beforeFn, py::reinterpret_steal<py::object>(after));
      },
      py::arg("key"),
      "(before(module), after(module, output)): the C functions the eager "
      "hooks call; they find the monitor in the module attribute `key`");
}

} // namespace torch_monitor::python
