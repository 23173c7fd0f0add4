// What the monitors' Python face needs beyond its schema: the hot paths and
// the Python callables.
//
// The monitor object is the face of torch.classes.torch_monitor.DifferenceMonitor
// (made by torch_monitor/_faces.py like every face). A monitored module
// holds it as an attribute. Its hooks are generated Python functions
// (torch_monitor/monitors.py) so TorchScript can compile them; when not
// scripting they make one call into this file, which reads the module's
// mode, resolves the attribute path, converts the value and runs
// DifferenceMonitor::before/after, all in C++ (the eager hooks, and the
// face's own before/after/observe, installed over the derived ones). The
// Python filter_/map_/op_ are set on the C++ monitor after construction
// (_set_monitor_callables) and read back from it.

#include "face.h"
#include "py_common.h"
#include "internals.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/api/object.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <torch_monitor/nn/attribute_path.h>
#include <torch_monitor/script/difference_monitor.h>

namespace torch_monitor::python {
namespace {

using script::ScriptDifferenceMonitor;

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

// ------------------------------------------------- Python filter_/map_/op_

// Each wrapper takes the GIL itself: scripted forward() calls run without
// it. A Python exception propagates as py::error_already_set, and the eager
// hook re-raises the very exception. Each keeps the callable it was made
// from, which _monitor_callables reads back (std::function::target).
// A one-hook monitor's (InputMonitor, ...) filter_ and map_ take the one
// value observed, as in inferno; a DifferenceMonitor's take (post, pre).

// The callable's arguments: (value) or (post, pre), converted as TorchScript
// hands values to Python (a wrapped PythonValue is its object again).
py::tuple callArguments(bool observed, const c10::IValue& post, const c10::IValue& pre) {
  if (observed) {
    return py::make_tuple(torch::jit::toPyObject(post));
  }
  return py::make_tuple(torch::jit::toPyObject(post), torch::jit::toPyObject(pre));
}

struct PythonFilter {
  std::shared_ptr<PyRef> fn;
  bool observed; // a one-hook monitor's: fn(value)
  bool operator()(const c10::IValue& post, const c10::IValue& pre) const {
    py::gil_scoped_acquire gil;
    py::object result = fn->get()(*callArguments(observed, post, pre));
    const int truth = PyObject_IsTrue(result.ptr());
    if (truth < 0) {
      throw py::error_already_set();
    }
    return truth == 1;
  }
};

struct PythonMap {
  std::shared_ptr<PyRef> fn;
  bool observed; // a one-hook monitor's: fn(value)
  std::string name; // the monitor's, for errors
  std::vector<at::Tensor> operator()(
      const c10::IValue& post,
      const c10::IValue& pre) const {
    py::gil_scoped_acquire gil;
    py::object result = fn->get()(*callArguments(observed, post, pre));
    const std::string where = "DifferenceMonitor '" + name + "'";
    TORCH_CHECK_TYPE(
        PyTuple_Check(result.ptr()) || PyList_Check(result.ptr()),
        where,
        ": map_ must return a tuple of tensors (the reducer's inputs, e.g. "
        "`(post - pre,)`), got ",
        Py_TYPE(result.ptr())->tp_name);
    std::vector<at::Tensor> inputs;
    for (py::handle item : result) {
      inputs.push_back(tensorFromPython(item, where + ": every element map_ returns"));
    }
    return inputs;
  }
};

struct PythonOp {
  std::shared_ptr<PyRef> fn;
  std::string name; // the monitor's, for errors
  at::Tensor operator()(const at::Tensor& post, const at::Tensor& pre) const {
    py::gil_scoped_acquire gil;
    py::object result = fn->get()(post, pre);
    return tensorFromPython(
        result, "DifferenceMonitor '" + name + "': op_'s result");
  }
};

// The Python callable a wrapper was made from, or None.
template <class Wrapper, class Function>
py::object callableOf(const Function& function) {
  const Wrapper* wrapper = function.template target<Wrapper>();
  return wrapper == nullptr ? py::none() : wrapper->fn->get();
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

PyTypeObject* gMonitorType = nullptr; // the face class of DifferenceMonitor
PyTypeObject* gModuleType = nullptr; // torch.nn.Module
PyObject* gTrainingKey = nullptr;

// The C++ monitor of a monitor face (the face caches the custom-class
// object: two pointer reads, cheap enough for the hooks); nullptr with a
// TypeError set for one never initialised.
DifferenceMonitor* monitorOf(PyObject* face) {
  Face* f = faceOf(face);
  return f == nullptr ? nullptr : &f->holder<ScriptDifferenceMonitor>()->monitor();
}

DifferenceMonitor& monitorOf(py::handle face) {
  return scriptObjectOf<ScriptDifferenceMonitor>(face, "monitor")->monitor();
}

// What the eager hooks of one monitor are bound to: the module attribute
// that holds the monitor (so a deep copy of the module reaches its own copy
// of the monitor) and the monitor's attribute path, split and interned once.
// Thread safety: immutable; used with the GIL held.
struct HookBinding {
  py::object key;
  std::string path;
  std::vector<py::object> parts;
};

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
    const HookBinding& self,
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
      self.path + "' does not resolve on " +
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
PyObject* resolvePath(PyObject* module, const HookBinding& self) {
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

// The monitor method a hook runs.
enum class Hook { Before, After, Observe };

// Runs `which` of `monitor` on a Python value: None, or nullptr with the
// error set. Needs the GIL.
PyObject* runHook(DifferenceMonitor& monitor, Hook which, PyObject* value, bool training) {
  return noneOrPythonError([&]() {
    const c10::IValue v = valueFromPython(value, monitor.name());
    if (which == Hook::Before) {
      monitor.before(v, training);
    } else if (which == Hook::After) {
      monitor.after(v, training);
    } else {
      monitor.observe(v, training);
    }
  });
}

constexpr const char* kBindingCapsule = "torch_monitor hook binding";

// The body of the eager hooks, bound to a capsule of their HookBinding.
PyObject* runEagerHook(PyObject* capsule, PyObject* module, Hook which) {
  const auto* binding = static_cast<const HookBinding*>(
      PyCapsule_GetPointer(capsule, kBindingCapsule));
  if (binding == nullptr) {
    return nullptr;
  }
  PyObject* key = binding->key.ptr();
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
  DifferenceMonitor* monitor = training < 0 ? nullptr : monitorOf(core);
  PyObject* result = nullptr;
  if (monitor == nullptr) {
    // error set
  } else if (!monitor->runsWhen(training == 1)) {
    // No attribute read; but before()/after() still drop this thread's
    // capture, as the scripted hooks' calls do, so that a capture never
    // pairs with a call made in the other mode.
    result = which == Hook::Observe ? Py_NewRef(Py_None)
                                    : runHook(*monitor, which, Py_None, training == 1);
  } else if (PyObject* value = resolvePath(module, *binding)) {
    result = runHook(*monitor, which, value, training == 1);
    Py_DECREF(value);
  }
  Py_DECREF(core);
  return result;
}

// before_hook(module)
PyObject* eagerBefore(PyObject* binding, PyObject* module) {
  return runEagerHook(binding, module, Hook::Before);
}

// after_hook(module[, output]): the output is not needed, but the generated
// hook passes it so the call matches the hook's own arguments.
PyObject* eagerAfter(PyObject* binding, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 2) {
    PyErr_SetString(
        PyExc_TypeError, "the after hook takes (module[, output])");
    return nullptr;
  }
  return runEagerHook(binding, args[0], Hook::After);
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

// core.before/after/observe(value, training): the TorchScript methods,
// callable from Python at METH_FASTCALL cost.
template <Hook Which>
PyObject* fastCall(
    PyObject* obj,
    PyObject* const* args,
    Py_ssize_t nargs,
    PyObject* kwnames) {
  PyObject* given[2];
  if (!fastCallArguments(
          Which == Hook::Before     ? "before"
              : Which == Hook::After ? "after"
                                     : "observe",
          {"value", "training"},
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
  DifferenceMonitor* monitor = monitorOf(obj);
  if (monitor == nullptr) {
    return nullptr;
  }
  return runHook(*monitor, Which, given[0], training == 1);
}

// The HookBinding of the eager hooks of the monitor of attribute path
// `path` held in the module attribute `key`.
std::unique_ptr<HookBinding> makeBinding(py::str key, const std::string& path) {
  auto binding = std::make_unique<HookBinding>();
  binding->key = std::move(key);
  binding->path = path;
  // ValueError for an empty path or part, with AttributePath's message.
  const nn::AttributePath parsed(path);
  for (const std::string& part : parsed.parts()) {
    PyObject* interned = PyUnicode_InternFromString(part.c_str());
    if (interned == nullptr) {
      throw py::error_already_set();
    }
    binding->parts.push_back(py::reinterpret_steal<py::object>(interned));
  }
  return binding;
}

// makeBinding's, as the capsule the eager hooks are bound to.
py::object hookBinding(py::str key, const std::string& path) {
  std::unique_ptr<HookBinding> binding = makeBinding(std::move(key), path);
  PyObject* capsule = PyCapsule_New(binding.get(), kBindingCapsule, [](PyObject* c) {
    delete static_cast<HookBinding*>(PyCapsule_GetPointer(c, kBindingCapsule));
  });
  if (capsule == nullptr) {
    throw py::error_already_set();
  }
  binding.release(); // the capsule owns it
  return py::reinterpret_steal<py::object>(capsule);
}

// Sets the Python callables of a monitor (None: the default).
void setMonitorCallables(
    py::handle face,
    py::object filter,
    py::object map,
    py::object op) {
  const auto script = scriptObjectOf<ScriptDifferenceMonitor>(face, "monitor");
  DifferenceMonitor& monitor = script->monitor();
  const std::string& name = monitor.name();
  const bool observed = script->kind() != ScriptDifferenceMonitor::kDefaultKind;
  // (Python-written monitors, kind "Monitor", call their own methods.)
  TORCH_CHECK_VALUE(
      !observed || op.is_none(),
      "op_ is a DifferenceMonitor's (how after and before differ); a ",
      script->kind(),
      " takes filter_ and map_ only");
  filter = checkedCallable(std::move(filter), "filter_");
  map = checkedCallable(std::move(map), "map_");
  op = checkedCallable(std::move(op), "op_");
  monitor.setFilter(
      filter.is_none() ? DifferenceMonitor::Filter()
                       : PythonFilter{std::make_shared<PyRef>(filter), observed});
  monitor.setMap(
      map.is_none() ? DifferenceMonitor::Map()
                    : PythonMap{std::make_shared<PyRef>(map), observed, name});
  monitor.setOp(
      op.is_none() ? DifferenceMonitor::Op()
                   : PythonOp{std::make_shared<PyRef>(op), name});
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
  gModuleType = reinterpret_cast<PyTypeObject*>(
      py::object(py::module_::import("torch.nn").attr("Module"))
          .release()
          .ptr());
  gTrainingKey = PyUnicode_InternFromString("training");

  m.def(
      "_install_monitor_calls",
      [](py::handle cls) {
        addFastMethod(
            cls, "before", &fastCall<Hook::Before>,
            "before($self, value, training)\n--\n\nCaptures the value (the pre-hook's part)");
        addFastMethod(
            cls, "after", &fastCall<Hook::After>,
            "after($self, value, training)\n--\n\nFeeds op(value, captured) to the reducer");
        addFastMethod(
            cls, "observe", &fastCall<Hook::Observe>,
            "observe($self, value, training)\n--\n\nFeeds map_(value) to the reducer (the "
            "hook of InputMonitor, OutputMonitor, StateMonitor, "
            "MultiStateMonitor)");
        // What the eager hooks find on a module is checked to be one.
        gMonitorType = reinterpret_cast<PyTypeObject*>(cls.inc_ref().ptr());
      },
      py::arg("cls"),
      "Gives the monitor's face its fast before/after/observe (the "
      "TorchScript methods at METH_FASTCALL cost)");
  m.def(
      "_set_monitor_callables",
      &setMonitorCallables,
      py::arg("monitor"),
      py::arg("filter_"),
      py::arg("map_"),
      py::arg("op_"),
      "Sets a monitor's Python filter_/map_/op_ (None: the default), which "
      "TorchScript cannot hold");
  m.def(
      "_keep_reducer_object",
      [](py::handle face, py::handle reducer) {
        scriptObjectOf<ScriptDifferenceMonitor>(face, "monitor")
            ->keepReducerObject(
                c10::IValue(reducer.cast<const torch::jit::Object&>()._ivalue()));
      },
      py::arg("monitor"),
      py::arg("reducer"),
      "Makes a monitor save the very Reducer object `reducer` (which holds "
      "its reducer), so a module holding both shares one once loaded");
  m.def(
      "_monitor_callables",
      [](py::handle face) {
        const DifferenceMonitor& monitor = monitorOf(face);
        // std::tuple, not py::make_tuple: pybind11 3.0.1 (torch 2.11) types
        // the latter as a bare `tuple`, 3.0.4 by its elements; the stub is one.
        return std::tuple<py::object, py::object, py::object>(
            callableOf<PythonFilter>(monitor.filter()),
            callableOf<PythonMap>(monitor.map()),
            callableOf<PythonOp>(monitor.op()));
      },
      py::arg("monitor"),
      "(filter_, map_, op_): the Python callables of a monitor, None for a "
      "default");
  m.def(
      "_check_monitor_path",
      [](py::handle module, const std::string& path) {
        PyObject* value =
            resolvePath(module.ptr(), *makeBinding(py::str("unused"), path));
        if (value == nullptr) {
          throw py::error_already_set();
        }
        Py_DECREF(value);
      },
      py::arg("module"),
      py::arg("path"),
      "Raises the AttributeError a forward would (naming the path and the "
      "missing part) when the attribute path does not resolve on `module`");

  m.def(
      "_difference_default_map",
      [](py::handle post, py::handle pre, py::object op) {
        const std::string name = "default map_";
        const c10::IValue postValue = valueFromPython(post.ptr(), name);
        const c10::IValue preValue = valueFromPython(pre.ptr(), name);
        DifferenceMonitor::Op opFn;
        if (!checkedCallable(op, "op_").is_none()) {
          opFn = PythonOp{std::make_shared<PyRef>(op), name};
        }
        std::vector<at::Tensor> out;
        {
          py::gil_scoped_release noGil; // a Python op_ takes it back
          out = DifferenceMonitor::defaultMap(postValue, preValue, opFn);
        }
        return py::tuple(py::cast(out));
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
      [](py::str key, const std::string& path)
          -> py::typing::Tuple<py::object, py::object> {
        const py::object binding = hookBinding(std::move(key), path);
        PyObject* before =
            PyCFunction_NewEx(&gEagerBeforeDef, binding.ptr(), nullptr);
        if (before == nullptr) {
          throw py::error_already_set();
        }
        py::object beforeFn = py::reinterpret_steal<py::object>(before);
        PyObject* after =
            PyCFunction_NewEx(&gEagerAfterDef, binding.ptr(), nullptr);
        if (after == nullptr) {
          throw py::error_already_set();
        }
        return py::make_tuple(
            beforeFn, py::reinterpret_steal<py::object>(after));
      },
      py::arg("key"),
      py::arg("path"),
      "(before(module), after(module, output)): the C functions the eager "
      "hooks call; they find the monitor in the module attribute `key` and "
      "read the attribute path `path`");
}

} // namespace torch_monitor::python
