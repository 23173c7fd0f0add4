#include <torch_monitor/script/registration.h>

#include <torch_monitor/step.h>
#include <torch_monitor/watch/recorder.h>

namespace torch_monitor::script {

// Steps have no TorchScript object of their own: their two ops are
// registered here, beside the block.
void registerStepOps(torch::Library& m) {
  // set_step is a side effect that returns nothing: CONSERVATIVE keeps the
  // JIT from removing it as dead code, and torch_monitor._fake (named by
  // set_python_module before these definitions) gives it a fake and marks
  // it an ordered effect, so compiled and exported graphs keep it in order.
  // CompositeExplicitAutograd: one kernel that runs with no tensor argument.
  // None forgets the step (as clearStep), so one op serves Python's
  // set_step(None) too.
  m.def(torch::schema(
      "set_step(int? step) -> ()", c10::AliasAnalysisKind::CONSERVATIVE));
  m.impl(
      "set_step",
      c10::DispatchKey::CompositeExplicitAutograd,
      [](std::optional<int64_t> step) {
        setOrClearStep(step);
      });
  // A read: CONSERVATIVE too, so that the JIT never reorders it across a
  // set_step. Not traceable by PyTorch 2 (its result is known only when the
  // graph runs); _fake gives it a fake that says so.
  m.def(torch::schema("get_step() -> int?", c10::AliasAnalysisKind::CONSERVATIVE));
  m.impl("get_step", c10::DispatchKey::CompositeExplicitAutograd, []() {
    return getStep();
  });
}

} // namespace torch_monitor::script

// The only TORCH_LIBRARY block of the project: loading libtorch_monitor.so
// (torch.ops.load_library, dlopen, or linking it) registers everything.
TORCH_LIBRARY(torch_monitor, m) {
  // The producers of statistics register their events before any sink is
  // made: the sinks of statistics take what is registered (TensorBoardWriter's
  // default event names are read below).
  torch_monitor::watch::registerEvents();
  torch_monitor::script::registerStatClasses(m);
  torch_monitor::script::registerWaitCounterClasses(m);
  torch_monitor::script::registerPytorchCounterClasses(m);
  torch_monitor::script::registerEventClassAndOps(m);
  torch_monitor::script::registerStepOps(m);
  torch_monitor::script::registerReducerClasses(m);
  torch_monitor::script::registerMonitorClasses(m);
  torch_monitor::script::registerSinkClasses(m);
  torch_monitor::script::registerWatch(m);
}
