#pragma once

#include <torch/custom_class.h>

#include <torch_monitor/pytorch_counters.h>

namespace torch_monitor::script {

// The TorchScript face of a PytorchCounterCapture:
// torch.classes.torch_monitor.PytorchCounterCapture, which Python's
// capture_pytorch_counters() returns.
// Thread safety: as PytorchCounterCapture.
class ScriptCapture : public torch::CustomClassHolder {
 public:
  explicit ScriptCapture(PytorchCounterOptions options)
      : capture_(std::move(options)) {}
  PytorchCounterCapture& capture() noexcept {
    return capture_;
  }

 private:
  PytorchCounterCapture capture_;
};

} // namespace torch_monitor::script
