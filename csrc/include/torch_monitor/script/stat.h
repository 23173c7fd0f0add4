#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
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

 private:
  Stat<T> stat_;
};

// A window given to a TorchScript constructor: a number of seconds (float
// or int); c10::TypeError / c10::ValueError otherwise.
std::chrono::milliseconds windowFromIValue(const c10::IValue& v);

// A saved state's named values (script/config.h) from before the window was
// saved as the constructor takes it, in seconds: Stat's versions 1 to 3 and
// WaitCounter's 1 held `window_size_ms`, replaced here by `window_size`.
void upgradeSavedWindow(std::map<std::string, c10::IValue>& values);

using ScriptDoubleStat = ScriptStat<double>;
using ScriptIntStat = ScriptStat<int64_t>;

} // namespace torch_monitor::script
