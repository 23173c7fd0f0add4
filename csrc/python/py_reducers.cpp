#include "py_common.h"
#include "internals.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/api/object.h>
#include <torch/csrc/utils/pybind.h>

#include <torch_monitor/reducers/criterion.h>
#include <torch_monitor/reducers/fold_reducer.h>
#include <torch_monitor/reducers/kinds.h>
#include <torch_monitor/script/reducer.h>

namespace torch_monitor::python {
namespace {

using script::ScriptReducer;

at::Tensor tensorFrom(py::handle value, const char* what) {
  if (!THPVariable_Check(value.ptr())) {
    throw py::type_error(
        std::string(what) + " must be a torch.Tensor, got " +
        Py_TYPE(value.ptr())->tp_name);
  }
  return THPVariable_Unpack(value.ptr());
}

// The C++ reducer inside a torch.classes.torch_monitor.Reducer object, for
// the Python wrappers' hot calls (forward, peek) and what torch.classes
// cannot carry (a Python callable as criterion).
// Thread safety: as FoldReducer (any thread); a Python criterion is called
// with the GIL taken by the calling thread.
class ReducerHandle {
 public:
  explicit ReducerHandle(const torch::jit::Object& scriptObject) {
    c10::IValue value(scriptObject._ivalue());
    if (value.type()->str() !=
        c10::getCustomClassType<c10::intrusive_ptr<ScriptReducer>>()->str()) {
      throw py::type_error(
          "expected a torch.classes.torch_monitor.Reducer, got " +
          value.type()->str());
    }
    holder_ = value.toCustomClass<ScriptReducer>();
    reducer_ = &holder_->fold();
  }

  void forward(const py::args& args) {
    std::vector<at::Tensor> inputs;
    inputs.reserve(args.size());
    for (py::handle arg : args) {
      inputs.push_back(tensorFrom(arg, "every reducer input"));
    }
    reducer_->forward(inputs);
  }
  std::optional<at::Tensor> peek() const {
    return reducer_->peek();
  }
  std::optional<at::Tensor> dump() const {
    return reducer_->dump();
  }
  std::optional<at::Tensor> view(py::handle time, double tolerance) const {
    if (THPVariable_Check(time.ptr())) {
      return reducer_->view(THPVariable_Unpack(time.ptr()), tolerance);
    }
    if (PyFloat_Check(time.ptr()) ||
        (PyLong_Check(time.ptr()) && !PyBool_Check(time.ptr()))) {
      return reducer_->view(time.cast<double>(), tolerance);
    }
    throw py::type_error(
        std::string("view: time must be a float or a torch.Tensor, got ") +
        Py_TYPE(time.ptr())->tp_name);
  }

  // A Python callable (tensor -> bool tensor) as criterion. It runs with the
  // GIL, also when scripted code calls forward.
  void setPythonCriterion(py::object fn) {
    if (!PyCallable_Check(fn.ptr())) {
      throw py::type_error(
          std::string("a criterion must be callable, got ") +
          Py_TYPE(fn.ptr())->tp_name);
    }
    const std::string description = py::repr(fn).cast<std::string>();
    auto callable = std::make_shared<PyRef>(std::move(fn));
    reducer_->setCriterion(Criterion::custom(
        [callable](const at::Tensor& x) -> at::Tensor {
          py::gil_scoped_acquire gil;
          py::object arg =
              py::reinterpret_steal<py::object>(THPVariable_Wrap(x));
          if (!arg) {
            throw py::error_already_set();
          }
          py::object out = callable->get()(arg);
          if (!THPVariable_Check(out.ptr())) {
            throw py::type_error(
                "a criterion must return a bool torch.Tensor, got " +
                std::string(Py_TYPE(out.ptr())->tp_name));
          }
          return THPVariable_Unpack(out.ptr());
        },
        description));
  }
  // `fold(inputs, state)` (a list of tensors and the previous state or
  // None) and `interpolate(prev, next, sample_at, step_time)` (or None for
  // the kind's) replace the kind's: a Python reducer subclass's own methods.
  // They run with the GIL, also when scripted code calls forward.
  void setPythonFold(
      py::object fold,
      py::object interpolate,
      std::string description) {
    auto foldFn = std::make_shared<PyRef>(std::move(fold));
    auto custom = std::make_shared<FoldReducer::CustomFold>();
    custom->description = description;
    custom->fold = [foldFn, description](
                       const std::vector<at::Tensor>& inputs,
                       const std::optional<at::Tensor>& state) {
      py::gil_scoped_acquire gil;
      py::list args;
      for (const at::Tensor& x : inputs) {
        args.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(x)));
      }
      py::object previous = state
          ? py::reinterpret_steal<py::object>(THPVariable_Wrap(*state))
          : py::none();
      return tensorFrom(
          foldFn->get()(args, previous), (description + ".fold's result").c_str());
    };
    if (!interpolate.is_none()) {
      auto interpolateFn = std::make_shared<PyRef>(std::move(interpolate));
      custom->interpolate = [interpolateFn, description](
                                const at::Tensor& prev,
                                const at::Tensor& next,
                                const at::Tensor& sampleAt,
                                double stepTime) {
        py::gil_scoped_acquire gil;
        const auto wrap = [](const at::Tensor& t) {
          return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
        };
        return tensorFrom(
            interpolateFn->get()(wrap(prev), wrap(next), wrap(sampleAt), stepTime),
            (description + ".interpolate's result").c_str());
      };
    }
    reducer_->setCustomFold(std::move(custom));
  }
  void setBuiltinCriterion(const std::string& name, double threshold) {
    reducer_->setCriterion(Criterion::builtin(name, threshold));
  }

 private:
  c10::intrusive_ptr<ScriptReducer> holder_;
  FoldReducer* reducer_ = nullptr; // &holder_->fold(), cached
};

// reducerKindTable() as plain data, from which torch_monitor.reducers builds
// its classes: a list of {"name", "params", "takes_criterion", "arity"},
// each parameter {"name", "default" (None when required or unset),
// "required", "unsettable", "fixed", "check" (the allowed values in words)}.
py::list reducerKindsAsData() {
  py::list kinds;
  for (const ReducerKind& kind : reducerKindTable()) {
    py::list params;
    for (const ParamSpec& spec : kind.params) {
      py::dict param;
      param["name"] = spec.name;
      param["default"] = spec.defaultValue ? py::cast(*spec.defaultValue)
                                           : py::none();
      param["required"] = !spec.defaultValue && !spec.unsettable;
      param["unsettable"] = spec.unsettable;
      param["fixed"] = spec.fixed;
      param["check"] = describeCheck(spec.check);
      params.append(param);
    }
    py::dict entry;
    entry["name"] = kind.name;
    entry["params"] = params;
    entry["takes_criterion"] = kind.takesCriterion();
    entry["arity"] = kind.arity();
    kinds.append(entry);
  }
  return kinds;
}

} // namespace

void initReducers(py::module_& m) {
  m.def(
      "_reducer_kinds",
      &reducerKindsAsData,
      "the C++ table of reducer kinds (kinds.h) as plain data");
  // torch_monitor.Criterion is the Python name of the C++ built-in
  // criterion: its names and its evaluation come from here.
  m.def(
      "_criterion_names",
      [] { return Criterion::builtinNames(); },
      "the names of the built-in criteria");
  m.def(
      "_apply_criterion",
      [](const std::string& name, double threshold, const at::Tensor& x) {
        return Criterion::builtin(name, threshold)(x);
      },
      py::arg("name"),
      py::arg("threshold"),
      py::arg("x"),
      "the built-in criterion `name` applied to x element-wise");
  auto handle = py::class_<ReducerHandle>(
      m,
      "_ReducerHandle",
      "Direct access to the C++ reducer of a "
      "torch.classes.torch_monitor.Reducer (used by torch_monitor.reducers)")
      .def(py::init<const torch::jit::Object&>(), py::arg("script_reducer"))
      .def("forward", &ReducerHandle::forward)
      .def("peek", &ReducerHandle::peek)
      .def("dump", &ReducerHandle::dump)
      .def(
          "view",
          &ReducerHandle::view,
          py::arg("time"),
          py::arg("tolerance") = 1e-7)
      .def(
          "set_python_criterion",
          &ReducerHandle::setPythonCriterion,
          py::arg("fn"))
      .def(
          "set_python_fold",
          &ReducerHandle::setPythonFold,
          py::arg("fold"),
          py::arg("interpolate"),
          py::arg("description"))
      .def(
          "set_builtin_criterion",
          &ReducerHandle::setBuiltinCriterion,
          py::arg("name"),
          py::arg("threshold") = 0.0)
      // An internal view of a reducer: pickling it would abort the process
      // (protocols 0 and 1) or lose its reducer; the reducer module pickles.
      .def("__reduce_ex__", [](const ReducerHandle&, int) -> py::object {
        throw py::type_error(
            "a _ReducerHandle cannot be pickled; pickle the torch_monitor "
            "reducer that owns it");
      });
  refuseUninitialisedUse(handle);
}

} // namespace torch_monitor::python
