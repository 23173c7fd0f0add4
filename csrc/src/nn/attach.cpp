// The hook pair behind torch_monitor::nn::attach: resolve the attribute path
// on the hooked module and hand its value to the monitor, with the module's
// train/eval mode at that moment.

#include <torch_monitor/nn/attach.h>

#include <torch/nn/module.h>

#include <torch_monitor/nn/attribute_path.h>

namespace torch_monitor::nn::detail {

AttachedMonitor::~AttachedMonitor() = default;

HookHandle attachMonitor(
    torch::nn::Module& module,
    std::string path,
    std::shared_ptr<AttachedMonitor> monitor,
    bool prepend) {
  // Parsed once (a malformed path fails here); resolved at every call, as in
  // Python, so a submodule swapped with replace_module() is followed.
  auto parsed = std::make_shared<const AttributePath>(std::move(path));
  HookHandle handle = registerForwardPreHook(
      module,
      [monitor, parsed](torch::nn::Module& m, const ForwardArgs&) {
        const bool training = m.is_training();
        if (monitor->wants(training)) {
          monitor->before(parsed->resolve(m), training);
        } else {
          monitor->skipped();
        }
      },
      prepend);
  try {
    handle.merge(registerForwardHook(
        module,
        [monitor, parsed](
            torch::nn::Module& m, const ForwardArgs&, ForwardOutput&) {
          const bool training = m.is_training();
          if (monitor->wants(training)) {
            monitor->after(parsed->resolve(m), training);
          } else {
            monitor->skipped();
          }
        },
        prepend));
  } catch (...) {
    handle.remove(); // no half-attached monitor
    throw;
  }
  return handle;
}

} // namespace torch_monitor::nn::detail
