#include "py_common.h"

namespace torch_monitor::python {

void initReducers(py::module_& m) {}

} // namespace torch_monitor::python
