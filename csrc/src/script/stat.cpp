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
void defineStatClass(torch::Library& m, const char* className) {
  using Holder = ScriptStat<T>;
  auto cls = m.class_<Holder>(className);
  defineFlatten(cls, [](Holder& self) {
    Stat<T>& stat = self.stat();
    std::vector<std::string> aggregations;
    for (Aggregation a : stat.aggregations()) {
      aggregations.emplace_back(aggregationName(a));
    }
    return Config{
        {"name", stat.name()},
        {"aggregations", std::move(aggregations)},
        {"window_size_ms", stat.windowSize().count()},
        {"window_steps", stat.windowSteps()},
        {"max_samples", stat.maxSamples()},
        {"close_on_time", stat.windowClose() == WindowClose::ON_TIME},
        {"sync_ranks", stat.syncsRanks()}};
  });
  cls.def(
          torch::init(textChecked([](std::string name,
                         c10::IValue aggregations,
                         c10::IValue windowSize,
                         int64_t maxSamples,
                         bool closeOnTime,
                         std::optional<int64_t> windowSteps,
                         bool syncRanks) {
            auto holder = Holder::make(
                std::move(name),
                aggregationsFromIValue(aggregations),
                windowSize.isNone()
                    ? std::nullopt
                    : std::optional(windowFromIValue(windowSize)),
                windowSteps,
                maxSamples,
                closeOnTime ? WindowClose::ON_TIME : WindowClose::LAZY);
            if (syncRanks) {
              holder->stat().syncRanks(nullptr); // the process default group
            }
            return holder;
          })),
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
          {torch::arg("value")})
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
          })
      .def(
          "count",
          [](const c10::intrusive_ptr<Holder>& self) {
            return self->stat().count();
          })
      .def(
          "name",
          [](const c10::intrusive_ptr<Holder>& self) {
            return self->stat().name();
          })
      .def(
          "window_size_ms",
          [](const c10::intrusive_ptr<Holder>& self) -> int64_t {
            return self->stat().windowSize().count();
          })
      .def(
          "window_steps",
          [](const c10::intrusive_ptr<Holder>& self) -> int64_t {
            return self->stat().windowSteps();
          })
      .def(
          "max_samples",
          [](const c10::intrusive_ptr<Holder>& self) {
            return self->stat().maxSamples();
          })
      .def(
          "close_on_time",
          [](const c10::intrusive_ptr<Holder>& self) {
            return self->stat().windowClose() == WindowClose::ON_TIME;
          })
      .def(
          "sync_ranks",
          [](const c10::intrusive_ptr<Holder>& self) {
            return self->stat().syncsRanks();
          })
      .def(
          "aggregations",
          [](const c10::intrusive_ptr<Holder>& self) {
            std::vector<std::string> names;
            for (Aggregation a : self->stat().aggregations()) {
              names.emplace_back(aggregationName(a));
            }
            return names;
          })
      .def_pickle(
          [](const c10::intrusive_ptr<Holder>& self) { return self->state(); },
          [](c10::IValue state) {
            checkTextIn(state, "Stat's saved state");
            return Holder::fromState(state);
          });
}

} // namespace

template <typename T>
typename ScriptStat<T>::State ScriptStat<T>::state() const {
  std::vector<int64_t> aggregations;
  for (Aggregation a : stat_.aggregations()) {
    aggregations.push_back(static_cast<int64_t>(a));
  }
  return State(
      kStateVersion,
      stat_.name(),
      std::move(aggregations),
      stat_.windowSize().count(),
      stat_.maxSamples(),
      stat_.windowClose() == WindowClose::ON_TIME,
      stat_.windowSteps(),
      stat_.syncsRanks());
}

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
typename ScriptStat<T>::State ScriptStat<T>::upgrade(const StateV1& old) {
  const auto& [version, name, aggregations, windowMs, maxSamples] = old;
  TORCH_CHECK(
      version == 1,
      "cannot load a torch_monitor Stat saved with state version ",
      version,
      " and 5 fields; version 1 has 5 fields, version 2 has 7, version ",
      kStateVersion,
      " has 8. The file is corrupted or from another torch_monitor.");
  return upgrade(StateV2(2, name, aggregations, windowMs, maxSamples, false, 0));
}

template <typename T>
typename ScriptStat<T>::State ScriptStat<T>::upgrade(const StateV2& old) {
  const auto& [version, name, aggregations, windowMs, maxSamples, closeOnTime, steps] =
      old;
  TORCH_CHECK(
      version == 2,
      "cannot load a torch_monitor Stat saved with state version ",
      version,
      " and 7 fields; version 2 has 7 fields, version ",
      kStateVersion,
      " has 8. The file is corrupted or from another torch_monitor.");
  return State(
      kStateVersion,
      name,
      aggregations,
      windowMs,
      maxSamples,
      closeOnTime,
      steps,
      false);
}

template <typename T>
c10::intrusive_ptr<ScriptStat<T>> ScriptStat<T>::fromState(
    const c10::IValue& state) {
  const bool tuple = state.isTuple();
  const size_t size = tuple ? state.toTupleRef().elements().size() : 0;
  TORCH_CHECK(
      (size == 5 || size == 7 || size == 8) &&
          state.toTupleRef().elements()[0].isInt(),
      "cannot load a torch_monitor Stat: its saved state is not a versioned "
      "tuple of 5, 7 or 8 fields (a corrupted or foreign file?)");
  const auto& f = state.toTupleRef().elements();
  const auto ints = [&](const c10::IValue& list) {
    std::vector<int64_t> out;
    for (const c10::IValue& item : list.toListRef()) {
      TORCH_CHECK(
          item.isInt(),
          "cannot load a torch_monitor Stat: its saved aggregations are not "
          "ints (a corrupted or foreign file?)");
      out.push_back(item.toInt());
    }
    return out;
  };
  TORCH_CHECK(
      f[1].isString() && f[2].isList() && f[3].isInt() && f[4].isInt() &&
          (size == 5 || (f[5].isBool() && f[6].isInt())) &&
          (size < 8 || f[7].isBool()),
      "cannot load a torch_monitor Stat saved with state version ",
      f[0].toInt(),
      ": its fields have unexpected types (a corrupted or foreign file?)");
  if (size == 5) {
    return fromState(upgrade(StateV1(
        f[0].toInt(),
        f[1].toStringRef(),
        ints(f[2]),
        f[3].toInt(),
        f[4].toInt())));
  }
  if (size == 7) {
    return fromState(upgrade(StateV2(
        f[0].toInt(),
        f[1].toStringRef(),
        ints(f[2]),
        f[3].toInt(),
        f[4].toInt(),
        f[5].toBool(),
        f[6].toInt())));
  }
  return fromState(State(
      f[0].toInt(),
      f[1].toStringRef(),
      ints(f[2]),
      f[3].toInt(),
      f[4].toInt(),
      f[5].toBool(),
      f[6].toInt(),
      f[7].toBool()));
}

template <typename T>
c10::intrusive_ptr<ScriptStat<T>> ScriptStat<T>::fromState(State state) {
  auto& [version, name, aggregationInts, windowMs, maxSamples, closeOnTime, steps, syncRanks] =
      state;
  TORCH_CHECK(
      version == kStateVersion,
      "cannot load a torch_monitor Stat saved with state version ",
      version,
      "; this build reads version ",
      kStateVersion,
      " (and 1, 2). Load the model with the torch_monitor release that saved "
      "it.");
  std::vector<Aggregation> aggregations;
  for (int64_t a : aggregationInts) {
    aggregations.push_back(aggregationFromInt(a));
  }
  auto holder = make(
      std::move(name),
      std::move(aggregations),
      steps == 0 ? std::optional(std::chrono::milliseconds(windowMs))
                 : std::nullopt,
      steps == 0 ? std::nullopt : std::optional(steps),
      maxSamples,
      closeOnTime ? WindowClose::ON_TIME : WindowClose::LAZY);
  if (syncRanks) {
    holder->stat().syncRanks(nullptr); // the process default group
  }
  return holder;
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
}

} // namespace torch_monitor::script
