#include "py_common.h"

namespace torch_monitor::python {

void initMonitors(py::module_& m) {}

} // namespace torch_monitor::python
