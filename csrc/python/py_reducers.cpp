// The reducer kinds and the built-in criterion as Python sees them: the
// data torch_monitor.reducers builds its classes from. (Reducers' Python
// callbacks are in py_custom_reducers.cpp; the reducer object itself is a
// face made from its TorchScript schema.)

#include "py_common.h"

#include <string>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <torch_monitor/reducers/criterion.h>
#include <torch_monitor/reducers/kinds.h>

namespace torch_monitor::python {
namespace {

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
}

} // namespace torch_monitor::python
