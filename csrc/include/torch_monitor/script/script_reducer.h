#pragma once

#include <memory>

#include <torch/custom_class.h>

#include <torch_monitor/reducers/reducer.h>

namespace torch_monitor::script {

// The TorchScript face of every reducer: torch.classes.torch_monitor.Reducer,
// holding one C++ Reducer (which kind is part of its pickled state).
// Thread safety: as Reducer.
class ScriptReducer : public torch::CustomClassHolder {
 public:
  explicit ScriptReducer(std::shared_ptr<Reducer> reducer)
      : reducer_(std::move(reducer)) {}
  const std::shared_ptr<Reducer>& reducer() const noexcept {
    return reducer_;
  }

 private:
  std::shared_ptr<Reducer> reducer_;
};

} // namespace torch_monitor::script
