#include <torch_monitor/script/wait_counter.h>

#include <torch_monitor/script/config.h>
#include <torch_monitor/script/registration.h>
#include <torch_monitor/script/stat.h>

namespace torch_monitor::script {

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

namespace {

// What the constructor runs, and what a saved state is loaded with.
c10::intrusive_ptr<ScriptWaitCounter> makeWaitCounter(
    std::string key,
    c10::IValue windowSize,
    bool closeOnTime) {
  return c10::make_intrusive<ScriptWaitCounter>(
      key,
      windowFromIValue(windowSize),
      closeOnTime ? WindowClose::ON_TIME : WindowClose::LAZY);
}

} // namespace

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
  // The state holds the constructor's arguments (the window in seconds,
  // which windowFromSeconds reads back to the millisecond).
  defineConfigPickle(
      counter,
      /*version=*/2,
      &makeWaitCounter,
      [](const Counter& self) {
        const WaitCounter& c = self.counter();
        return Config{
            {"key", c.key()},
            {"window_size", secondsOfWindow(c.stat().windowSize())},
            {"close_on_time", c.stat().windowClose() == WindowClose::ON_TIME}};
      },
      {{1, {"key", "window_size_ms", "close_on_time"}, upgradeSavedWindow}});
  counter
      .def(
          torch::init(textChecked(&makeWaitCounter)),
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
          },
          "The key, which names the counter's stat and events")
      .def(
          "window_size_ms",
          [](const c10::intrusive_ptr<Counter>& self) -> int64_t {
            return self->counter().stat().windowSize().count();
          },
          "The window in milliseconds")
      .def(
          "close_on_time",
          [](const c10::intrusive_ptr<Counter>& self) {
            return self->counter().stat().windowClose() == WindowClose::ON_TIME;
          },
          "Whether a window also closes on time, with no unit to close it")
      .def(
          "get",
          [](const c10::intrusive_ptr<Counter>& self) {
            c10::Dict<std::string, double> out;
            for (const auto& [aggregation, value] :
                 self->counter().stat().get()) {
              out.insert(aggregationName(aggregation), value);
            }
            return out;
          },
          "count, sum, max and mean of the last closed window (durations "
          "in microseconds; empty before the first window closes)");
}

} // namespace torch_monitor::script
