#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>

#include <torch_monitor/detail/blocking_lock.h>
#include <torch_monitor/export.h>
#include <torch_monitor/reducers/reducer.h>

namespace torch_monitor {

// The C++ core of every monitor. Named after its first use: it records how
// one attribute of a module changes across each forward():
// before() is the body of a forward pre-hook, after() of a forward post-hook;
// after() feeds op(post, pre) (by default post - pre) to the reducer.
// Values are what the attribute holds: a Tensor, None, or a tuple of tensors.
// The hooks themselves (Python nn.Module hooks, TorchScript hooks, or
// torch_monitor::nn hooks for C++ modules) resolve the attribute and call
// these; this class is the part shared by the three worlds. The one-hook
// monitors (inputs, output, or an attribute at one moment) call observe().
//
// History is detached from autograd by default: the value before forward()
// is copied without autograd and the reducer is fed detached differences,
// so a monitor on a parameter never keeps a step's graph alive (which would
// grow memory with every step). keepGraph() opts in to differentiable
// differences, at that cost.
//
// Thread safety: every method may be called from several threads at once.
// Concurrent forward() calls of one module (a scripted model served from a
// thread pool) each pair their own before() and after(): a capture belongs
// to the thread that made it. The reducer is fed one difference at a time
// (its own lock). The Python filter_/map_/op_ are called without any of our
// locks held.
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

  // `name` identifies the monitor in error messages (e.g. the attribute
  // path). Throws c10::ValueError for a name that is not UTF-8 without NUL
  // and for a null reducer.
  DifferenceMonitor(
      std::shared_ptr<Reducer> reducer,
      std::string name,
      bool trainUpdate = true,
      bool evalUpdate = true,
      bool keepGraph = false);

  // Captures the value before forward(); a copy, so in-place updates during
  // forward() are measured (detached, unless keepGraph() and the value
  // requires grad with grad mode on). Skipped when `training` does not match
  // the train/eval flags.
  // (A skipped before() or after() drops the calling thread's pending
  // capture: after() pairs only with the before() of the same forward()
  // call, else the value before counts as None.)
  void before(const c10::IValue& value, bool training);
  // Compares with the captured value and feeds the reducer. Skipped like
  // before(). Errors (shape or device mismatches in the reducer) name the
  // monitor.
  void after(const c10::IValue& value, bool training);

  // The one part of the one-hook monitors (InputMonitor, OutputMonitor,
  // StateMonitor, MultiStateMonitor: one hook hands over what it observes):
  // feeds map(value, None) to the reducer when filter(value, None) holds.
  // Without custom callables, a tuple (or list) is fed as several inputs and
  // any other value as one, as they are (no copy: the reducer copies), and
  // None or an empty tuple is skipped. Captures and pairs nothing. Skipped
  // like after().
  void observe(const c10::IValue& value, bool training);

  // Forgets every thread's captured value and clears the reducer.
  void clear(bool keepshape = false);

  // Whether before()/after() act for a module in this mode (the train/eval
  // flags); hooks may check it first to skip resolving the attribute.
  bool runsWhen(bool training) const noexcept {
    return training ? trainUpdate_ : evalUpdate_;
  }
  // Forgets the calling thread's captured value (what a skipped hook does).
  void forget();
  // Forgets every thread's captured value (clear() without the reducer).
  void forgetAll();
  // Whether before() on this thread captured a value that after() has not
  // consumed yet.
  bool hasCapture() const;

  const std::shared_ptr<Reducer>& reducer() const noexcept;
  const std::string& name() const noexcept;
  bool trainUpdate() const noexcept {
    return trainUpdate_.load(std::memory_order_relaxed);
  }
  void setTrainUpdate(bool value) noexcept {
    trainUpdate_.store(value, std::memory_order_relaxed);
  }
  bool evalUpdate() const noexcept {
    return evalUpdate_.load(std::memory_order_relaxed);
  }
  void setEvalUpdate(bool value) noexcept {
    evalUpdate_.store(value, std::memory_order_relaxed);
  }
  // Whether differences keep their autograd graph (see the class comment).
  bool keepGraph() const noexcept {
    return keepGraph_.load(std::memory_order_relaxed);
  }
  void setKeepGraph(bool value) noexcept {
    keepGraph_.store(value, std::memory_order_relaxed);
  }

  // Custom callables; an empty std::function restores the default.
  void setFilter(Filter filter);
  void setMap(Map map);
  void setOp(Op op);
  bool hasCustomCallables() const;
  // The custom callables set (empty ones for the defaults): a copy of the
  // monitor takes them along, and a binding reads back what it set.
  Filter filter() const;
  Map map() const;
  Op op() const;

  // What after() feeds without a custom Map: `op` (empty: post - pre)
  // element-wise as described at Map, autograd recorded as for any tensor
  // operation. Lets the Python monitor hand its default map_ back as a
  // callable (inferno's defaults read back as functions).
  static std::vector<at::Tensor> defaultMap(
      const c10::IValue& post,
      const c10::IValue& pre,
      const Op& op = Op());

 private:
  // The custom callables, replaced as a whole so that after() can use them
  // outside the lock; nullptr when all are the defaults.
  struct Callables {
    Filter filter;
    Map map;
    Op op;
  };
  // A capture waiting for the after() of the same thread.
  struct Pending {
    std::thread::id thread;
    c10::IValue value;
  };

  void replaceCallables(const std::function<void(Callables&)>& change);
  // Removes and returns the calling thread's capture (None when there is
  // none); the lock must be held.
  c10::IValue takePending(std::thread::id thread);
  std::vector<at::Tensor> differences(
      const c10::IValue& post,
      c10::IValue& pre,
      const Callables* callables,
      bool keepGraph) const;
  // What after() (paired: `pre` is the capture, or None) and observe() (not
  // paired: `pre` is None) share: filter, map, detach, feed the reducer.
  void feed(const c10::IValue& post, c10::IValue& pre, bool paired);
  // after()'s usual case, with the default callables: two tensors alike,
  // subtracted straight into the reducer's history when it takes them as
  // they are (Reducer::forwardInto); false when feed() must do it.
  bool subtractIntoHistory(const c10::IValue& post, const c10::IValue& pre);

  std::shared_ptr<Reducer> reducer_;
  std::string name_;
  std::atomic<bool> trainUpdate_;
  std::atomic<bool> evalUpdate_;
  std::atomic<bool> keepGraph_;
  mutable detail::ForkSafeMutex mutex_; // guards what follows
  std::shared_ptr<const Callables> callables_;
  // One entry per thread inside forward(); a handful at most.
  std::vector<Pending> pending_;
  // A tensor whose memory the next capture may reuse: the previous capture,
  // once its difference has been fed and nobody else holds it. Saves two
  // allocations per forward() for the common single-tensor attribute.
  at::Tensor spare_;
};

} // namespace torch_monitor
