#include <optional>
#include <string>

#include <torch_monitor/script/pytorch_counters.h>

#include <torch_monitor/script/config.h>
#include <torch_monitor/script/registration.h>
#include <torch_monitor/script/stat.h>

namespace torch_monitor::script {

namespace {

// Its state is its configuration (defineConfigState): loading an archive
// that holds a capture starts a capture with the same options.
constexpr int64_t kStateVersion = 1;

c10::intrusive_ptr<ScriptCapture> makeCapture(
    std::optional<int64_t> windowSteps,
    c10::IValue windowSize,
    std::optional<std::string> include,
    std::optional<std::string> exclude,
    bool closeOnTime,
    bool syncRanks) {
  TORCH_CHECK_VALUE(
      !(windowSteps.has_value() && !windowSize.isNone()),
      "capture_pytorch_counters: give at most one of window_steps (a window "
      "of training steps) and window_size (a time window; 60 s when neither "
      "is given), got both");
  PytorchCounterOptions options;
  if (windowSteps.has_value()) {
    TORCH_CHECK_VALUE(
        *windowSteps >= 1,
        "capture_pytorch_counters: window_steps must be at least 1, got ",
        *windowSteps);
    options.windowSteps = *windowSteps;
  } else if (!windowSize.isNone()) {
    options.windowSize = windowFromIValue(windowSize);
  }
  options.include = std::move(include);
  options.exclude = std::move(exclude);
  options.closeOnTime = closeOnTime;
  options.syncRanks = syncRanks; // the process default group
  return c10::make_intrusive<ScriptCapture>(std::move(options));
}

Config configOf(ScriptCapture& self) {
  const PytorchCounterOptions& o = self.capture().options();
  return Config{
      {"window_steps",
       o.windowSteps > 0 ? c10::IValue(o.windowSteps) : c10::IValue()},
      {"window_size",
       o.windowSteps > 0
           ? c10::IValue()
           : c10::IValue(static_cast<double>(o.windowSize.count()) / 1000.0)},
      {"include", o.include ? c10::IValue(*o.include) : c10::IValue()},
      {"exclude", o.exclude ? c10::IValue(*o.exclude) : c10::IValue()},
      {"close_on_time", o.closeOnTime},
      {"sync_ranks", o.syncRanks}};
}

} // namespace

void registerPytorchCounterClasses(torch::Library& m) {
  using Self = c10::intrusive_ptr<ScriptCapture>;
  auto cls = m.class_<ScriptCapture>("PytorchCounterCapture");
  defineConfigState(cls, kStateVersion, &makeCapture, &configOf);
  cls.def(
         torch::init(textChecked(&makeCapture)),
         "Captures PyTorch's own timings: c10's wait counters, with which "
         "PyTorch times compilation (pytorch.wait_counter.dynamo_compile, "
         "...), process-group set-up (pytorch.wait_counter.c10d.*), every "
         "TCPStore operation (pytorch.wait_counter.TCPStore__<op>) and what "
         "a program times with torch.monitor._WaitCounter. Until remove() "
         "(or the end of a `with` block, or the object's destruction), each "
         "unit of work timed under a key that `include` matches and "
         "`exclude` does not (regular expressions searched in the key) is "
         "one sample, its duration in microseconds, of a Stat named after "
         "the key: each window logs a 'torch.monitor.Stat' event with "
         "'<key>.count', '<key>.sum', '<key>.max' and '<key>.mean'. Each "
         "close also logs '<key>.active' (units still running) for the keys "
         "that have any, and the value of each of c10's dynamic counters it "
         "matches, under its key.\n\n"
         "Windows: window_steps (training steps, set_step) or window_size "
         "(seconds or a datetime.timedelta; 60 s when neither is given; "
         "close_on_time=True closes them on time). sync_ranks=True merges "
         "each key's windows across the ranks of the default process group "
         "(rank 0 logs them). A key first used before torch_monitor was "
         "imported is not seen (docs/pytorch_counters.md).",
         {torch::arg("window_steps") = c10::IValue(),
          torch::arg("window_size") = c10::IValue(),
          torch::arg("include") = c10::IValue(),
          torch::arg("exclude") = c10::IValue(),
          torch::arg("close_on_time") = false,
          torch::arg("sync_ranks") = false})
      .def(
          "remove",
          [](const Self& self) { self->capture().remove(); },
          "Stops capturing and logs every key's open window; later calls do "
          "nothing")
      .def(
          "removed",
          [](const Self& self) { return self->capture().removed(); },
          "Whether remove() was called")
      .def(
          "keys",
          [](const Self& self) { return self->capture().keys(); },
          "The keys captured so far, sorted (none once removed)");
}

} // namespace torch_monitor::script
