#include <torch_monitor/script/stat.h>

#include <ATen/core/Tensor.h>

#include <torch_monitor/script/config.h>
#include <torch_monitor/script/registration.h>

namespace torch_monitor::script {

std::chrono::milliseconds windowFromIValue(const c10::IValue& v) {
  TORCH_CHECK_TYPE(
      v.isDouble() || v.isInt(),
      "window_size must be a number of seconds (float or int), got ",
      v.tagKind());
  return windowFromSeconds(v.isDouble() ? v.toDouble() : double(v.toInt()));
}

void upgradeSavedWindow(std::map<std::string, c10::IValue>& values) {
  auto ms = values.find("window_size_ms");
  if (ms != values.end() && ms->second.isInt()) {
    values["window_size"] = static_cast<double>(ms->second.toInt()) / 1000.0;
    values.erase(ms);
  }
}

namespace {

Aggregation aggregationFromIValue(const c10::IValue& v) {
  if (v.isString()) {
    return aggregationFromName(v.toStringRef());
  }
  TORCH_CHECK_TYPE(
      v.isInt(),
      "aggregations must be names (e.g. 'mean') or ints 1..6, got ",
      v.tagKind());
  return aggregationFromInt(v.toInt());
}

// TorchScript has no overloads, so the constructor takes `Any` and accepts a
// list of names or ints, or a single one.
std::vector<Aggregation> aggregationsFromIValue(const c10::IValue& v) {
  std::vector<Aggregation> out;
  if (v.isList()) {
    for (const c10::IValue& item : v.toListRef()) {
      out.push_back(aggregationFromIValue(item));
    }
  } else {
    out.push_back(aggregationFromIValue(v));
  }
  return out;
}

template <typename T>
std::vector<std::string> aggregationNames(const Stat<T>& stat) {
  std::vector<std::string> names;
  for (Aggregation a : stat.aggregations()) {
    names.emplace_back(aggregationName(a));
  }
  return names;
}

// What the constructor runs, and what a saved state is loaded with.
template <typename T>
c10::intrusive_ptr<ScriptStat<T>> makeStat(
    std::string name,
    c10::IValue aggregations,
    c10::IValue windowSize,
    int64_t maxSamples,
    bool closeOnTime,
    std::optional<int64_t> windowSteps,
    bool syncRanks) {
  auto holder = ScriptStat<T>::make(
      std::move(name),
      aggregationsFromIValue(aggregations),
      windowSize.isNone() ? std::nullopt
                          : std::optional(windowFromIValue(windowSize)),
      windowSteps,
      maxSamples,
      closeOnTime ? WindowClose::ON_TIME : WindowClose::LAZY);
  if (syncRanks) {
    holder->stat().syncRanks(nullptr); // the process default group
  }
  return holder;
}

// States of versions 1 to 3 were tuples holding the window in milliseconds
// and a time window as 0 steps (their aggregations as ints, which the
// constructor takes as they are).
void upgradeStatWindow(std::map<std::string, c10::IValue>& values) {
  upgradeSavedWindow(values);
  auto steps = values.find("window_steps");
  if (steps != values.end() && steps->second.isInt()) {
    if (steps->second.toInt() == 0) {
      values.erase(steps); // a time window
    } else {
      values["window_size"] = c10::IValue();
    }
  }
}

// Each version's fields: 2 added close_on_time and window_steps, 3
// sync_ranks. (A function: registration runs during static initialisation,
// maybe before this file's globals are made.)
std::vector<LegacyState> legacyStates() {
  return {
    {1, {"name", "aggregations", "window_size_ms", "max_samples"}, upgradeStatWindow},
    {2,
     {"name", "aggregations", "window_size_ms", "max_samples", "close_on_time",
      "window_steps"},
     upgradeStatWindow},
    {3,
     {"name", "aggregations", "window_size_ms", "max_samples", "close_on_time",
      "window_steps", "sync_ranks"},
     upgradeStatWindow}};
}

template <typename T>
void defineStatClass(torch::Library& m, const char* className) {
  using Holder = ScriptStat<T>;
  auto cls = m.class_<Holder>(className);
  defineFlatten(cls, [](Holder& self) {
    Stat<T>& stat = self.stat();
    return Config{
        {"name", stat.name()},
        {"aggregations", aggregationNames(stat)},
        {"window_size_ms", stat.windowSize().count()},
        {"window_steps", stat.windowSteps()},
        {"max_samples", stat.maxSamples()},
        {"close_on_time", stat.windowClose() == WindowClose::ON_TIME},
        {"sync_ranks", stat.syncsRanks()}};
  });
  // The state holds the constructor's arguments (a time window in seconds,
  // which windowFromSeconds reads back to the millisecond); PyTorch 2's
  // flattened form above keeps the milliseconds its fakes read.
  defineConfigPickle(
      cls,
      /*version=*/4,
      &makeStat<T>,
      [](Holder& self) {
        Stat<T>& stat = self.stat();
        const int64_t steps = stat.windowSteps();
        return Config{
            {"name", stat.name()},
            {"aggregations", aggregationNames(stat)},
            {"window_size",
             steps > 0 ? c10::IValue()
                       : c10::IValue(secondsOfWindow(stat.windowSize()))},
            {"max_samples", stat.maxSamples()},
            {"close_on_time", stat.windowClose() == WindowClose::ON_TIME},
            {"window_steps", steps > 0 ? c10::IValue(steps) : c10::IValue()},
            {"sync_ranks", stat.syncsRanks()}};
      },
      legacyStates());
  cls.def(
          torch::init(textChecked(&makeStat<T>)),
          std::is_same_v<T, double>
              ? "Windowed aggregations of float samples, compatible with "
                "torch.monitor.Stat.\n\n"
                "Samples added in a window (add(v): a number, or a tensor whose "
                "every element is one sample, on any device, never read on the "
                "host until the window closes) are aggregated as "
                "`aggregations` say (Aggregation members, names such as "
                "'mean', or ints 1..6). When the window ends, the next add() "
                "(or, with close_on_time=True, the window timer) logs a "
                "'torch.monitor.Stat' event with '<name>.<aggregation>' keys "
                "and the training step (set_step), and get() returns it.\n\n"
                "Give exactly one window: window_size (seconds or a "
                "datetime.timedelta) or window_steps (training steps; the "
                "window ends when set_step crosses a multiple). max_samples "
                "caps the samples of a window. sync_ranks=True (or a "
                "torch.distributed process group) merges each window across "
                "the ranks (docs/distributed.md)."
              : "Like Stat, for int samples (ints, or integer and bool "
                "tensors); every aggregate is an int, SUM and MEAN wrap "
                "modulo 2**64.",
          {torch::arg("name"),
           torch::arg("aggregations"),
           torch::arg("window_size") = c10::IValue(),
           torch::arg("max_samples") = Stat<T>::kUnlimitedSamples,
           torch::arg("close_on_time") = false,
           torch::arg("window_steps") = c10::IValue(),
           torch::arg("sync_ranks") = false})
      .def(
          "add",
          [](const c10::intrusive_ptr<Holder>& self, c10::IValue value) {
            self->addValue(value);
          },
          "Adds a sample: a number, or a tensor whose every element is one "
          "sample (on any device; an accelerator tensor is not read until "
          "the window closes)",
          // `v`: torch.monitor's name, for callers using keywords.
          {torch::arg("v")})
      .def(
          "add_tensor",
          [](const c10::intrusive_ptr<Holder>& self, const at::Tensor& values) {
            self->stat().add(values);
          },
          "Adds every element of `values` as one sample (add() with a tensor, "
          "typed for callers that need one signature per method)",
          {torch::arg("values")})
      .def(
          "get",
          [](const c10::intrusive_ptr<Holder>& self) {
            c10::Dict<std::string, T> out;
            for (const auto& [aggregation, value] : self->stat().get()) {
              out.insert(aggregationName(aggregation), value);
            }
            return out;
          },
          "The aggregated values of the last closed window, by aggregation "
          "(empty before the first window closes)")
      .def(
          "count",
          [](const c10::intrusive_ptr<Holder>& self) {
            return self->stat().count();
          },
          "The number of samples in the open window")
      .def(
          "name",
          [](const c10::intrusive_ptr<Holder>& self) {
            return self->stat().name();
          },
          "The stat's name, which its events' keys start with")
      .def(
          "window_size_ms",
          [](const c10::intrusive_ptr<Holder>& self) -> int64_t {
            return self->stat().windowSize().count();
          },
          "The time window in milliseconds (0 for a window of steps)")
      .def(
          "window_steps",
          [](const c10::intrusive_ptr<Holder>& self) -> int64_t {
            return self->stat().windowSteps();
          },
          "The window in training steps (0 for a time window)")
      .def(
          "max_samples",
          [](const c10::intrusive_ptr<Holder>& self) {
            return self->stat().maxSamples();
          },
          "The most samples a window takes; later ones until it closes are "
          "dropped")
      .def(
          "close_on_time",
          [](const c10::intrusive_ptr<Holder>& self) {
            return self->stat().windowClose() == WindowClose::ON_TIME;
          },
          "Whether a window also closes on time, with no sample to close it")
      .def(
          "sync_ranks",
          [](const c10::intrusive_ptr<Holder>& self) {
            return self->stat().syncsRanks();
          },
          "Whether each window is merged across the ranks of a process group")
      .def(
          "aggregations",
          [](const c10::intrusive_ptr<Holder>& self) {
            return aggregationNames(self->stat());
          },
          "The aggregations logged per window, by name");
}

} // namespace

template <typename T>
c10::intrusive_ptr<ScriptStat<T>> ScriptStat<T>::make(
    std::string name,
    std::vector<Aggregation> aggregations,
    std::optional<std::chrono::milliseconds> window,
    std::optional<int64_t> windowSteps,
    int64_t maxSamples,
    WindowClose windowClose) {
  TORCH_CHECK_VALUE(
      window.has_value() != windowSteps.has_value(),
      "Stat '",
      name,
      "': give exactly one of window_size (a time window) and window_steps "
      "(a window of training steps), got ",
      window ? "both" : "neither");
  if (windowSteps) {
    TORCH_CHECK_VALUE(
        windowClose == WindowClose::LAZY,
        "Stat '",
        name,
        "': close_on_time applies to time windows (window_size); a window "
        "of training steps closes when set_step crosses its end");
    return c10::make_intrusive<ScriptStat>(
        std::move(name),
        std::move(aggregations),
        WindowSteps{*windowSteps},
        maxSamples);
  }
  return c10::make_intrusive<ScriptStat>(
      std::move(name), std::move(aggregations), *window, maxSamples, windowClose);
}

template <typename T>
void ScriptStat<T>::addValue(const c10::IValue& value) {
  constexpr bool kFloat = std::is_same_v<T, double>;
  if (value.isTensor()) {
    stat_.add(value.toTensor());
  } else if (value.isInt()) {
    stat_.add(static_cast<T>(value.toInt()));
  } else {
    TORCH_CHECK_TYPE(
        kFloat && value.isDouble(),
        kFloat ? "Stat" : "IntStat",
        ".add takes ",
        kFloat ? "a float, an int" : "an int",
        " or a tensor, got ",
        value.tagKind());
    stat_.add(static_cast<T>(value.toDouble()));
  }
}

template class ScriptStat<double>;
template class ScriptStat<int64_t>;

void registerStatClasses(torch::Library& m) {
  defineStatClass<double>(m, "Stat");
  defineStatClass<int64_t>(m, "IntStat");
  // A read: CONSERVATIVE, so that the JIT keeps it where it is; not
  // traceable by PyTorch 2 (torch_monitor._fake says so), as get_step.
  m.def(torch::schema(
      "live_stat_names() -> str[]", c10::AliasAnalysisKind::CONSERVATIVE));
  m.impl(
      "live_stat_names",
      c10::DispatchKey::CompositeExplicitAutograd,
      []() { return liveStatNames(); });
}

} // namespace torch_monitor::script
