#include <torch_monitor/script/registration.h>

// The only TORCH_LIBRARY block of the project: loading libtorch_monitor.so
// (torch.ops.load_library, dlopen, or linking it) registers everything.
TORCH_LIBRARY(torch_monitor, m) {
  torch_monitor::script::registerStatClasses(m);
  torch_monitor::script::registerWaitCounterClasses(m);
  torch_monitor::script::registerEventClassAndOps(m);
  torch_monitor::script::registerStepOps(m);
  torch_monitor::script::registerReducerClasses(m);
  torch_monitor::script::registerMonitorClasses(m);
  torch_monitor::script::registerSinkClasses(m);
  torch_monitor::script::registerWatch(m);
}
