#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include <torch_monitor/export.h>
#include <torch_monitor/reducers/reducer.h>

namespace torch_monitor {

// Records how one attribute of a module changes across each forward():
// before() is the body of a forward pre-hook, after() of a forward post-hook;
// after() feeds op(post, pre) (by default post - pre) to the reducer.
// Values are what the attribute holds: a Tensor, None, or a tuple of tensors.
// The hooks themselves (Python nn.Module hooks, TorchScript hooks, or
// torch_monitor::nn hooks for C++ modules) resolve the attribute and call
// these; this class is the part shared by the three worlds.
// Thread safety: none; a monitor is driven by one module's hooks, which run
// on the thread calling forward().
class TORCH_MONITOR_API DifferenceMonitor {
 public:
  // (post, pre) -> whether the pair reaches the reducer. Default: reject only
  // when both are None.
  using Filter = std::function<bool(const c10::IValue& post, const c10::IValue& pre)>;
  // (post, pre) -> the reducer's inputs. Default: op element-wise over tuples
  // (zip, shorter wins) or once for single values; a None side counts as
  // zeros shaped like the other side.
  using Map = std::function<std::vector<at::Tensor>(
      const c10::IValue& post, const c10::IValue& pre)>;
  // (post, pre) -> difference. Default: post - pre. Used only without a Map.
  using Op = std::function<at::Tensor(const at::Tensor& post, const at::Tensor& pre)>;

  // `name` identifies the monitor in error messages (e.g. the attribute path).
  DifferenceMonitor(
      std::shared_ptr<Reducer> reducer,
      std::string name,
      bool trainUpdate = true,
      bool evalUpdate = true);

  // Captures the value before forward(); a copy, so in-place updates during
  // forward() are measured (autograd-preserving when the value requires grad
  // and grad mode is on). Skipped when `training` does not match the
  // train/eval flags.
  // (A skipped before() or after() drops a pending capture: after() pairs only
  // with the before() of the same forward() call, else the value before
  // counts as None.)
  void before(const c10::IValue& value, bool training);
  // Compares with the captured value and feeds the reducer. Skipped like
  // before(). Errors (shape or device mismatches in the reducer) name the
  // monitor.
  void after(const c10::IValue& value, bool training);

  // Forgets the captured value and clears the reducer.
  void clear(bool keepshape = false);

  // Whether before()/after() act for a module in this mode (the train/eval
  // flags); hooks may check it first to skip resolving the attribute.
  bool runsWhen(bool training) const noexcept {
    return training ? trainUpdate_ : evalUpdate_;
  }
  // Forgets the captured value only (clear() without touching the reducer).
  void forget() noexcept;
  // Whether before() captured a value that after() has not consumed yet.
  bool hasCapture() const noexcept {
    return pre_.has_value();
  }

  const std::shared_ptr<Reducer>& reducer() const noexcept;
  const std::string& name() const noexcept;
  bool trainUpdate() const noexcept;
  void setTrainUpdate(bool value) noexcept;
  bool evalUpdate() const noexcept;
  void setEvalUpdate(bool value) noexcept;

  // Custom callables; an empty std::function restores the default.
  void setFilter(Filter filter);
  void setMap(Map map);
  void setOp(Op op);
  bool hasCustomCallables() const noexcept;

 private:
  std::shared_ptr<Reducer> reducer_;
  std::string name_;
  bool trainUpdate_;
  bool evalUpdate_;
  Filter filter_;
  Map map_;
  Op op_;
  std::optional<c10::IValue> pre_; // captured by before(), consumed by after()
};

} // namespace torch_monitor
