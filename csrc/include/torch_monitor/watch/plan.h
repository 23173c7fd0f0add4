#pragma once

// Which keys a watch has and what each observes. One function for both
// worlds: the C++ Watch (watch.h) and Python's watch() (through
// torch.classes.torch_monitor.Watch.plan) select the same parameters and
// modules (include/exclude, read as ECMAScript regular expressions in both),
// choose the same keys in the same order, and refuse the same requests with
// the same words. observedOutput() is the one rule of which output a
// module's key observes.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch_monitor/export.h>
#include <torch_monitor/nn/forward_call.h>
#include <torch_monitor/watch/recorder.h>

namespace torch_monitor::watch {

// What a model offers (each world lists its own parameters and modules);
// a plain value.
struct Candidates {
  // Parameter paths in the model's order, each tensor once.
  std::vector<std::string> parameters;
  // Per parameter: it requires grad (frozen ones are never watched) and the
  // optimizer updates it (all of them where there is no optimizer).
  std::vector<bool> trainable;
  std::vector<bool> stepped;
  // Submodule paths (the root is not among them).
  std::vector<std::string> modules;
};

// The keys in slot order: the kinds in Kind's order, each kind's targets in
// the model's order; `targets[i]` is the index of key i's parameter (grad,
// weight, update) or module (output, output_grad) in the Candidates, or -1
// for "total.grad" and "total.update" (after their kind's keys: every
// gradient, or update, of a step).
struct Plan {
  std::vector<Key> keys;
  std::vector<int64_t> targets;
};

// Which paths a watch selects: those `include` finds (all when unset), but
// not those `exclude` finds (regular expressions searched in each path).
// Thread safety: immutable after construction.
class TORCH_MONITOR_API Selection {
 public:
  // Throws c10::ValueError for a pattern that is not a regular expression.
  Selection(std::optional<std::string> include, std::optional<std::string> exclude);
  ~Selection();
  bool selects(const std::string& path) const;
  // Throws c10::ValueError when include or exclude finds no path at all
  // among `paths` (a typo would otherwise watch everything or nothing).
  void checkMatched(const std::vector<std::string>& parameters, const std::vector<std::string>& modules) const;

 private:
  struct Patterns;
  std::optional<std::string> include_;
  std::optional<std::string> exclude_;
  std::unique_ptr<Patterns> patterns_;
};

// The one rule of which tensor a module's output keys observe: the output
// itself, or the first element of a tuple or list (nn::LSTM's
// tuple<Tensor, tuple<Tensor, Tensor>>, nn::MultiheadAttention's pair, a
// vector of tensors), when it is a defined floating-point or complex tensor; nullptr
// for any other output (nothing is observed). Python's watch() reads
// outputs by the same rule (torch_monitor/watch.py, _observed_tensor: a
// Python hook cannot call C++ without breaking torch.compile's graph); the
// tests Watch.OutputsOfTuplesObserveTheirFirstTensor (C++) and
// test_watch.py::test_outputs_of_tuples_observe_their_first_tensor hold
// both worlds to it with the same models.
TORCH_MONITOR_API const at::Tensor* observedOutput(const nn::ForwardOutput& output);

// Throws c10::ValueError for an unknown kind, no kind, an include/exclude
// that is not a regular expression or finds nothing, or a kind with nothing
// to watch (saying why: nothing selected, frozen, not stepped). Candidates
// not selected are not watched; `targets` index all of them.
TORCH_MONITOR_API Plan planKeys(
    const std::vector<std::string>& what,
    const Candidates& candidates,
    const Selection& selection = Selection(std::nullopt, std::nullopt));

} // namespace torch_monitor::watch
