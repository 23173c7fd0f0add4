#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <torch_monitor/stat.h>

namespace torch_monitor::script {

// The TorchScript face of Stat<T>: torch.classes.torch_monitor.Stat (double)
// and torch.classes.torch_monitor.IntStat (int64). The Python binding wraps
// the very same object, so scripted code and Python feed one window.
// Thread safety: as Stat<T>; no concurrent call causes a data race.
template <typename T>
class ScriptStat : public torch::CustomClassHolder {
 public:
  // Pickled state; the version comes first so later layouts can be read.
  using State = std::tuple<
      int64_t, // version
      std::string, // name
      std::vector<int64_t>, // aggregations as ints, as given
      int64_t, // window in ms
      int64_t, // max samples
      bool, // close on time (since version 2)
      int64_t, // window in training steps, 0: a time window (since 2)
      bool>; // syncs ranks, restored on the default group (since 3)
  // Version 1: without close on time (it was always off) and what follows.
  using StateV1 =
      std::tuple<int64_t, std::string, std::vector<int64_t>, int64_t, int64_t>;
  // Version 2: without sync ranks (it did not exist).
  using StateV2 = std::tuple<
      int64_t,
      std::string,
      std::vector<int64_t>,
      int64_t,
      int64_t,
      bool,
      int64_t>;
  static constexpr int64_t kStateVersion = 3;

  ScriptStat(
      std::string name,
      std::vector<Aggregation> aggregations,
      std::chrono::milliseconds window,
      int64_t maxSamples,
      WindowClose windowClose = WindowClose::LAZY)
      : stat_(
            std::move(name),
            std::move(aggregations),
            window,
            maxSamples,
            windowClose) {}
  ScriptStat(
      std::string name,
      std::vector<Aggregation> aggregations,
      WindowSteps windowSteps,
      int64_t maxSamples)
      : stat_(
            std::move(name),
            std::move(aggregations),
            windowSteps,
            maxSamples) {}

  // What the Python and TorchScript constructors build: exactly one of
  // `window` and `windowSteps` must be given, and close on time needs a
  // time window; c10::ValueError otherwise.
  static c10::intrusive_ptr<ScriptStat> make(
      std::string name,
      std::vector<Aggregation> aggregations,
      std::optional<std::chrono::milliseconds> window,
      std::optional<int64_t> windowSteps,
      int64_t maxSamples,
      WindowClose windowClose);

  Stat<T>& stat() noexcept {
    return stat_;
  }

  // add() of TorchScript and of traced PyTorch 2 code: a number, or a tensor
  // whose every element is one sample (IntStat: integer tensors only; see
  // Stat::add(const at::Tensor&)). Throws c10::TypeError for anything else.
  void addValue(const c10::IValue& value);

  State state() const;
  static c10::intrusive_ptr<ScriptStat> fromState(State state);
  // A state of any version this build reads (TorchScript's pickler hands
  // over whatever tuple was saved). Throws for anything else.
  static c10::intrusive_ptr<ScriptStat> fromState(const c10::IValue& state);
  static State upgrade(const StateV1& old);
  static State upgrade(const StateV2& old);

 private:
  Stat<T> stat_;
};

// A window given to a TorchScript constructor: a number of seconds (float
// or int); c10::TypeError / c10::ValueError otherwise.
std::chrono::milliseconds windowFromIValue(const c10::IValue& v);

using ScriptDoubleStat = ScriptStat<double>;
using ScriptIntStat = ScriptStat<int64_t>;

} // namespace torch_monitor::script
