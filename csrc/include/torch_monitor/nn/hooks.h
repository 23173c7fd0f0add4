#pragma once

// Forward pre/post hooks for C++ torch::nn modules, which have none of their
// own (PyTorch issue 25888). Hooks live in a process-wide registry keyed by
// the module object, so they are attached without touching the module's code
// or type; they run when the module is called through
// torch_monitor::nn::call (call.h), since C++ forward() is not virtual.
//
// Only declarations of torch::nn::Module are needed here: every function that
// touches a concrete module is a template instantiated where the user's
// module type (and so torch/nn/module.h) is complete.

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include <torch_monitor/export.h>
#include <torch_monitor/nn/forward_call.h>

namespace torch {
namespace nn {
class Module;
} // namespace nn
namespace detail {
struct ModuleHolderIndicator; // base of torch::nn::ModuleHolder (pimpl.h)
} // namespace detail
} // namespace torch

namespace torch_monitor::nn {

// Runs before forward(), with the module and its arguments. Read
// `module.is_training()` for the train/eval mode of this call.
using ForwardPreHook =
    std::function<void(torch::nn::Module& module, const ForwardArgs& args)>;
// Runs after forward() returned, with the module, its arguments (as seen
// after forward(): an argument forward() moved from reads moved-from) and the
// result, which the hook may modify in place. Not run when forward() throws.
using ForwardHook = std::function<void(
    torch::nn::Module& module,
    const ForwardArgs& args,
    ForwardOutput& output)>;

namespace detail {

struct HookRecord; // one registered hook (hooks.cpp)

template <typename T>
struct IsSharedPtr : std::false_type {};
template <typename T>
struct IsSharedPtr<std::shared_ptr<T>> : std::true_type {};

// The module object behind what users hold: a holder (torch::nn::Linear), a
// std::shared_ptr<M>, or a reference to the module itself. Holders and
// shared_ptrs have pointer semantics: a const one still calls a non-const
// forward(), as `linear->forward(x)` does.
template <typename M>
decltype(auto) implOf(M& module) {
  using Bare = std::remove_cv_t<M>;
  if constexpr (std::is_base_of_v<torch::detail::ModuleHolderIndicator, Bare>) {
    return *module.ptr(); // ptr() checks for an empty holder
  } else if constexpr (IsSharedPtr<Bare>::value) {
    TORCH_CHECK_VALUE(
        module != nullptr,
        "torch_monitor: the module pointer is null; pass a module created "
        "with std::make_shared or a module holder such as torch::nn::Linear");
    return *module;
  } else {
    static_assert(
        std::is_base_of_v<torch::nn::Module, Bare>,
        "torch_monitor::nn: pass a torch::nn::Module subclass, a "
        "std::shared_ptr to one, or a module holder (torch::nn::Linear, "
        "a TORCH_MODULE type)");
    return (module);
  }
}

template <typename M>
torch::nn::Module& moduleOf(M& module) {
  return detail::implOf(module);
}

// False while no module anywhere has a hook: call() then goes straight to
// forward() (one atomic load).
TORCH_MONITOR_API bool anyHooks() noexcept;
// Run the hooks of `module` registered at the moment of the call, in order,
// on the calling thread and without any lock held. A hook removed before its
// turn does not run, even when removed by an earlier hook of the same call.
TORCH_MONITOR_API void runPreHooks(
    torch::nn::Module& module,
    const ForwardArgs& args);
TORCH_MONITOR_API void runPostHooks(
    torch::nn::Module& module,
    const ForwardArgs& args,
    ForwardOutput& output);

} // namespace detail

// Removes the hook(s) it was returned for. Copies refer to the same hooks.
// Dropping a handle does not remove anything (as in Python), and a handle
// does not keep a hook (or what it captured) alive: removal frees it (once a
// call running it returns). A hook also goes away with its module: hooks of
// a destroyed module never run, and are freed at a later registration.
// Thread safety: remove() and active() may be called from any thread, also
// from inside any hook (including the hook being removed), concurrently with
// call() on the module.
class TORCH_MONITOR_API HookHandle {
 public:
  HookHandle() noexcept;
  ~HookHandle();
  HookHandle(const HookHandle&);
  HookHandle(HookHandle&&) noexcept;
  HookHandle& operator=(const HookHandle&);
  HookHandle& operator=(HookHandle&&) noexcept;

  // Removes the hooks; a hook not yet reached in a call in progress does not
  // run. Idempotent.
  void remove();
  // Whether any of its hooks is still registered on a live module.
  bool active() const noexcept;

  // One handle for several registrations (e.g. a monitor's pre and post
  // hook): removing it removes them all.
  void merge(const HookHandle& other);

  // Internal: what the register functions return.
  explicit HookHandle(std::shared_ptr<detail::HookRecord> record);

 private:
  std::vector<std::weak_ptr<detail::HookRecord>> records_;
};

// Registers `hook` to run before every forward() of `module` made through
// torch_monitor::nn::call; after the module's other pre-hooks, or before them
// with `prepend`. The module must be owned by a std::shared_ptr (created with
// std::make_shared, a module holder, or register_module): that is how a hook
// tells a live module from a new one at the address of a destroyed one.
// c10::ValueError otherwise, or for an empty hook.
// Thread safety: any thread (the registry has a lock, never held while hooks
// run: hooks may register and remove hooks and call modules).
TORCH_MONITOR_API HookHandle registerForwardPreHook(
    torch::nn::Module& module,
    ForwardPreHook hook,
    bool prepend = false);
// The same for a hook run after every forward().
TORCH_MONITOR_API HookHandle registerForwardHook(
    torch::nn::Module& module,
    ForwardHook hook,
    bool prepend = false);

// The same for a holder (torch::nn::Linear), a std::shared_ptr<M> or an M&.
template <typename M>
HookHandle registerForwardPreHook(
    M&& module,
    ForwardPreHook hook,
    bool prepend = false) {
  return registerForwardPreHook(
      detail::moduleOf(module), std::move(hook), prepend);
}
template <typename M>
HookHandle registerForwardHook(
    M&& module,
    ForwardHook hook,
    bool prepend = false) {
  return registerForwardHook(
      detail::moduleOf(module), std::move(hook), prepend);
}

} // namespace torch_monitor::nn
