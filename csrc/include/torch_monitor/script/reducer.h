#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>

#include <torch/custom_class.h>

#include <torch_monitor/reducers/fold_reducer.h>
#include <torch_monitor/reducers/reducer.h>

namespace torch_monitor::script {

// The TorchScript face of every reducer: torch.classes.torch_monitor.Reducer,
// holding one C++ Reducer (which kind is part of its pickled state).
// Thread safety: as its Reducer (FoldReducer: any thread).
class ScriptReducer : public torch::CustomClassHolder {
 public:
  // The pickled state (also what state_dict() carries); the version comes
  // first so later layouts can be read. The history's dtype and device are
  // those of `storage` (an empty tensor before the first step), so
  // torch.jit.load(map_location=...) moves it like any other tensor.
  using State = std::tuple<
      int64_t, // version
      std::string, // kind, the inferno class name
      double, // step_time
      double, // duration
      bool, // inclusive
      bool, // inplace
      c10::Dict<std::string, double>, // the kind's parameters
      std::string, // criterion: a built-in name, "" (none) or "custom"
      double, // criterion threshold
      at::Tensor, // history storage, [N, *state shape]
      bool, // storage allocated
      int64_t, // ring position (the row the next step writes)
      bool, // has a state (peek() is not None)
      int64_t>; // steps since the last clear
  static constexpr int64_t kStateVersion = 1;
  // The criterion field of a reducer whose criterion is a Python callable.
  static constexpr const char* kCustomCriterion = "custom";

  explicit ScriptReducer(std::shared_ptr<Reducer> reducer)
      : reducer_(std::move(reducer)),
        fold_(std::dynamic_pointer_cast<FoldReducer>(reducer_)) {}
  const std::shared_ptr<Reducer>& reducer() const noexcept {
    return reducer_;
  }
  // The reducer as a FoldReducer (every reducer this library builds is
  // one); throws c10::TypeError for another Reducer.
  FoldReducer& fold() const;

  // `forSaving`: throws c10::ValueError when the state could not rebuild the
  // reducer (its criterion is a Python callable). Without it, such a
  // criterion is recorded as "custom" (state_dict() carries state, not code).
  State state(bool forSaving) const;
  // Loads `state` into this very reducer (monitors holding it see the
  // change): configuration, parameters and history; the criterion stays.
  // Throws c10::ValueError for another version or kind.
  void loadState(const State& state);
  // A new reducer rebuilt from a saved state (TorchScript unpickling).
  static c10::intrusive_ptr<ScriptReducer> fromState(const State& state);

 private:
  std::shared_ptr<Reducer> reducer_;
  std::shared_ptr<FoldReducer> fold_; // reducer_ when it is a FoldReducer
};

// A time given to a view() method from TorchScript or Python: a number
// (one time for every element) or a tensor, as Reducer::view takes it.
// `owner` names the class in the TypeError for anything else.
TORCH_MONITOR_API at::Tensor viewTime(const c10::IValue& time, const char* owner);

} // namespace torch_monitor::script
