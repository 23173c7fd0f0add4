#pragma once

// Attaching a monitor (DifferenceMonitor, or anything with the same
// before/after interface) to an attribute path of a C++ module, with no
// change to the module's code:
//
//   auto handle = torch_monitor::nn::attach(monitor, model, "fc1.weight");
//   torch_monitor::nn::call(model, x);   // monitor sees fc1.weight around it
//   handle.remove();

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include <c10/util/Exception.h>

#include <torch_monitor/export.h>
#include <torch_monitor/nn/hooks.h>

namespace c10 {
struct IValue; // only passed through by reference here (ATen/core/ivalue.h)
} // namespace c10

namespace torch_monitor::nn {

namespace detail {

// What the hooks of an attached monitor drive; type-erased so that the hook
// bodies (path resolution, reading the train/eval mode) live in the library.
// Thread safety: as the monitor it drives.
class TORCH_MONITOR_API AttachedMonitor {
 public:
  virtual ~AttachedMonitor();
  // Whether the monitor records in this mode. When false the hooks call
  // skipped() instead, without resolving the path.
  virtual bool wants(bool training) const = 0;
  // A before()/after() left out: a monitor that pairs them drops its pending
  // capture (DifferenceMonitor::forget()), as its own gating would.
  virtual void skipped() = 0;
  virtual void before(const c10::IValue& value, bool training) = 0;
  virtual void after(const c10::IValue& value, bool training) = 0;
};

// What a monitor offers besides before()/after(), detected so that any type
// with those two methods can be attached.
template <typename T, typename = void>
struct HasRunsWhen : std::false_type {};
template <typename T>
struct HasRunsWhen<
    T,
    std::void_t<decltype(std::declval<const T&>().runsWhen(true))>>
    : std::true_type {};
template <typename T, typename = void>
struct HasModeFlags : std::false_type {};
template <typename T>
struct HasModeFlags<
    T,
    std::void_t<
        decltype(std::declval<const T&>().trainUpdate()),
        decltype(std::declval<const T&>().evalUpdate())>> : std::true_type {};
template <typename T, typename = void>
struct HasForget : std::false_type {};
template <typename T>
struct HasForget<T, std::void_t<decltype(std::declval<T&>().forget())>>
    : std::true_type {};

// An AttachedMonitor for any monitor type with before()/after().
// Thread safety: as `Monitor`.
template <typename Monitor>
class MonitorAdapter final : public AttachedMonitor {
 public:
  explicit MonitorAdapter(std::shared_ptr<Monitor> monitor)
      : monitor_(std::move(monitor)) {}
  bool wants(bool training) const override {
    if constexpr (HasRunsWhen<Monitor>::value) {
      return monitor_->runsWhen(training);
    } else if constexpr (HasModeFlags<Monitor>::value) {
      return training ? monitor_->trainUpdate() : monitor_->evalUpdate();
    } else {
      return true; // the monitor gates itself, given `training`
    }
  }
  void skipped() override {
    if constexpr (HasForget<Monitor>::value) {
      monitor_->forget();
    }
  }
  void before(const c10::IValue& value, bool training) override {
    monitor_->before(value, training);
  }
  void after(const c10::IValue& value, bool training) override {
    monitor_->after(value, training);
  }

 private:
  std::shared_ptr<Monitor> monitor_;
};

// Registers the pre/post hook pair on `module` (attach.cpp).
TORCH_MONITOR_API HookHandle attachMonitor(
    torch::nn::Module& module,
    std::string path,
    std::shared_ptr<AttachedMonitor> monitor,
    bool prepend);

} // namespace detail

// Attaches `monitor` to the attribute `path` of `module` (a holder, a
// std::shared_ptr<M> or an M&; the module must be shared-owned, see
// registerForwardPreHook). On every forward() made through
// torch_monitor::nn::call, a pre-hook calls
// `monitor->before(value, module.is_training())` and a forward hook
// `monitor->after(value, module.is_training())`, with `value` the path
// resolved at that moment (AttributePath::resolve: the registered tensor). The hooks are on `module` itself, also for nested paths
// ("block.state"); `prepend` puts both before the module's other hooks.
// A monitor with runsWhen(training) or trainUpdate()/evalUpdate()
// (DifferenceMonitor) that does not record in the current mode is skipped
// before the path is resolved; its forget(), if any, is called instead, so
// that an after() never pairs with the before() of an earlier call.
// The hooks share ownership of `monitor`; the returned handle removes both.
// An unknown path raises c10::ValueError from the call() that resolves it
// (naming the full path and the missing part); a malformed one ("a..b")
// raises here.
// Thread safety: as registerForwardPreHook; the monitor is then driven from
// whichever thread calls the module, so do not call the module from several
// threads at once when the monitor is not thread-safe (DifferenceMonitor is
// not).
template <typename Monitor, typename M>
HookHandle attach(
    std::shared_ptr<Monitor> monitor,
    M&& module,
    std::string path,
    bool prepend = false) {
  TORCH_CHECK_VALUE(
      monitor != nullptr,
      "torch_monitor: attach() needs a monitor, got a null pointer; create "
      "one with std::make_shared<torch_monitor::DifferenceMonitor>(...)");
  return detail::attachMonitor(
      detail::moduleOf(module),
      std::move(path),
      std::make_shared<detail::MonitorAdapter<Monitor>>(std::move(monitor)),
      prepend);
}

} // namespace torch_monitor::nn
