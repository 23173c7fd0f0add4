#include "py_common.h"

#include <c10/util/Exception.h>

namespace torch_monitor::python {

void setPythonError(const std::exception& e) {
  if (PyErr_Occurred()) {
    return;
  }
  if (const auto* c10Error = dynamic_cast<const c10::Error*>(&e)) {
    PyObject* type = PyExc_RuntimeError;
    if (dynamic_cast<const c10::ValueError*>(&e)) {
      type = PyExc_ValueError;
    } else if (dynamic_cast<const c10::TypeError*>(&e)) {
      type = PyExc_TypeError;
    } else if (dynamic_cast<const c10::IndexError*>(&e)) {
      type = PyExc_IndexError;
    }
    PyErr_SetString(type, c10Error->what_without_backtrace());
    return;
  }
  PyErr_SetString(PyExc_RuntimeError, e.what());
}

} // namespace torch_monitor::python

PYBIND11_MODULE(_C, m) {
  namespace tp = torch_monitor::python;
  m.doc() = "Python binding of libtorch_monitor (load it through torch_monitor)";
  pybind11::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) {
        std::rethrow_exception(p);
      }
    } catch (const c10::Error& e) {
      tp::setPythonError(e);
    }
  });
  tp::initAggregation(m);
  tp::initEvent(m);
  tp::initHandlers(m);
  tp::initFaces(m);
  tp::initStats(m);
  tp::initWaitCounters(m);
  tp::initReducers(m);
  tp::initCustomReducers(m);
  tp::initMonitors(m);
  tp::initMonitorListing(m);
  tp::initTesting(m);
  tp::initSinks(m);
  tp::initProcessRank(m);
  tp::initBackgroundWarnings();
  tp::initRankSync(m);
  tp::initExit(m);
}
