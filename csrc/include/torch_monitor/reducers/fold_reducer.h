#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <torch_monitor/export.h>
#include <torch_monitor/reducers/criterion.h>
#include <torch_monitor/reducers/history.h>
#include <torch_monitor/reducers/reducer.h>

namespace torch_monitor {

// A reducer whose state after each step is fold(inputs, previous state),
// recorded in a History of the last N states (inferno's FoldReducer). The
// subclasses (one per inferno reducer) give the fold, the interpolation
// between two recorded states, and the fill value of never-written rows.
//
// Time: states are `stepTime()` apart; the history covers `duration()`
// (N = historySize(stepTime, duration, inclusive)). view(t) reads the state t
// before the newest one, interpolating between recorded states.
//
// Tensors: the history is created at the first step with shape
// [N, *state shape], the reducer's dtype and device (float32 on the CPU until
// to() changes them), and filled with the fill value. Inputs must be on that
// device; they are cast to that dtype. Nothing on the forward path reads a
// value back from the device, so a CUDA forward never waits for the GPU.
//
// Thread safety: none; a reducer is fed and read by one thread at a time.
class TORCH_MONITOR_API FoldReducer : public Reducer {
 public:
  // Everything a saved reducer needs besides its configuration.
  struct Snapshot {
    at::Tensor storage; // History::storage(), with its dtype and device
    bool allocated = false;
    int64_t next = 0;
    bool hasState = false;
    int64_t steps = 0;
  };

  void forward(const std::vector<at::Tensor>& inputs) override;
  std::optional<at::Tensor> peek() const override;
  std::optional<at::Tensor> dump() const override;
  // A 0-dim `time` is one time for every element (read on the host, so from
  // a CUDA tensor it synchronises; prefer the double overload).
  std::optional<at::Tensor> view(
      const at::Tensor& time,
      double tolerance = 1e-7) const override;
  // One time for every element.
  std::optional<at::Tensor> view(double time, double tolerance = 1e-7) const;
  void clear(bool keepshape = false) override;

  // The inferno class name ("EMAReducer", ...); makeReducer() takes it.
  virtual const char* kind() const noexcept = 0;
  // How many tensors forward() takes (2 for the conditional traces).
  virtual size_t arity() const noexcept {
    return 1;
  }
  // The kind's own parameters by name (see makeReducer() for the names).
  virtual std::map<std::string, double> params() const {
    return {};
  }
  // Changes one of params(); throws c10::ValueError for an unknown name or an
  // invalid value. Parameters fixed at construction (EventReducer's initial)
  // cannot be set.
  virtual void setParam(const std::string& name, double value);
  // The criterion of EventReducer and the Scaled*TraceReducers, else nullptr.
  virtual const Criterion* criterion() const noexcept {
    return nullptr;
  }
  // Throws c10::ValueError for reducers without a criterion or an empty one.
  virtual void setCriterion(Criterion criterion);

  double stepTime() const noexcept {
    return stepTime_;
  }
  // Resizes the history when N changes (keeping the newest rows).
  void setStepTime(double stepTime);
  double duration() const noexcept {
    return duration_;
  }
  // Resizes the history when N changes (keeping the newest rows). Unlike
  // inferno 0.0.5, whose setter overwrote the step time instead.
  void setDuration(double duration);
  bool inclusive() const noexcept {
    return inclusive_;
  }
  void setInclusive(bool inclusive);
  bool inplace() const noexcept {
    return inplace_;
  }
  void setInplace(bool inplace) noexcept {
    inplace_ = inplace;
  }

  // N, the number of states kept.
  int64_t historySize() const noexcept {
    return history_.size();
  }
  // Whether a state exists (peek() is not nullopt).
  bool hasState() const noexcept {
    return hasState_;
  }
  // Steps since construction or the last clear().
  int64_t steps() const noexcept {
    return steps_;
  }
  double fill() const noexcept {
    return history_.fill();
  }
  const History& history() const noexcept {
    return history_;
  }
  at::ScalarType dtype() const {
    return history_.storage().scalar_type();
  }
  at::Device device() const {
    return history_.storage().device();
  }
  // Moves and/or casts the history (and the dtype/device of future ones).
  // The dtype must be floating point.
  void to(std::optional<at::Device> device, std::optional<at::ScalarType> dtype);
  // Replaces the history's tensor by one of the same shape (what
  // nn.Module._apply produces from it); a floating dtype is required.
  void setStorage(const at::Tensor& storage);

  Snapshot snapshot() const;
  // Throws c10::ValueError when the snapshot does not fit this reducer's
  // history size.
  void restore(const Snapshot& snapshot);

 protected:
  // Throws c10::ValueError for stepTime <= 0 or duration < 0.
  FoldReducer(
      double stepTime,
      double duration,
      bool inclusive,
      bool inplace,
      double fill);

  // The new state from arity() raw inputs (already checked for device and
  // shape) and the previous state (nullopt at the first step). Inputs keep
  // their dtype, so criteria see them as given; cast values with asState().
  // steps() already counts this step.
  virtual at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) = 0;
  // The state `sampleAt` after `prev` (0 < sampleAt < stepTime), `next`
  // being the state stepTime after `prev`.
  virtual at::Tensor interpolate(
      const at::Tensor& prev,
      const at::Tensor& next,
      const at::Tensor& sampleAt,
      double stepTime) const = 0;
  // Called after the step time changed (decay factors depend on it).
  virtual void onStepTimeChanged() {}

  // `x` cast to the history's dtype.
  at::Tensor asState(const at::Tensor& x) const;
  // For setParam() of subclasses: the ValueError for an unknown name.
  [[noreturn]] void unknownParam(const std::string& name) const;

 private:
  void checkInputs(const std::vector<at::Tensor>& inputs) const;
  void resizeHistory();
  std::optional<at::Tensor> viewTensor(
      const at::Tensor& time,
      double tolerance) const;

  double stepTime_;
  double duration_;
  bool inclusive_;
  bool inplace_;
  History history_;
  bool hasState_ = false;
  int64_t steps_ = 0;
};

} // namespace torch_monitor
