#include <torch_monitor/watch/plan.h>

#include <algorithm>

#include <c10/util/Exception.h>

namespace torch_monitor::watch {

Plan planKeys(
    const std::vector<std::string>& what,
    const Candidates& candidates) {
  TORCH_CHECK_VALUE(
      candidates.trainable.size() == candidates.parameters.size() &&
          candidates.stepped.size() == candidates.parameters.size(),
      "torch_monitor.watch: one trainable and one stepped flag per "
      "parameter, got ",
      candidates.parameters.size(),
      " parameters, ",
      candidates.trainable.size(),
      " and ",
      candidates.stepped.size(),
      " flags");
  std::vector<Kind> kinds;
  for (const std::string& name : what) {
    kinds.push_back(kindFromName(name));
  }
  TORCH_CHECK_VALUE(
      !kinds.empty(),
      "torch_monitor.watch: what= names no kind; give any of \"grad\", "
      "\"weight\", \"update\", \"output\", \"output_grad\"");
  std::sort(kinds.begin(), kinds.end());
  kinds.erase(std::unique(kinds.begin(), kinds.end()), kinds.end());

  Plan plan;
  for (const Kind kind : kinds) {
    const size_t first = plan.keys.size();
    const bool ofParameters = kind < Kind::Output;
    if (ofParameters) {
      for (size_t i = 0; i < candidates.parameters.size(); ++i) {
        // The optimizer skips what it does not hold; a gradient is the
        // same with or without one.
        if (candidates.trainable[i] &&
            (kind == Kind::Grad || candidates.stepped[i])) {
          plan.keys.push_back(Key{candidates.parameters[i], kind});
          plan.targets.push_back(int64_t(i));
        }
      }
    } else {
      for (size_t i = 0; i < candidates.modules.size(); ++i) {
        plan.keys.push_back(Key{candidates.modules[i], kind});
        plan.targets.push_back(int64_t(i));
      }
    }
    TORCH_CHECK_VALUE(
        plan.keys.size() > first,
        "torch_monitor.watch: \"",
        std::string(kindName(kind)),
        ofParameters ? "\" watches parameters, but no parameter is selected "
                     : "\" watches submodules' outputs, but no submodule is "
                       "selected",
        !ofParameters          ? ""
            : kind == Kind::Grad ? "that requires grad "
                                 : "that the optimizer updates ",
        "(see include/exclude)");
  }
  return plan;
}

} // namespace torch_monitor::watch
