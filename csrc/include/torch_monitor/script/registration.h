#pragma once

#include <torch/library.h>

// The pieces of the one TORCH_LIBRARY(torch_monitor, m) block (in
// registration.cpp); classes must be defined before ops that take them.
// Each is defined with its object, in script/<object>.cpp; the step ops,
// which have no object, in registration.cpp.
namespace torch_monitor::script {
void registerStatClasses(torch::Library& m);
void registerWaitCounterClasses(torch::Library& m);
void registerPytorchCounterClasses(torch::Library& m);
void registerEventClassAndOps(torch::Library& m);
void registerStepOps(torch::Library& m); // after the Event ops: shares their fakes' module
void registerReducerClasses(torch::Library& m);
void registerMonitorClasses(torch::Library& m); // after reducers: takes them
void registerSinkClasses(torch::Library& m); // after the Event class
void registerWatch(torch::Library& m); // after the sinks: takes a writer (script/watch.h)
} // namespace torch_monitor::script
