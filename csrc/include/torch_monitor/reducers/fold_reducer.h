#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <torch_monitor/detail/blocking_lock.h>
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
// Thread safety: every public method may be called from several threads at
// once (TorchScript serves a model from a thread pool without the GIL): each
// takes the reducer's own lock, so steps are applied one at a time, whole.
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

  void forward(const std::vector<at::Tensor>& inputs) final;
  std::optional<at::Tensor> peek() const final;
  std::optional<at::Tensor> dump() const final;
  // A 0-dim `time` is one time for every element (read on the host, so from
  // a CUDA tensor it synchronises; prefer the double overload).
  std::optional<at::Tensor> view(
      const at::Tensor& time,
      double tolerance = 1e-7) const final;
  // One time for every element.
  std::optional<at::Tensor> view(double time, double tolerance = 1e-7) const;
  void clear(bool keepshape = false) final;

  // The inferno class name ("EMAReducer", ...); makeReducer() takes it.
  virtual const char* kind() const noexcept = 0;
  // How many tensors forward() takes (2 for the conditional traces).
  virtual size_t arity() const noexcept {
    return 1;
  }
  // The kind's own parameters by name (see makeReducer() for the names).
  std::map<std::string, double> params() const;
  // Changes one of params(); throws c10::ValueError for an unknown name or an
  // invalid value. Parameters fixed at construction (EventReducer's initial)
  // cannot be set.
  void setParam(const std::string& name, double value);
  // A copy of the criterion of EventReducer and the Scaled*TraceReducers,
  // else nullopt.
  std::optional<Criterion> criterion() const;
  // Throws c10::ValueError for reducers without a criterion or an empty one.
  void setCriterion(Criterion criterion);

  double stepTime() const;
  // Resizes the history when N changes (keeping the newest rows).
  void setStepTime(double stepTime);
  double duration() const;
  // Resizes the history when N changes (keeping the newest rows). Unlike
  // inferno 0.0.5, whose setter overwrote the step time instead.
  void setDuration(double duration);
  bool inclusive() const;
  void setInclusive(bool inclusive);
  bool inplace() const;
  void setInplace(bool inplace);

  // N, the number of states kept.
  int64_t historySize() const;
  // Whether a state exists (peek() is not nullopt).
  bool hasState() const;
  // Steps since construction or the last clear().
  int64_t steps() const;
  double fill() const;
  // The history's tensor, [N, *state shape] once allocated (else an empty
  // stand-in carrying the dtype and device), rows in storage order.
  at::Tensor storage() const;
  at::ScalarType dtype() const;
  at::Device device() const;
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
  // Whether fold() reads the previous state; false spares making a view of
  // the newest row at every step (PassthroughReducer).
  virtual bool foldReadsState() const noexcept {
    return true;
  }
  // params(), setParam(), criterion() and setCriterion() of a subclass,
  // called with the lock held.
  virtual std::map<std::string, double> paramsLocked() const {
    return {};
  }
  virtual void setParamLocked(const std::string& name, double value);
  virtual const Criterion* criterionLocked() const noexcept {
    return nullptr;
  }
  virtual void setCriterionLocked(Criterion criterion);

  // The reducer's lock (recursive). Subclasses' own public methods hold it
  // while they read or write their parameters:
  // `detail::BlockingLock guard(mutex());`. fold(), interpolate() and the
  // *Locked() hooks are called with it held.
  detail::ForkSafeMutex& mutex() const noexcept {
    return mutex_;
  }
  // `x` cast to the history's dtype.
  at::Tensor asState(const at::Tensor& x) const;
  // For setParamLocked() of subclasses: the ValueError for an unknown name.
  [[noreturn]] void unknownParam(const std::string& name) const;

 private:
  void checkInputs(const std::vector<at::Tensor>& inputs) const;
  void resizeHistory();
  std::optional<at::Tensor> viewTensor(
      const at::Tensor& time,
      double tolerance) const;

  mutable detail::ForkSafeMutex mutex_;
  double stepTime_;
  double duration_;
  bool inclusive_;
  bool inplace_;
  History history_;
  bool hasState_ = false;
  int64_t steps_ = 0;
};

} // namespace torch_monitor
