#include <torch_monitor/script/wait_counter.h>

#include <torch_monitor/script/config.h>
#include <torch_monitor/script/registration.h>
#include <torch_monitor/script/stat.h>

namespace torch_monitor::script {

ScriptWaitCounter::State ScriptWaitCounter::state() const {
  const Stat<double>& stat = counter_.stat();
  return State(
      kStateVersion,
      stat.name(),
      stat.windowSize().count(),
      stat.windowClose() == WindowClose::ON_TIME);
}

c10::intrusive_ptr<ScriptWaitCounter> ScriptWaitCounter::fromState(
    const c10::IValue& state) {
  const bool fits = state.isTuple() &&
      state.toTupleRef().elements().size() == 4 &&
      state.toTupleRef().elements()[0].isInt();
  TORCH_CHECK(
      fits,
      "cannot load a torch_monitor WaitCounter: its saved state is not a "
      "versioned tuple of 4 fields (a corrupted or foreign file?)");
  const auto& f = state.toTupleRef().elements();
  TORCH_CHECK(
      f[0].toInt() == kStateVersion,
      "cannot load a torch_monitor WaitCounter saved with state version ",
      f[0].toInt(),
      "; this build reads version ",
      kStateVersion,
      ". Load the model with the torch_monitor release that saved it.");
  TORCH_CHECK(
      f[1].isString() && f[2].isInt() && f[3].isBool(),
      "cannot load a torch_monitor WaitCounter: its saved fields have "
      "unexpected types (a corrupted or foreign file?)");
  return c10::make_intrusive<ScriptWaitCounter>(
      f[1].toStringRef(),
      std::chrono::milliseconds(f[2].toInt()),
      f[3].toBool() ? WindowClose::ON_TIME : WindowClose::LAZY);
}

void ScriptWaitCounterTracker::enter() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(
      !guard_.has_value(),
      "WaitCounter '",
      counter_->counter().key(),
      "': this guard is already timing a unit of work (entered twice "
      "without __exit__); call guard() again for each unit, nested ones "
      "included");
  guard_.emplace(counter_->counter().guard());
}

void ScriptWaitCounterTracker::exit() {
  std::optional<WaitCounter::Guard> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!guard_.has_value()) {
      return;
    }
    finished.emplace(std::move(*guard_));
    guard_.reset();
  }
  // Outside the lock: recording may close a window and run handlers.
  finished->stop();
}

void registerWaitCounterClasses(torch::Library& m) {
  using Counter = ScriptWaitCounter;
  using Tracker = ScriptWaitCounterTracker;
  const auto configOf = [](const WaitCounter& c) {
    return Config{
        {"key", c.key()},
        {"window_size_ms", c.stat().windowSize().count()},
        {"close_on_time", c.stat().windowClose() == WindowClose::ON_TIME}};
  };
  // The tracker first: the counter's guard() returns one.
  auto tracker = m.class_<Tracker>("WaitCounterTracker");
  // A tracker is configured by its counter alone.
  defineFlatten(tracker, [configOf](const Tracker& self) {
    return configOf(self.counter()->counter());
  });
  tracker
      // TorchScript's `with` calls these. __enter__ must return a value
      // (TorchScript rejects a method returning nothing there): the
      // tracker, which `as` binds (torch.monitor's binds None).
      .def(
          "__enter__",
          [](const c10::intrusive_ptr<Tracker>& self) {
            self->enter();
            return self;
          })
      .def(
          "__exit__",
          [](const c10::intrusive_ptr<Tracker>& self,
             const c10::IValue& /*type*/,
             const c10::IValue& /*value*/,
             const c10::IValue& /*traceback*/) { self->exit(); });

  auto counter = m.class_<Counter>("WaitCounter");
  defineFlatten(counter, [configOf](const Counter& self) {
    return configOf(self.counter());
  });
  counter
      .def(
          torch::init(textChecked([](std::string key,
                         const c10::IValue& windowSize,
                         bool closeOnTime) {
            return c10::make_intrusive<Counter>(
                std::move(key),
                windowFromIValue(windowSize),
                closeOnTime ? WindowClose::ON_TIME : WindowClose::LAZY);
          })),
          "A named duration counter (torch.monitor's _WaitCounter). Each "
          "unit of work timed by `with counter.guard():` is one sample, its "
          "duration in microseconds, of a Stat named after the key, which "
          "logs count, sum (total), max and mean per window (window_size: "
          "seconds, or a datetime.timedelta in Python).",
          {torch::arg("key"),
           torch::arg("window_size") =
               double(WaitCounter::kDefaultWindow.count()) / 1000.0,
           torch::arg("close_on_time") = false})
      .def(
          "guard",
          [](const c10::intrusive_ptr<Counter>& self) {
            return c10::make_intrusive<Tracker>(self);
          },
          "A context manager timing one unit of work: `with counter.guard(): "
          "...` (a WaitCounterTracker)")
      .def(
          "key",
          [](const c10::intrusive_ptr<Counter>& self) {
            return self->counter().key();
          })
      .def(
          "window_size_ms",
          [](const c10::intrusive_ptr<Counter>& self) -> int64_t {
            return self->counter().stat().windowSize().count();
          })
      .def(
          "close_on_time",
          [](const c10::intrusive_ptr<Counter>& self) {
            return self->counter().stat().windowClose() == WindowClose::ON_TIME;
          })
      .def(
          "get",
          [](const c10::intrusive_ptr<Counter>& self) {
            c10::Dict<std::string, double> out;
            for (const auto& [aggregation, value] :
                 self->counter().stat().get()) {
              out.insert(aggregationName(aggregation), value);
            }
            return out;
          })
      .def_pickle(
          [](const c10::intrusive_ptr<Counter>& self) { return self->state(); },
          [](c10::IValue state) {
            checkTextIn(state, "WaitCounter's saved state");
            return Counter::fromState(state);
          });
}

} // namespace torch_monitor::script
