#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <torch/custom_class.h>

#include <torch_monitor/event.h>

namespace torch_monitor::script {

// The TorchScript face of Event: torch.classes.torch_monitor.Event. Scripted
// code builds one (name; timestamp = now), sets typed values, and logs it
// with torch.ops.torch_monitor.log_event(event).
// Thread safety: like Event, a value; do not mutate it from two threads.
class ScriptEvent : public torch::CustomClassHolder {
 public:
  // version, name, timestamp (µs since the epoch), keys, kinds (index of the
  // data_value_t alternative), and one value column per kind. The step is
  // not saved: an Event a saved module holds is filled and logged at run
  // time (only its name is configuration), and keeping the state as it was
  // keeps every archive saved before steps existed loadable.
  using State = std::tuple<
      int64_t,
      std::string,
      int64_t,
      std::vector<std::string>,
      std::vector<int64_t>,
      std::vector<std::string>,
      std::vector<double>,
      std::vector<int64_t>>;
  static constexpr int64_t kStateVersion = 1;

  explicit ScriptEvent(Event event) : event_(std::move(event)) {}

  Event& event() noexcept {
    return event_;
  }
  const Event& event() const noexcept {
    return event_;
  }

  State state() const;
  static c10::intrusive_ptr<ScriptEvent> fromState(State state);

 private:
  Event event_;
};

} // namespace torch_monitor::script
