#pragma once

// Dotted attribute paths on C++ modules ("weight", "block.state"). C++ has no
// reflection, so a path resolves through what a module registered: submodules
// (register_module), parameters (register_parameter) and buffers
// (register_buffer). Plain C++ members are invisible to it.

#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include <torch_monitor/export.h>

namespace torch {
namespace nn {
class Module;
} // namespace nn
} // namespace torch

namespace torch_monitor::nn {

// A parsed attribute path. Every part but the last names a registered
// submodule; the last names a registered parameter or buffer of that
// submodule (a parameter wins when both exist).
// Thread safety: immutable after construction; resolve() is as safe as
// reading the module's registered parameters concurrently (i.e. not while
// another thread registers or replaces them).
class TORCH_MONITOR_API AttributePath {
 public:
  // c10::ValueError for an empty path or an empty part ("a..b", ".a", "a.").
  explicit AttributePath(std::string path);

  // The tensor the path names on `module` now, as an IValue holding a Tensor
  // (the registered tensor itself, not a copy). c10::ValueError naming the
  // full path and the missing part when it does not resolve, listing what
  // that module has. torch::nn::Module does not list tensors registered
  // undefined, so those do not resolve either.
  c10::IValue resolve(const torch::nn::Module& module) const;

  const std::string& str() const noexcept {
    return path_;
  }
  const std::vector<std::string>& parts() const noexcept {
    return parts_;
  }

 private:
  std::string path_;
  std::vector<std::string> parts_;
};

// How generated TorchScript source reaches one part of a path on a Python
// module: `.name` for an attribute, `[i]` for an index into a ModuleList or
// Sequential (ASCII digits only), `["text"]` for anything else, such as a
// ModuleDict key that is no identifier or is a Python keyword ("class").
// The one place that tells the kinds apart (torch_monitor/monitors.py asks
// it through torch_monitor._C._attribute_path_parts).
enum class PathPartKind { Attribute, Index, Key };
TORCH_MONITOR_API PathPartKind pathPartKind(const std::string& part);

// AttributePath(path).resolve(module), for a one-off lookup.
TORCH_MONITOR_API c10::IValue resolveAttribute(
    const torch::nn::Module& module,
    const std::string& path);

} // namespace torch_monitor::nn
