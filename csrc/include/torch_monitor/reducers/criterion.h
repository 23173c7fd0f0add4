#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <torch_monitor/export.h>

namespace torch_monitor {

// The test an EventReducer or a Scaled*TraceReducer applies to each
// observation: a function from the observation to a bool tensor of matches.
//
// Either built in, named by `name()` and a threshold so it can be saved with
// the reducer (TorchScript pickling, state dicts): "eq", "ne", "gt", "ge",
// "lt", "le" compare with the threshold (x > threshold, ...), "nonzero" is
// x != 0. Or custom: any std::function (a Python callable, from Python), which
// works but cannot be saved.
//
// Thread safety: immutable after construction; concurrent calls are safe if
// the wrapped function's are.
class TORCH_MONITOR_API Criterion {
 public:
  using Function = std::function<at::Tensor(const at::Tensor&)>;

  // An empty criterion (valid() is false), for reducers that take none.
  Criterion() = default;
  // Throws c10::ValueError for an unknown name, listing the known ones.
  static Criterion builtin(const std::string& name, double threshold = 0.0);
  // `description` is shown in error messages and repr (e.g. the callable's
  // repr); an empty function throws c10::ValueError.
  static Criterion custom(Function fn, std::string description = "custom");

  // The names builtin() accepts.
  static const std::vector<std::string>& builtinNames();

  bool valid() const noexcept {
    return static_cast<bool>(fn_);
  }
  bool isBuiltin() const noexcept {
    return builtin_;
  }
  // The built-in name, or the description of a custom criterion.
  const std::string& name() const noexcept {
    return name_;
  }
  double threshold() const noexcept {
    return threshold_;
  }
  // "gt(0.5)", "nonzero", or the custom description.
  std::string repr() const;

  // Applies the test; throws c10::TypeError when the result is not a bool
  // tensor (the reducers use it as a mask).
  at::Tensor operator()(const at::Tensor& x) const;

 private:
  Criterion(Function fn, std::string name, double threshold, bool builtin)
      : fn_(std::move(fn)),
        name_(std::move(name)),
        threshold_(threshold),
        builtin_(builtin) {}

  Function fn_;
  std::string name_;
  double threshold_ = 0.0;
  bool builtin_ = false;
};

} // namespace torch_monitor
