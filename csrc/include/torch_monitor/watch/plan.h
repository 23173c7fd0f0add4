#pragma once

// Which keys a watch has and what each observes. One function for both
// worlds: the C++ Watch (watch.h) and Python's watch() (through
// torch.classes.torch_monitor.Watch.plan) choose the same keys, in the same
// order, and refuse the same requests with the same words.

#include <cstdint>
#include <string>
#include <vector>

#include <torch_monitor/export.h>
#include <torch_monitor/watch/recorder.h>

namespace torch_monitor::watch {

// What a model offers once include/exclude chose (each world matches its
// own regular expressions); a plain value.
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
// weight, update) or module (output, output_grad) in the Candidates.
struct Plan {
  std::vector<Key> keys;
  std::vector<int64_t> targets;
};

// Throws c10::ValueError for an unknown kind, no kind, or a kind with
// nothing to watch (saying why: nothing selected, frozen, not stepped).
TORCH_MONITOR_API Plan planKeys(
    const std::vector<std::string>& what,
    const Candidates& candidates);

} // namespace torch_monitor::watch
