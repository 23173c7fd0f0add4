#pragma once

#include <functional>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include <torch_monitor/export.h>

namespace torch_monitor {

// How far (in the reducer's time unit) a time given to view() may be from a
// recorded step and still read that step exactly: the default of every
// view(), in C++, TorchScript and Python (its schema's default).
inline constexpr double kViewTolerance = 1e-7;

// What a monitor feeds: folds the inputs of each step into a state and keeps
// a history of the last states in tensors (on the CPU or CUDA).
// Thread safety: up to the implementation; every reducer of this library
// (FoldReducer) is safe to call from several threads. DifferenceMonitor
// feeds it from whichever thread runs forward(); a reducer of your own must
// allow that if its module is served from several threads.
class TORCH_MONITOR_API Reducer {
 public:
  virtual ~Reducer();

  // One step: folds `inputs` (and the previous state) into a new state and
  // appends it to the history.
  virtual void forward(const std::vector<at::Tensor>& inputs) = 0;
  // The newest state; nullopt before the first step.
  virtual std::optional<at::Tensor> peek() const = 0;
  // Every stored state, newest first along dim 0; nullopt before the first
  // step.
  virtual std::optional<at::Tensor> dump() const = 0;
  // The state `time` before the newest one, interpolated between stored
  // states. `time` is a 0-dim tensor (one time for all elements) or a tensor
  // of times per element (optionally with a trailing dimension of several
  // times). nullopt before the first step.
  virtual std::optional<at::Tensor> view(
      const at::Tensor& time,
      double tolerance = kViewTolerance) const = 0;
  // Back to the initial state; `keepshape` keeps the storage allocated.
  virtual void clear(bool keepshape = false) = 0;

  // One step for a caller that can compute the state straight into the
  // history: when the new state is the input as it is (a passthrough fold)
  // and the history row it goes to can be written in place unobserved,
  // runs `write(row)`, which fills that row with what forward({x}) would
  // have been given for an `x` like `like` (same shape, dtype and device;
  // it must not throw), records the step and returns true. Otherwise runs
  // nothing and returns false: forward() is then the way. DifferenceMonitor
  // subtracts into the row this way, saving a copy per step. The default
  // returns false.
  virtual bool forwardInto(
      const at::Tensor& like,
      const std::function<void(at::Tensor& row)>& write);
};

} // namespace torch_monitor
