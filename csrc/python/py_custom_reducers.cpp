// Reducers written in Python (torch_monitor.FoldReducer subclasses): the
// two ways their code reaches the C++ monitors.
//
// * A subclass that defines fold() / interpolate() keeps a C++ FoldReducer
//   (history, view, thread safety) whose fold calls the Python method:
//   _set_python_fold installs it (as _set_python_criterion installs a Python
//   criterion), onto the reducer object's C++ setters.
// * A subclass that overrides forward() (or a reducer with forward hooks)
//   must be called as a module: _python_reducer() wraps the Python object in
//   a C++ Reducer that does so, and the monitor feeds that instead of the
//   C++ reducer. torch_monitor.reducers decides which one a monitor gets, so
//   built-in reducers keep the direct C++ path.

#include "face.h"
#include "py_common.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/api/object.h>
#include <torch/csrc/utils/pybind.h>

#include <torch_monitor/reducers/criterion.h>
#include <torch_monitor/reducers/fold_reducer.h>
#include <torch_monitor/reducers/reducer.h>
#include <torch_monitor/script/reducer.h>

namespace torch_monitor::python {
namespace {

// A tensor or None returned by a Python reducer's peek/dump/view.
std::optional<at::Tensor> optionalTensor(const py::object& out, const char* what) {
  if (out.is_none()) {
    return std::nullopt;
  }
  if (!THPVariable_Check(out.ptr())) {
    throw py::type_error(
        std::string("a Python reducer's ") + what +
        "() must return a torch.Tensor or None, got " +
        Py_TYPE(out.ptr())->tp_name);
  }
  return THPVariable_Unpack(out.ptr());
}

FoldReducer& foldOf(py::handle reducer) {
  return scriptObjectOf<script::ScriptReducer>(reducer, "reducer")->fold();
}

// A Python callable (tensor -> bool tensor) as `reducer`'s criterion. It
// runs with the GIL, also when scripted code calls forward.
void setPythonCriterion(py::handle reducer, py::object fn) {
  FoldReducer& fold = foldOf(reducer);
  if (!PyCallable_Check(fn.ptr())) {
    throw py::type_error(
        std::string("a criterion must be callable, got ") +
        Py_TYPE(fn.ptr())->tp_name);
  }
  const std::string description = py::repr(fn).cast<std::string>();
  auto callable = std::make_shared<PyRef>(std::move(fn));
  fold.setCriterion(Criterion::custom(
      [callable](const at::Tensor& x) -> at::Tensor {
        py::gil_scoped_acquire gil;
        return tensorFromPython(
            callable->get()(py::cast(x)), "a criterion's result (a bool tensor)");
      },
      description));
}

// `fold(inputs, state)` (a list of tensors and the previous state or None)
// and `interpolate(prev, next, sample_at, step_time)` (each None for the
// kind's) replace the kind's: a Python reducer subclass's own methods. They
// run with the GIL, also when scripted code calls forward.
void setPythonFold(
    py::handle reducer,
    py::object fold,
    py::object interpolate,
    std::string description) {
  FoldReducer& target = foldOf(reducer);
  auto custom = std::make_shared<FoldReducer::CustomFold>();
  custom->description = description;
  if (!fold.is_none()) { // None: the kind's (a built-in reducer's subclass)
    auto foldFn = std::make_shared<PyRef>(std::move(fold));
    custom->fold = [foldFn, description](
                       const std::vector<at::Tensor>& inputs,
                       const std::optional<at::Tensor>& state) {
      py::gil_scoped_acquire gil;
      // std::nullopt is None, a list of tensors a Python list.
      return tensorFromPython(
          foldFn->get()(inputs, state), description + ".fold's result");
    };
  }
  if (!interpolate.is_none()) {
    auto interpolateFn = std::make_shared<PyRef>(std::move(interpolate));
    custom->interpolate = [interpolateFn, description](
                              const at::Tensor& prev,
                              const at::Tensor& next,
                              const at::Tensor& sampleAt,
                              double stepTime) {
      py::gil_scoped_acquire gil;
      return tensorFromPython(
          interpolateFn->get()(prev, next, sampleAt, stepTime),
          description + ".interpolate's result");
    };
  }
  target.setCustomFold(std::move(custom));
}

// A torch_monitor reducer (an nn.Module) fed through Python: forward() is
// `reducer(*inputs)`, so an overridden forward and forward hooks run as in
// inferno; the reading methods call the reducer's own.
// Thread safety: each call takes the GIL; the Python reducer decides the
// rest (the built-in part it calls is thread-safe).
class PythonReducer final : public Reducer {
 public:
  explicit PythonReducer(py::object reducer)
      : reducer_(std::make_shared<PyRef>(std::move(reducer))) {}

  void forward(const std::vector<at::Tensor>& inputs) override {
    py::gil_scoped_acquire gil;
    reducer_->get()(*py::tuple(py::cast(inputs)));
  }
  std::optional<at::Tensor> peek() const override {
    py::gil_scoped_acquire gil;
    return optionalTensor(reducer_->get().attr("peek")(), "peek");
  }
  const py::object& module() const noexcept {
    return reducer_->get();
  }
  std::optional<at::Tensor> dump() const override {
    py::gil_scoped_acquire gil;
    return optionalTensor(reducer_->get().attr("dump")(), "dump");
  }
  std::optional<at::Tensor> view(const at::Tensor& time, double tolerance)
      const override {
    py::gil_scoped_acquire gil;
    return optionalTensor(
        reducer_->get().attr("view")(time, tolerance), "view");
  }
  void clear(bool keepshape) override {
    py::gil_scoped_acquire gil;
    reducer_->get().attr("clear")(py::arg("keepshape") = keepshape);
  }

 private:
  std::shared_ptr<PyRef> reducer_;
};

} // namespace

void initCustomReducers(py::module_& m) {
  m.def(
      "_set_python_criterion",
      &setPythonCriterion,
      py::arg("reducer"),
      py::arg("fn"),
      "makes a Python callable (tensor -> bool tensor) the criterion of a "
      "torch.classes.torch_monitor.Reducer");
  m.def(
      "_set_python_fold",
      &setPythonFold,
      py::arg("reducer"),
      py::arg("fold"),
      py::arg("interpolate"),
      py::arg("description"),
      "makes a Python reducer's fold(inputs, state) and interpolate (each "
      "None for the kind's) those of a torch.classes.torch_monitor.Reducer");
  m.def(
      "_python_reducer",
      [](py::object reducer) {
        return torch::jit::Object(
            c10::IValue(c10::make_intrusive<script::ScriptReducer>(
                            std::make_shared<PythonReducer>(std::move(reducer))))
                .toObject());
      },
      py::arg("reducer"),
      "a torch.classes.torch_monitor.Reducer whose forward calls "
      "reducer(*inputs) in Python (for reducers whose forward is overridden "
      "or hooked); it cannot be saved");
  m.def(
      "_python_reducer_module",
      [](py::handle reducer) -> py::object {
        const auto* python = dynamic_cast<const PythonReducer*>(
            scriptObjectOf<script::ScriptReducer>(reducer, "reducer")
                ->reducer()
                .get());
        return python == nullptr ? py::none() : python->module();
      },
      py::arg("reducer"),
      "the reducer module a _python_reducer() object calls, else None");
}

} // namespace torch_monitor::python
