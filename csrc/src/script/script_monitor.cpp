#include <torch_monitor/script/registration.h>

namespace torch_monitor::script {

void registerMonitorClasses(torch::Library& m) {}

} // namespace torch_monitor::script
