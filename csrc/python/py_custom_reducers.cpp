// Reducers written in Python (torch_monitor.FoldReducer subclasses): the
// two ways their code reaches the C++ monitors.
//
// * A subclass that defines fold() / interpolate() keeps a C++ FoldReducer
//   (history, view, thread safety) whose fold calls the Python method:
//   ReducerHandle.set_python_fold (py_reducers.cpp) installs it.
// * A subclass that overrides forward() (or a reducer with forward hooks)
//   must be called as a module: _python_reducer() wraps the Python object in
//   a C++ Reducer that does so, and the monitor feeds that instead of the
//   C++ reducer. torch_monitor.reducers decides which one a monitor gets, so
//   built-in reducers keep the direct C++ path.

#include "py_common.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/api/object.h>
#include <torch/csrc/utils/pybind.h>

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

py::object wrap(const at::Tensor& t) {
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
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
    py::tuple args(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      args[i] = wrap(inputs[i]);
    }
    reducer_->get()(*args);
  }
  std::optional<at::Tensor> peek() const override {
    py::gil_scoped_acquire gil;
    return optionalTensor(reducer_->get().attr("peek")(), "peek");
  }
  std::optional<at::Tensor> dump() const override {
    py::gil_scoped_acquire gil;
    return optionalTensor(reducer_->get().attr("dump")(), "dump");
  }
  std::optional<at::Tensor> view(const at::Tensor& time, double tolerance)
      const override {
    py::gil_scoped_acquire gil;
    return optionalTensor(
        reducer_->get().attr("view")(wrap(time), tolerance), "view");
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
}

} // namespace torch_monitor::python
