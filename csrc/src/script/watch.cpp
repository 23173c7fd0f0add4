#include <torch_monitor/script/watch.h>

#include <chrono>
#include <string>
#include <vector>

#include <torch/library.h>

#include <torch_monitor/script/config.h>
#include <torch_monitor/script/sinks.h>
#include <torch_monitor/sinks/tensorboard_writer.h>
#include <torch_monitor/stat.h>
#include <torch_monitor/watch/plan.h>

namespace torch_monitor::script {
namespace {

using watch::Recorder;
using Self = c10::intrusive_ptr<ScriptWatch>;

c10::intrusive_ptr<ScriptWatch> makeWatch(
    std::vector<std::string> paths,
    std::vector<std::string> kinds,
    int64_t windowSteps,
    double windowSeconds,
    int64_t every,
    int64_t histogramsEvery,
    c10::IValue writer,
    bool memory,
    bool syncRanks,
    const std::string& device,
    const std::string& onNonFinite,
    bool closeOnTime) {
  TORCH_CHECK_VALUE(
      paths.size() == kinds.size(),
      "torch_monitor.watch: one kind per path, got ",
      paths.size(),
      " paths and ",
      kinds.size(),
      " kinds");
  std::vector<watch::Key> keys;
  keys.reserve(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    keys.push_back(watch::Key{std::move(paths[i]), watch::kindFromName(kinds[i])});
  }
  watch::RecorderOptions options; // Recorder::create checks them
  options.windowSteps = windowSteps;
  // A Stat's conversion and limits (timedelta.max): one reading of seconds.
  try {
    options.windowSize = windowFromSeconds(windowSeconds);
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, "torch_monitor.watch: ", e.what_without_backtrace());
  }
  TORCH_CHECK_VALUE(
      windowSeconds == 0.0 || options.windowSize.count() > 0,
      "torch_monitor.watch: window_size must be at least 1 ms");
  options.every = every;
  options.histogramsEvery = histogramsEvery;
  if (!writer.isNone()) {
    options.writer = std::dynamic_pointer_cast<sinks::TensorBoardWriter>(
        ScriptSinkHolder::sinkOf(writer));
    TORCH_CHECK_TYPE(
        options.writer != nullptr,
        "torch_monitor.watch: writer must be a torch_monitor.TensorBoardWriter "
        "(histograms go to its event file), got ",
        writer.tagKind());
  }
  options.memory = memory;
  options.syncRanks = syncRanks; // the process default group
  options.onNonFinite = watch::onNonFiniteFromName(onNonFinite);
  options.closeOnTime = closeOnTime;
  return c10::make_intrusive<ScriptWatch>(
      Recorder::create(std::move(keys), std::move(options), c10::Device(device)),
      std::move(writer));
}

// Its configuration and state: the constructor's arguments.
Config configOf(const ScriptWatch& self) {
  const Recorder& r = *self.recorder();
  const watch::RecorderOptions& o = r.options();
  std::vector<std::string> paths;
  std::vector<std::string> kinds;
  for (const watch::Key& key : r.keys()) {
    paths.push_back(key.path);
    kinds.emplace_back(watch::kindName(key.kind));
  }
  return Config{
      {"paths", paths},
      {"kinds", kinds},
      {"window_steps", o.windowSteps},
      {"window_seconds", static_cast<double>(o.windowSize.count()) / 1000.0},
      {"every", o.every},
      {"histograms_every", o.histogramsEvery},
      {"writer", self.writer()},
      {"memory", o.memory},
      {"sync_ranks", o.syncRanks},
      {"device", r.device().str()},
      {"on_nonfinite", std::string(watch::onNonFiniteName(o.onNonFinite))},
      {"close_on_time", o.closeOnTime}};
}

} // namespace

ScriptWatch::~ScriptWatch() = default;

void registerWatch(torch::Library& m) {
  auto cls = m.class_<ScriptWatch>("Watch");
  // A copy or a loaded Watch is a new recorder with the same keys and
  // windows, observing nothing until something calls it.
  defineConfigState(cls, 1, &makeWatch, [](ScriptWatch& self) {
    return configOf(self);
  });
  cls.def(
      torch::init(textChecked(&makeWatch)),
      "Watch(paths, kinds, window_steps=0, window_seconds=0.0, every=1, "
      "histograms_every=0, writer=None, memory=False, sync_ranks=False, "
      "device='cpu', on_nonfinite='log', close_on_time=False): the recorder "
      "of torch_monitor.watch(); keys '<path>.<kind>' in slot order; "
      "on_nonfinite: 'log', 'warn' or 'raise' after a NonFinite event; "
      "close_on_time: the window timer closes time windows as they end",
      {torch::arg("paths"),
       torch::arg("kinds"),
       torch::arg("window_steps") = int64_t(0),
       torch::arg("window_seconds") = 0.0,
       torch::arg("every") = int64_t(1),
       torch::arg("histograms_every") = int64_t(0),
       torch::arg("writer") = c10::IValue(),
       torch::arg("memory") = false,
       torch::arg("sync_ranks") = false,
       torch::arg("device") = std::string("cpu"),
       torch::arg("on_nonfinite") = std::string("log"),
       torch::arg("close_on_time") = false});
  cls.def_static(
      "plan",
      [](const std::vector<std::string>& what,
         std::vector<std::string> parameters,
         const c10::List<bool>& trainable,
         const c10::List<bool>& stepped,
         std::vector<std::string> modules,
         std::optional<std::string> include,
         std::optional<std::string> exclude) {
        watch::Candidates candidates{
            std::move(parameters),
            {trainable.begin(), trainable.end()},
            {stepped.begin(), stepped.end()},
            std::move(modules)};
        const watch::Plan plan = watch::planKeys(
            what,
            candidates,
            watch::Selection(std::move(include), std::move(exclude)));
        std::vector<std::string> paths;
        std::vector<std::string> kinds;
        for (const auto& key : plan.keys) {
          paths.push_back(key.path);
          kinds.emplace_back(watch::kindName(key.kind));
        }
        return std::make_tuple(paths, kinds, plan.targets);
      },
      "(paths, kinds, targets): the keys watch() chooses, as a C++ Watch "
      "does (watch/plan.h): `what` the kinds; per parameter its path, "
      "whether it requires grad and whether the optimizer steps it; the "
      "submodule paths; include/exclude, regular expressions (ECMAScript) "
      "searched in the paths (None: no filter). targets[i] indexes key i's "
      "parameter or module. Positional arguments only: torch 2.11's "
      "def_static takes no argument names");
  cls.def(
         "id",
         [](const Self& self) { return self->recorder()->id(); },
         "The id watch_observe_ takes")
      .def(
          "slots",
          [](const Self& self) { return self->recorder()->slots(); },
          "The slot buffer: [keys, columns] float64 on the watch's device")
      .def(
          "gate",
          [](const Self& self) { return self->recorder()->gate(); },
          "0-d float64: the step when it is observed, else -1")
      .def(
          "keys",
          [](const Self& self) {
            std::vector<std::string> names;
            for (const auto& key : self->recorder()->keys()) {
              names.push_back(key.name());
            }
            return names;
          },
          "'<path>.<kind>' per slot")
      .def(
          "device",
          [](const Self& self) { return self->recorder()->device().str(); },
          "The device the statistics are computed on")
      .def(
          "observe",
          [](const Self& self,
             const std::vector<at::Tensor>& values,
             const std::vector<int64_t>& keys,
             const std::vector<at::Tensor>& before) {
            const auto& r = self->recorder();
            r->observe(r->slots(), r->gate(), values, keys, before);
          },
          "Observes values[i] as key keys[i] (before: the weights before "
          "the step, for update keys)",
          {torch::arg("values"),
           torch::arg("keys"),
           torch::arg("before") = c10::IValue(c10::List<at::Tensor>())})
      .def(
          "watch_steps",
          [](const Self& self,
             const std::vector<int64_t>& keys,
             const std::vector<at::Tensor>& parameters) {
            self->setSteps(std::make_shared<watch::StepObserver>(
                self->recorder(), keys, parameters));
          },
          "Observes parameters[i] as keys[i] (grad, weight and update keys) "
          "around each optimizer step: call it before the first one",
          {torch::arg("keys"), torch::arg("parameters")})
      .def(
          "before_step",
          [](const Self& self, bool gradientsAfter) {
            self->steps().before(gradientsAfter);
          },
          "Before an optimizer step: copies the weights it will change and "
          "observes the gradients, or leaves them to after_step when the step "
          "computes them (gradients_after: a closure, GradScaler's fused path)",
          {torch::arg("gradients_after") = false})
      .def(
          "after_step",
          [](const Self& self, bool skipped) { self->steps().after(skipped); },
          "After an optimizer step: observes the weights and the updates, and "
          "counts the step (the step count when no training step is set); a "
          "skipped step (GradScaler found an inf) observes and counts nothing",
          {torch::arg("skipped") = false})
      .def(
          "close",
          [](const Self& self) { self->recorder()->close(); },
          "Closes and logs the open window now")
      .def(
          "remove",
          [](const Self& self) { self->recorder()->remove(); },
          "Closes the open window and stops")
      .def(
          "removed",
          [](const Self& self) { return self->recorder()->removed(); },
          "Whether remove() ran (the watch observes nothing since)");

  // The one op of an observation. It mutates `slots` (a!), which is what
  // keeps it in compiled graphs and orders it there; `gate` carries the
  // cadence on the device. `watch` names the recorder (Watch.id()), which
  // serialises observations with window closes and writes histograms.
  m.def(
      "watch_observe_(Tensor(a!) slots, Tensor gate, Tensor[] values, "
      "int[] keys, Tensor[] before, int watch) -> ()");
  m.impl(
      "watch_observe_",
      c10::DispatchKey::CompositeExplicitAutograd,
      [](const at::Tensor& slots,
         const at::Tensor& gate,
         at::TensorList values,
         c10::IntArrayRef keys,
         at::TensorList before,
         int64_t watch) {
        Recorder::observeById(watch, slots, gate, values, keys, before);
      });
  // Its fake: what a graph sees of it is the mutation of `slots`, whose
  // shape does not change; nothing to compute while tracing, but the same
  // checks of what it is given (a mistake shows when the graph is traced),
  // and a meta tensor among real ones is refused rather than observed as
  // nothing.
  m.impl(
      "watch_observe_",
      c10::DispatchKey::Meta,
      [](const at::Tensor& slots,
         const at::Tensor& gate,
         at::TensorList values,
         c10::IntArrayRef keys,
         at::TensorList before,
         int64_t watch) {
        Recorder::checkObservation(
            Recorder::find(watch).get(),
            slots,
            gate,
            values,
            keys,
            before,
            /*metaKernel=*/true);
      });
}

} // namespace torch_monitor::script
