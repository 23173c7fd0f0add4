#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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
#include <torch_monitor/reducers/kinds.h>
#include <torch_monitor/reducers/reducer.h>

namespace torch_monitor {

// A reducer whose state after each step is fold(inputs, previous state),
// recorded in a History of the last N states (inferno's FoldReducer). Its
// kind (an entry of reducerKindTable(), one per inferno reducer) gives its
// parameters, the fold, the interpolation between two recorded states, and
// the fill value of never-written rows; makeReducer() builds one by name.
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

  // A fold (and optionally an interpolation) written by the user in place
  // of the kind's: from Python, a subclass of torch_monitor.FoldReducer that
  // defines fold() / interpolate() (inferno's way of writing a reducer). The
  // history, view() and the rest stay this class's. A reducer with one
  // cannot be saved by TorchScript (its code is not part of the state).
  // Thread safety: immutable once installed; the functions are called with
  // the reducer's lock held, one step at a time.
  struct CustomFold {
    // (inputs, previous state or nullopt at the first step) -> new state;
    // empty: the kind's fold (a subclass of a built-in reducer that
    // interpolates its own way).
    std::function<at::Tensor(
        const std::vector<at::Tensor>& inputs,
        const std::optional<at::Tensor>& state)>
        fold;
    // (prev, next, sampleAt, stepTime) -> the state sampleAt after prev;
    // empty: the kind's interpolation.
    std::function<at::Tensor(
        const at::Tensor& prev,
        const at::Tensor& next,
        const at::Tensor& sampleAt,
        double stepTime)>
        interpolate;
    std::string description; // for messages, e.g. the Python class name
  };

  void forward(const std::vector<at::Tensor>& inputs) final;
  std::optional<at::Tensor> peek() const final;
  std::optional<at::Tensor> dump() const final;
  // A 0-dim `time` is one time for every element (read on the host, so from
  // a CUDA tensor it synchronises; prefer the double overload). A time
  // within `tolerance` (finite, >= 0, else c10::ValueError) of a recorded
  // step reads that step, beyond either end too.
  std::optional<at::Tensor> view(
      const at::Tensor& time,
      double tolerance = kViewTolerance) const final;
  // One time for every element.
  std::optional<at::Tensor> view(double time, double tolerance = kViewTolerance) const;
  void clear(bool keepshape = false) final;
  bool forwardInto(
      const at::Tensor& like,
      const std::function<void(at::Tensor& row)>& write) final;

  // `kind` is kept by reference: an entry of reducerKindTable() (or one that
  // outlives the reducer). Throws c10::ValueError for a stepTime or duration
  // that is not finite, stepTime <= 0, duration < 0, more than
  // kMaxHistorySize states (history.h), or parameters or a criterion the
  // kind does not accept.
  FoldReducer(
      const ReducerKind& kind,
      double stepTime,
      double duration,
      bool inclusive,
      bool inplace,
      const std::map<std::string, double>& params = {},
      Criterion criterion = Criterion());

  // The inferno class name ("EMAReducer", ...); makeReducer() takes it.
  const char* kind() const noexcept {
    return kind_.name.c_str();
  }
  // How many tensors forward() takes (2 for the conditional traces).
  size_t arity() const noexcept {
    return kind_.arity();
  }
  // The kind's own parameters by name (an unset optional one is absent).
  std::map<std::string, double> params() const;
  // Changes one of params(); throws c10::ValueError for an unknown name or an
  // invalid value. Parameters fixed at construction (EventReducer's initial)
  // cannot be set; NaN unsets an optional one (a trace's tolerance).
  void setParam(const std::string& name, double value);
  // A copy of the criterion of the kinds that take one, else nullopt.
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

  // Replaces the kind's fold (and interpolation); nullptr restores them.
  // With a custom fold, forward() takes any number of inputs of any shape
  // (the fold decides). Throws c10::ValueError for an empty fold.
  void setCustomFold(std::shared_ptr<const CustomFold> custom);
  // nullptr when the kind's fold is used.
  std::shared_ptr<const CustomFold> customFold() const;
  Snapshot snapshot() const;
  // Throws c10::ValueError when the snapshot does not fit this reducer's
  // history size.
  void restore(const Snapshot& snapshot);

 private:
  // Who messages name: the user's fold (its description) when there is
  // one, else the kind. Callers hold the lock.
  std::string name() const;
  // Whether the user's fold replaces the kind's. Callers hold the lock.
  bool ownFold() const noexcept;
  // `x` cast to the history's dtype.
  at::Tensor asState(const at::Tensor& x) const;
  // Throws c10::ValueError unless view()'s tolerance is finite and >= 0.
  void checkTolerance(double tolerance) const;
  void checkInputs(const std::vector<at::Tensor>& inputs) const;
  // Where this step matches; undefined for kinds without matches. `x` is
  // the observation cast by asState().
  at::Tensor matches(const std::vector<at::Tensor>& inputs, const at::Tensor& x)
      const;
  // The kind's fold and interpolation, called with the lock held.
  // fold() gets arity() raw inputs (checked for device and shape; criteria
  // see their dtype) and the previous state (nullopt at the first step);
  // steps_ already counts this step. interpolate() gives the state
  // `sampleAt` after `prev` (0 < sampleAt < stepTime), `next` being stepTime
  // after it.
  at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) const;
  at::Tensor traceFold(
      const at::Tensor& x,
      const at::Tensor& mask,
      const std::optional<at::Tensor>& state) const;
  at::Tensor interpolate(
      const at::Tensor& prev,
      const at::Tensor& next,
      const at::Tensor& sampleAt,
      double stepTime) const;
  void checkCriterion(const Criterion& criterion) const;
  void resizeHistory();
  std::optional<at::Tensor> viewTensor(
      const at::Tensor& time,
      double tolerance) const;

  mutable detail::ForkSafeMutex mutex_;
  const ReducerKind& kind_; // an entry of reducerKindTable()
  std::map<std::string, double> params_;
  Criterion criterion_;
  double stepTime_;
  double duration_;
  bool inclusive_;
  bool inplace_;
  History history_;
  std::shared_ptr<const CustomFold> custom_; // nullptr: the kind's fold
  bool hasState_ = false;
  int64_t steps_ = 0;
};

} // namespace torch_monitor
