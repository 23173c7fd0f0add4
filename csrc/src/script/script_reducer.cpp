#include <torch_monitor/script/script_reducer.h>

#include <torch_monitor/script/registration.h>

namespace torch_monitor::script {

void registerReducerClasses(torch::Library& m) {}

} // namespace torch_monitor::script
