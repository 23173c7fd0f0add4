// Stat's hand-written hot path (its benchmark: benchmarks/python/
// bench_python.py, "Stat.add"), and the process-wide stat functions. The
// rest of the Python Stat is derived from its TorchScript schema
// (torch_monitor/_faces.py).

#include "face.h"
#include "py_common.h"
#include "internals.h"

#include <torch/csrc/autograd/python_variable.h>

#include <torch_monitor/script/stat.h>

namespace torch_monitor::python {
namespace {

using script::ScriptStat;

// add(v) as a raw CPython vectorcall method: a pybind11 method costs
// ~90 ns a call, this ~15 ns, which is most of Stat.add's cost from Python.
// `v` (the schema's name, torch.monitor's) may be given by keyword.
template <typename T>
PyObject* fastAdd(
    PyObject* self,
    PyObject* const* args,
    Py_ssize_t nargs,
    PyObject* kwnames) {
  PyObject* arg = nullptr;
  if (!fastCallArguments(
          std::is_same_v<T, double> ? "Stat.add" : "IntStat.add",
          {"v"},
          args,
          nargs,
          kwnames,
          &arg)) {
    return nullptr;
  }
  Face* face = faceOf(self);
  if (face == nullptr) {
    return nullptr;
  }
  Stat<T>& stat = face->holder<ScriptStat<T>>()->stat();
  constexpr bool kFloat = std::is_same_v<T, double>;
  const bool exact = kFloat ? PyFloat_CheckExact(arg) : PyLong_CheckExact(arg);
  if (!exact && THPVariable_Check(arg)) { // every element is one sample
    const at::Tensor& tensor = THPVariable_Unpack(arg);
    if (tensor.unsafeGetTensorImpl()->is_python_dispatch() &&
        tensor.has_storage() && tensor.storage().data() == nullptr &&
        tensor.numel() > 0) {
      // A FakeTensor: non-strict torch.export (or a tracer) runs this call
      // with tensors that hold no data. Only a Stat the traced module holds
      // as an attribute is seen by the tracer and recorded in the graph.
      PyErr_Format(
          PyExc_RuntimeError,
          "%s '%s': add() got a tensor that is being traced (a FakeTensor, "
          "as torch.export runs forward): the Stat is not an attribute of "
          "the traced module, so the call cannot be recorded. Hold it as "
          "one (self.stat = torch_monitor.Stat(...) in __init__) and export "
          "again.",
          kFloat ? "Stat" : "IntStat",
          stat.name().c_str());
      return nullptr;
    }
    return noneOrPythonError([&]() { stat.add(tensor); });
  }
  T v;
  if constexpr (kFloat) {
    v = exact ? PyFloat_AS_DOUBLE(arg) : PyFloat_AsDouble(arg);
  } else {
    v = PyLong_AsLongLong(arg);
  }
  if (v == T(-1) && PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      // Name the stat: the bare "must be real number, not str" of CPython
      // does not say which add went wrong.
      PyErr_Clear();
      PyErr_Format(
          PyExc_TypeError,
          "%s '%s': add() takes %s or a tensor, got %s",
          kFloat ? "Stat" : "IntStat",
          stat.name().c_str(),
          kFloat ? "a float or an int" : "an int",
          Py_TYPE(arg)->tp_name);
    }
    return nullptr;
  }
  return noneOrPythonError([&]() { stat.add(v); });
}

template <typename T>
void installAdd(py::handle cls) {
  addFastMethod(
      cls, "add", &fastAdd<T>,
      "add($self, value)\n--\n\nAdds a sample: a number, or a tensor whose every element "
      "is one sample (on any device; an accelerator tensor is not read until "
      "the window closes)");
}

} // namespace

void initStats(py::module_& m) {
  m.def(
      "_install_stat_add",
      [](py::handle cls) {
        if (cls.attr("_script_class").cast<std::string>() == "IntStat") {
          installAdd<int64_t>(cls);
        } else {
          installAdd<double>(cls);
        }
      },
      py::arg("cls"),
      "Gives the Stat or IntStat face its fast add()");
  m.def(
      "_sync_stat_ranks",
      [](py::handle face, py::handle store, int64_t rank, int64_t worldSize, double deadline) {
        Face* f = faceOf(face.ptr());
        if (f == nullptr) {
          throw py::error_already_set();
        }
        const auto group = groupFromPython(store, rank, worldSize, deadline);
        if (face.attr("_script_class").cast<std::string>() == "IntStat") {
          f->holder<ScriptStat<int64_t>>()->stat().syncRanks(group);
        } else {
          f->holder<ScriptStat<double>>()->stat().syncRanks(group);
        }
      },
      py::arg("stat"),
      py::arg("store"),
      py::arg("rank"),
      py::arg("world_size"),
      py::arg("deadline"),
      "Merges the stat's windows across the ranks of a process group (given "
      "by its Store, this rank, its size and the deadline)");
  m.def(
      "_close_all_stats",
      &closeAllStats,
      // Python handlers take the GIL themselves; closing a window may wait
      // for threads that add without it.
      py::call_guard<py::gil_scoped_release>(),
      "Logs the open window of every live Stat (called at interpreter exit, "
      "before Python handlers are removed)");
}

} // namespace torch_monitor::python
