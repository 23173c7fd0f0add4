#pragma once

// torch_monitor::nn::call(module, args...): module->forward(args...) with the
// module's hooks around it. C++ forward() is not virtual and
// torch::nn::Module has no call operator of its own to hook into, so the
// hooks run only for calls made through this function: write
// `call(model, x)` where you would write `model->forward(x)` or `model(x)`.

#include <array>
#include <type_traits>
#include <utility>

#include <torch_monitor/nn/forward_call.h>
#include <torch_monitor/nn/hooks.h>

namespace torch_monitor::nn {

// Calls `module`'s forward() with `args` perfectly forwarded (any signature,
// overloads and default arguments resolve as in a direct call), running its
// forward pre-hooks before and its forward hooks after. Returns what forward()
// returned, as modified by the hooks. `module` is a holder
// (torch::nn::Linear, a TORCH_MODULE type), a std::shared_ptr<M> or an M&.
// Without any hook registered anywhere it costs one atomic load over a
// direct call. An exception from a hook or from forward() propagates; hooks
// after it do not run.
// Thread safety: as safe as calling forward() itself; the hooks run on the
// calling thread.
template <typename M, typename... Args>
auto call(M&& module, Args&&... args)
    -> decltype(detail::implOf(module).forward(std::forward<Args>(args)...)) {
  using Result =
      decltype(detail::implOf(module).forward(std::forward<Args>(args)...));
  auto& impl = detail::implOf(module);
  if (!detail::anyHooks()) {
    return impl.forward(std::forward<Args>(args)...);
  }
  torch::nn::Module& base = impl;
  // The hooks see the arguments through pointers into this frame; nothing
  // is copied.
  const std::array<detail::ErasedRef, sizeof...(Args)> refs{
      detail::ErasedRef::of(args)...};
  const ForwardArgs view(refs.data(), refs.size());
  detail::runPreHooks(base, view);
  if constexpr (std::is_void_v<Result>) {
    impl.forward(std::forward<Args>(args)...);
    ForwardOutput output;
    detail::runPostHooks(base, view, output);
  } else {
    Result result = impl.forward(std::forward<Args>(args)...);
    ForwardOutput output(detail::ErasedRef::of(result));
    detail::runPostHooks(base, view, output);
    if constexpr (std::is_reference_v<Result>) {
      return static_cast<Result>(result);
    } else {
      return result;
    }
  }
}

} // namespace torch_monitor::nn
