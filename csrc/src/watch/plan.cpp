#include <torch_monitor/watch/plan.h>

#include <algorithm>
#include <regex>
#include <tuple>

#include <c10/util/Exception.h>

#include <torch_monitor/detail/pattern.h>

namespace torch_monitor::watch {
namespace {

bool finds(const std::optional<std::regex>& regex, const std::string& path) {
  return regex && std::regex_search(path, *regex);
}

} // namespace

const at::Tensor* observedOutput(const nn::ForwardOutput& output) {
  const at::Tensor* tensor = output.getIf<at::Tensor>();
  if (tensor == nullptr) {
    if (const auto* pair = output.getIf<std::tuple<at::Tensor, at::Tensor>>()) {
      tensor = &std::get<0>(*pair);
    } else if (
        const auto* lstm = output.getIf<
            std::tuple<at::Tensor, std::tuple<at::Tensor, at::Tensor>>>()) {
      tensor = &std::get<0>(*lstm);
    } else if (const auto* list = output.getIf<std::vector<at::Tensor>>()) {
      tensor = list->empty() ? nullptr : &list->front();
    }
  }
  return tensor != nullptr && tensor->defined() &&
          (tensor->is_floating_point() || tensor->is_complex())
      ? tensor
      : nullptr;
}

struct Selection::Patterns {
  std::optional<std::regex> include;
  std::optional<std::regex> exclude;
};

Selection::Selection(
    std::optional<std::string> include,
    std::optional<std::string> exclude)
    : include_(std::move(include)),
      exclude_(std::move(exclude)),
      patterns_(std::make_unique<Patterns>(Patterns{
          detail::compiledPattern(include_, "torch_monitor.watch: ", "include"),
          detail::compiledPattern(exclude_, "torch_monitor.watch: ", "exclude")})) {}

Selection::~Selection() = default;

bool Selection::selects(const std::string& path) const {
  return (!patterns_->include || finds(patterns_->include, path)) &&
      !finds(patterns_->exclude, path);
}

void Selection::checkMatched(
    const std::vector<std::string>& parameters,
    const std::vector<std::string>& modules) const {
  for (const auto& [regex, pattern, name] :
       {std::make_tuple(&patterns_->include, &include_, "include"),
        std::make_tuple(&patterns_->exclude, &exclude_, "exclude")}) {
    if (!*regex) {
      continue;
    }
    const auto found = [&](const std::vector<std::string>& paths) {
      return std::any_of(paths.begin(), paths.end(), [&](const auto& p) {
        return finds(*regex, p);
      });
    };
    TORCH_CHECK_VALUE(
        found(parameters) || found(modules),
        "torch_monitor.watch: ",
        name,
        "='",
        **pattern,
        "' matches no parameter path (like '",
        parameters.empty() ? std::string("fc1.weight") : parameters.front(),
        "') and no module path (like '",
        modules.empty() ? std::string("fc1") : modules.front(),
        "') of the model; see named_parameters() and named_modules()");
  }
}

Plan planKeys(
    const std::vector<std::string>& what,
    const Candidates& candidates,
    const Selection& selection) {
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
  selection.checkMatched(candidates.parameters, candidates.modules);
  for (const auto* paths : {&candidates.parameters, &candidates.modules}) {
    TORCH_CHECK_VALUE(
        std::find(paths->begin(), paths->end(), kTotalPath) == paths->end(),
        "torch_monitor.watch: the model has a ",
        paths == &candidates.parameters ? "parameter" : "submodule",
        " at the path '",
        kTotalPath,
        "', the path of the watch's whole-model keys (total.grad, "
        "total.update); rename it");
  }

  Plan plan;
  for (const Kind kind : kinds) {
    const size_t first = plan.keys.size();
    const bool ofParameters = kind < Kind::Output;
    if (ofParameters) {
      for (size_t i = 0; i < candidates.parameters.size(); ++i) {
        // The optimizer skips what it does not hold; a gradient is the
        // same with or without one.
        if (selection.selects(candidates.parameters[i]) &&
            candidates.trainable[i] &&
            (kind == Kind::Grad || candidates.stepped[i])) {
          plan.keys.push_back(Key{candidates.parameters[i], kind});
          plan.targets.push_back(int64_t(i));
        }
      }
    } else {
      for (size_t i = 0; i < candidates.modules.size(); ++i) {
        if (!selection.selects(candidates.modules[i])) {
          continue;
        }
        plan.keys.push_back(Key{candidates.modules[i], kind});
        plan.targets.push_back(int64_t(i));
      }
    }
    if ((kind == Kind::Grad || kind == Kind::Update) &&
        plan.keys.size() > first) {
      // The whole model's, after the parameters' keys (no target).
      plan.keys.push_back(Key{kTotalPath, kind});
      plan.targets.push_back(-1);
    }
    // A model without submodules (one nn.Linear) has no output to watch:
    // the model's own output is the training loop's, not a layer's.
    const bool noSubmodule = !ofParameters && candidates.modules.empty();
    TORCH_CHECK_VALUE(
        plan.keys.size() > first,
        "torch_monitor.watch: \"",
        std::string(kindName(kind)),
        ofParameters ? "\" watches parameters, but no parameter is selected "
                     : "\" watches submodules' outputs, but ",
        !ofParameters          ? ""
            : kind == Kind::Grad ? "that requires grad "
                                 : "that the optimizer updates ",
        noSubmodule ? "the model has no submodule (its own output is not "
                      "a layer's: log it with a Stat, or drop \"" +
                std::string(kindName(kind)) + "\" from what=)"
                    : ofParameters ? "(see include/exclude)"
                                   : "no submodule is selected (see "
                                     "include/exclude)");
  }
  return plan;
}

} // namespace torch_monitor::watch
