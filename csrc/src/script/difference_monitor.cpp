#include <torch_monitor/script/difference_monitor.h>

#include <algorithm>
#include <array>
#include <string_view>

#include <ATen/ATen.h>

#include <torch_monitor/nn/attribute_path.h>
#include <torch_monitor/script/config.h>
#include <torch_monitor/script/registration.h>

namespace torch_monitor::script {
namespace {

// The monitor classes one DifferenceMonitor core serves.
constexpr std::array<std::string_view, 6> kKinds = {
    "DifferenceMonitor",
    "InputMonitor",
    "OutputMonitor",
    "StateMonitor",
    "MultiStateMonitor",
    "Monitor"};

using Self = c10::intrusive_ptr<ScriptDifferenceMonitor>;

// What the constructor runs and a saved state is loaded with, given the
// Reducer object itself: a loaded monitor keeps the saved object (the
// constructor's schema takes a Reducer), so that a module holding it too
// still shares it after loading.
Self loadDifferenceMonitor(
    c10::IValue reducer,
    std::string name,
    bool trainUpdate,
    bool evalUpdate,
    bool keepGraph,
    std::string kind) {
  return c10::make_intrusive<ScriptDifferenceMonitor>(
      std::move(reducer),
      std::move(name),
      trainUpdate,
      evalUpdate,
      keepGraph,
      std::move(kind));
}

// The constructor's arguments but the reducer.
Config settingsOf(const ScriptDifferenceMonitor& self) {
  const DifferenceMonitor& monitor = self.monitor();
  return {
      {"name", monitor.name()},
      {"train_update", monitor.trainUpdate()},
      {"eval_update", monitor.evalUpdate()},
      {"keep_graph", monitor.keepGraph()},
      {"kind", self.kind()}};
}

void defineDifferenceMonitorClass(torch::Library& m) {
  auto cls = m.class_<ScriptDifferenceMonitor>("DifferenceMonitor");
  defineFlatten(cls, [](ScriptDifferenceMonitor& self) {
    Config config = settingsOf(self);
    config.emplace_back(
        "has_custom_callables", self.monitor().hasCustomCallables());
    return config;
  });
  // The captured pre-forward value is not saved (a module is saved between
  // forward() calls). Version 1 had no keep_graph (it kept none), versions
  // 1 and 2 no kind.
  defineConfigPickle(
      cls,
      /*version=*/4,
      &loadDifferenceMonitor,
      [](ScriptDifferenceMonitor& self) {
        const DifferenceMonitor& monitor = self.monitor();
        // A silently different monitor after loading would be worse than
        // no save.
        TORCH_CHECK(
            !monitor.hasCustomCallables(),
            "cannot save DifferenceMonitor '",
            monitor.name(),
            "': its filter_, map_ or op_ is a Python callable, which "
            "TorchScript cannot save. Save a module whose monitors use the "
            "default filter_, map_ and op_ (or compute the value inside the "
            "module and monitor that attribute instead)");
        Config config = settingsOf(self);
        config.emplace_back("reducer", self.reducerObject());
        return config;
      },
      {{1, {"name", "train_update", "eval_update", "reducer"}},
       {2, {"name", "train_update", "eval_update", "reducer", "keep_graph"}},
       {3,
        {"name", "train_update", "eval_update", "reducer", "keep_graph",
         "kind"}}});
  cls.def(
          torch::init(textChecked([](c10::intrusive_ptr<ScriptReducer> reducer,
                         std::string name,
                         bool trainUpdate,
                         bool evalUpdate,
                         bool keepGraph,
                         std::string kind) {
            return loadDifferenceMonitor(
                c10::IValue(std::move(reducer)),
                std::move(name),
                trainUpdate,
                evalUpdate,
                keepGraph,
                std::move(kind));
          })),
          "DifferenceMonitor(reducer, name, train_update=True, "
          "eval_update=True, keep_graph=False, kind='DifferenceMonitor'): "
          "feeds reducer the difference "
          "of a module attribute across forward(); the module's hooks call "
          "before() and after() with the attribute's value and "
          "self.training (a one-hook monitor's hook, named by kind, calls "
          "observe())",
          {torch::arg("reducer"),
           torch::arg("name"),
           torch::arg("train_update") = true,
           torch::arg("eval_update") = true,
           torch::arg("keep_graph") = false,
           torch::arg("kind") = std::string(ScriptDifferenceMonitor::kDefaultKind)})
      .def(
          "before",
          [](const Self& self, c10::IValue value, bool training) {
            self->monitor().before(value, training);
          },
          "the forward pre-hook's part: captures the value",
          {torch::arg("value"), torch::arg("training")})
      .def(
          "after",
          [](const Self& self, c10::IValue value, bool training) {
            self->monitor().after(value, training);
          },
          "the forward hook's part: feeds op(value, captured) to the reducer",
          {torch::arg("value"), torch::arg("training")})
      .def(
          "observe",
          [](const Self& self, c10::IValue value, bool training) {
            self->monitor().observe(value, training);
          },
          "a one-hook monitor's hook (InputMonitor, OutputMonitor, "
          "StateMonitor, MultiStateMonitor): feeds map_(value) to the reducer",
          {torch::arg("value"), torch::arg("training")})
      .def(
          "clear",
          [](const Self& self, bool keepshape) {
            self->monitor().clear(keepshape);
          },
          "forgets the captured value and clears the reducer",
          {torch::arg("keepshape") = false})
      .def(
          "forget",
          [](const Self& self) { self->monitor().forget(); },
          "forgets the value this thread captured")
      .def(
          "forget_all",
          [](const Self& self) { self->monitor().forgetAll(); },
          "forgets the values every thread captured")
      .def(
          "keep_graph",
          [](const Self& self) { return self->monitor().keepGraph(); },
          "whether differences keep their autograd graph")
      .def(
          "set_keep_graph",
          [](const Self& self, bool value) {
            self->monitor().setKeepGraph(value);
          },
          "sets whether differences keep their autograd graph",
          {torch::arg("value")})
      .def(
          "reducer",
          [](const Self& self) { return self->scriptReducer(); },
          "the reducer the monitor feeds")
      .def(
          "name",
          [](const Self& self) { return self->monitor().name(); },
          "the name the monitor was given, which its errors name (the "
          "monitored attribute's path, e.g. 'layer1.weight')")
      .def(
          "kind",
          [](const Self& self) { return self->kind(); },
          "which monitor this is: 'DifferenceMonitor', 'InputMonitor', "
          "'OutputMonitor', 'StateMonitor', 'MultiStateMonitor' or 'Monitor' "
          "(one written in Python)")
      .def(
          "train_update",
          [](const Self& self) { return self->monitor().trainUpdate(); },
          "whether the hooks record while the module is in training mode")
      .def(
          "set_train_update",
          [](const Self& self, bool value) {
            self->monitor().setTrainUpdate(value);
          },
          "sets whether the hooks record while the module is in training mode",
          {torch::arg("value")})
      .def(
          "eval_update",
          [](const Self& self) { return self->monitor().evalUpdate(); },
          "whether the hooks record while the module is in evaluation mode")
      .def(
          "set_eval_update",
          [](const Self& self, bool value) {
            self->monitor().setEvalUpdate(value);
          },
          "sets whether the hooks record while the module is in evaluation mode",
          {torch::arg("value")})
      .def(
          "has_custom_callables",
          [](const Self& self) {
            return self->monitor().hasCustomCallables();
          },
          "whether a filter_, map_ or op_ of its own replaces a built-in one")
      .def(
          "peek",
          [](const Self& self) { return self->monitor().reducer()->peek(); },
          "the reducer's newest state, None before the first step")
      .def(
          "dump",
          [](const Self& self) { return self->monitor().reducer()->dump(); },
          "the reducer's stored states, newest first")
      .def(
          "view",
          [](const Self& self, c10::IValue time, double tolerance) {
            return self->monitor().reducer()->view(
                viewTime(time, "DifferenceMonitor"), tolerance);
          },
          "the reducer's state `time` before the newest one",
          {torch::arg("time"), torch::arg("tolerance") = kViewTolerance});
}

} // namespace

namespace {

c10::intrusive_ptr<ScriptReducer> reducerOf(const c10::IValue& reducer) {
  TORCH_CHECK_TYPE(
      reducer.isObject() &&
          reducer.toObjectRef().type() ==
              c10::getCustomClassType<c10::intrusive_ptr<ScriptReducer>>(),
      "a DifferenceMonitor feeds a torch.classes.torch_monitor.Reducer "
      "(e.g. torch_monitor.PassthroughReducer(1.0).script_reducer), got ",
      reducer.type()->repr_str());
  return reducer.toCustomClass<ScriptReducer>();
}

} // namespace

ScriptDifferenceMonitor::ScriptDifferenceMonitor(
    c10::IValue reducer,
    std::string name,
    bool trainUpdate,
    bool evalUpdate,
    bool keepGraph,
    std::string kind)
    : reducerObject_(std::move(reducer)),
      reducer_(reducerOf(reducerObject_)),
      monitor_(
          reducer_->reducer(),
          std::move(name),
          trainUpdate,
          evalUpdate,
          keepGraph),
      kind_(std::move(kind)) {
  // Also what a loaded state holds: monitorsOf() reports the kind, and
  // Python rebuilds the monitor class it names.
  TORCH_CHECK_VALUE(
      std::find(kKinds.begin(), kKinds.end(), kind_) != kKinds.end(),
      "DifferenceMonitor '",
      monitor_.name(),
      "': kind must name a monitor class (DifferenceMonitor, InputMonitor, "
      "OutputMonitor, StateMonitor, MultiStateMonitor, or Monitor for one "
      "written in Python), got '",
      kind_,
      "'");
  if (kind_ == kDefaultKind) {
    nn::AttributePath{monitor_.name()}; // ValueError naming the bad part
  }
}

void ScriptDifferenceMonitor::keepReducerObject(c10::IValue object) {
  TORCH_CHECK_VALUE(
      reducerOf(object).get() == reducer_.get(),
      "DifferenceMonitor '",
      monitor_.name(),
      "': the Reducer object to keep must hold the monitor's own reducer");
  reducerObject_ = std::move(object);
}

void registerMonitorClasses(torch::Library& m) {
  // The monitor's constructor and reducer() take the Reducer class, so it
  // must be registered first (registerReducerClasses runs before this).
  // Without it the signature could not be typed and loading the library
  // would fail; skipping keeps every other class usable.
  if (!torch::getCustomClass("__torch__.torch.classes.torch_monitor.Reducer")) {
    return;
  }
  defineDifferenceMonitorClass(m);
}

} // namespace torch_monitor::script
