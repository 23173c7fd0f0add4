#pragma once

// The one-hook monitors for C++ modules, counterparts of Python's
// InputMonitor, OutputMonitor, StateMonitor and MultiStateMonitor: one hook
// hands what it observes to DifferenceMonitor::observe(), which feeds
// map(value) (by default the value itself, a tuple as several inputs) to the
// reducer.
//
//   auto monitor = std::make_shared<torch_monitor::DifferenceMonitor>(
//       reducer, "fc output");
//   auto handle = torch_monitor::nn::attachOutput(monitor, model->fc);
//   torch_monitor::nn::call(model, x);   // the reducer sees fc's output
//
// Values reach the monitor as c10::IValues: a torch::Tensor, double,
// int64_t, bool or c10::IValue as itself, a std::vector<torch::Tensor> as a
// tuple. An argument or output of any other type raises c10::TypeError from
// the call() that meets it (naming the type); wrap such a module, or observe
// an attribute instead.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include <torch_monitor/export.h>
#include <torch_monitor/nn/hooks.h>

namespace torch_monitor {
class DifferenceMonitor; // monitors/difference_monitor.h
} // namespace torch_monitor

namespace torch_monitor::nn {

namespace detail {

// What the hook of a one-hook monitor hands over.
enum class Observed {
  Inputs, // the tuple of forward()'s arguments (pre-hook)
  Output, // what forward() returned (post-hook)
  State, // the attribute at paths[0] (pre- or post-hook)
  States, // the tuple of the attributes at `paths` (pre- or post-hook)
};

// Registers the hook on `module` (observe.cpp). `paths` for State/States.
TORCH_MONITOR_API HookHandle attachObserver(
    torch::nn::Module& module,
    std::shared_ptr<DifferenceMonitor> monitor,
    Observed what,
    std::vector<std::string> paths,
    bool asPrehook,
    bool prepend);

} // namespace detail

// InputMonitor: before every forward() made through call(), feeds the tuple
// of its arguments to monitor->observe(). `module` is a holder, a
// std::shared_ptr<M> or an M& (shared-owned, see registerForwardPreHook);
// `prepend` puts the hook before the module's other pre-hooks. The handle
// removes the hook; the hook shares ownership of `monitor`.
// Thread safety: as registerForwardPreHook; the monitor is driven from
// whichever thread calls the module.
template <typename M>
HookHandle attachInput(
    std::shared_ptr<DifferenceMonitor> monitor,
    M&& module,
    bool prepend = false) {
  return detail::attachObserver(
      detail::moduleOf(module), std::move(monitor),
      detail::Observed::Inputs, {}, true, prepend);
}

// OutputMonitor: after every forward(), feeds what it returned.
// Thread safety: as attachInput.
template <typename M>
HookHandle attachOutput(
    std::shared_ptr<DifferenceMonitor> monitor,
    M&& module,
    bool prepend = false) {
  return detail::attachObserver(
      detail::moduleOf(module), std::move(monitor),
      detail::Observed::Output, {}, false, prepend);
}

// StateMonitor: after every forward() (before it with `asPrehook`), feeds
// the attribute at `path`, resolved on `module` as attach() does.
// Thread safety: as attachInput.
template <typename M>
HookHandle attachState(
    std::shared_ptr<DifferenceMonitor> monitor,
    M&& module,
    std::string path,
    bool asPrehook = false,
    bool prepend = false) {
  return detail::attachObserver(
      detail::moduleOf(module), std::move(monitor), detail::Observed::State,
      {std::move(path)}, asPrehook, prepend);
}

// MultiStateMonitor: feeds the tuple of the attributes at `paths`, in order
// (the reducer's inputs, e.g. a conditional trace's value and condition).
// Thread safety: as attachInput.
template <typename M>
HookHandle attachMultiState(
    std::shared_ptr<DifferenceMonitor> monitor,
    M&& module,
    std::vector<std::string> paths,
    bool asPrehook = false,
    bool prepend = false) {
  return detail::attachObserver(
      detail::moduleOf(module), std::move(monitor), detail::Observed::States,
      std::move(paths), asPrehook, prepend);
}

} // namespace torch_monitor::nn
