// The reducer kinds and the built-in criterion as Python sees them (the
// data torch_monitor.reducers builds its classes from), and the reducer
// object's forward at METH_FASTCALL cost: every call of a Python reducer module
// goes through it. (Reducers' Python callbacks are in py_custom_reducers.cpp;
// the reducer object itself is a face made from its TorchScript schema.)

#include "face.h"
#include "internals.h"
#include "py_common.h"

#include <string>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <torch_monitor/reducers/criterion.h>
#include <torch_monitor/reducers/kinds.h>
#include <torch_monitor/script/reducer.h>

namespace torch_monitor::python {
namespace {

// reducer.forward(inputs): the TorchScript method, without the generic
// call's schema matching (about 2.5 us of a 11 us EMAReducer step;
// benchmarks/python/bench_difference_monitor.py, "reducer call").
PyObject* fastForward(
    PyObject* self,
    PyObject* const* args,
    Py_ssize_t nargs,
    PyObject* kwnames) {
  PyObject* inputs = nullptr;
  if (!fastCallArguments("Reducer.forward", {"inputs"}, args, nargs, kwnames, &inputs)) {
    return nullptr;
  }
  Face* face = faceOf(self);
  if (face == nullptr) {
    return nullptr;
  }
  if (!PyList_Check(inputs) && !PyTuple_Check(inputs)) {
    PyErr_Format(
        PyExc_TypeError,
        "Reducer.forward() argument 'inputs' must be a list of torch.Tensor, "
        "got %s",
        Py_TYPE(inputs)->tp_name);
    return nullptr;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(inputs);
  PyObject** items = PySequence_Fast_ITEMS(inputs);
  std::vector<at::Tensor> tensors;
  tensors.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!THPVariable_Check(items[i])) {
      PyErr_Format(
          PyExc_TypeError,
          "Reducer.forward() argument 'inputs' item must be a torch.Tensor, "
          "got %s",
          Py_TYPE(items[i])->tp_name);
      return nullptr;
    }
    tensors.push_back(THPVariable_Unpack(items[i]));
  }
  return noneOrPythonError([&]() {
    face->holder<script::ScriptReducer>()->reducer()->forward(tensors);
  });
}

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
      "_install_reducer_calls",
      [](py::handle cls) {
        addFastMethod(
            cls, "forward", &fastForward,
            "forward($self, inputs)\n--\n\nFolds the inputs of one step into a new state and "
            "records it");
      },
      py::arg("cls"),
      "Gives the reducer object's face its fast forward()");
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
}

} // namespace torch_monitor::python
