#include <torch_monitor/script/reducer.h>

#include <limits>
#include <map>

#include <ATen/ops/alias.h>
#include <ATen/ops/scalar_tensor.h>

#include <torch_monitor/reducers/factory.h>
#include <torch_monitor/script/config.h>
#include <torch_monitor/script/registration.h>

namespace torch_monitor::script {
namespace {

using Self = c10::intrusive_ptr<ScriptReducer>;

Criterion criterionFromName(const std::string& name, double threshold) {
  if (name.empty()) {
    return Criterion();
  }
  TORCH_CHECK_VALUE(
      name != ScriptReducer::kCustomCriterion,
      "this reducer was described with a custom (Python) criterion, which "
      "cannot be rebuilt; construct it in Python with the callable, or use a "
      "built-in criterion (eq, ne, gt, ge, lt, le, nonzero)");
  return Criterion::builtin(name, threshold);
}


// Throws c10::ValueError when the reducer runs Python code (a Python
// reducer whose forward is overridden, or a fold written in Python): saving
// it (`action`: TorchScript, torch.export) would keep the state and
// silently drop that code.
void checkNoPythonCode(const ScriptReducer& self, const char* action) {
  const std::shared_ptr<FoldReducer> fold =
      std::dynamic_pointer_cast<FoldReducer>(self.reducer());
  TORCH_CHECK_VALUE(
      fold != nullptr,
      "this reducer runs Python code (a torch_monitor reducer whose forward "
      "is overridden or has forward hooks), which ",
      action,
      " cannot keep; use a built-in reducer, or a FoldReducer subclass, in "
      "models you save");
  if (const auto custom = fold->customFold()) {
    TORCH_CHECK_VALUE(
        false,
        "this reducer (",
        custom->description,
        ") folds with Python code, which ",
        action,
        " cannot keep (only its history would be saved); use a built-in "
        "reducer in models you save, or keep the model in Python");
  }
}

} // namespace

FoldReducer& ScriptReducer::fold() const {
  TORCH_CHECK_TYPE(
      fold_ != nullptr,
      "this torch_monitor Reducer holds a C++ reducer that is not a "
      "FoldReducer; it supports only forward, peek, dump, view and clear");
  return *fold_;
}

ScriptReducer::State ScriptReducer::state(bool forSaving) const {
  if (forSaving) {
    checkNoPythonCode(*this, "TorchScript saving (torch.jit.save, pickling)");
  }
  const FoldReducer& r = fold();
  std::string criterionName;
  double threshold = 0.0;
  if (const std::optional<Criterion> c = r.criterion(); c && c->valid()) {
    if (c->isBuiltin()) {
      criterionName = c->name();
      threshold = c->threshold();
    } else {
      TORCH_CHECK_VALUE(
          !forSaving,
          r.kind(),
          " uses a Python callable as criterion (",
          c->name(),
          "), which cannot be saved; use a built-in criterion "
          "(torch_monitor.Criterion('gt', 0.5), ...) in models you save");
      criterionName = kCustomCriterion;
    }
  }
  const FoldReducer::Snapshot snap = r.snapshot();
  // Saved without autograd history: a graph cannot be pickled, and a loaded
  // history starts a new one.
  return State(
      kStateVersion,
      r.kind(),
      r.stepTime(),
      r.duration(),
      r.inclusive(),
      r.inplace(),
      dictOf(r.params()),
      criterionName,
      threshold,
      snap.storage.detach(),
      snap.allocated,
      snap.next,
      snap.hasState,
      snap.steps);
}

namespace {
void checkVersion(int64_t version) {
  TORCH_CHECK_VALUE(
      version == ScriptReducer::kStateVersion,
      "cannot load a torch_monitor Reducer saved with state version ",
      version,
      "; this build reads version ",
      ScriptReducer::kStateVersion,
      ". Load it with the torch_monitor release that saved it.");
}
} // namespace

void ScriptReducer::loadState(const State& state) {
  const auto& [version, kind, stepTime, duration, inclusive, inplace, params,
               criterionName, threshold, storage, allocated, next, hasState,
               steps] = state;
  checkVersion(version);
  FoldReducer& r = fold();
  TORCH_CHECK_VALUE(
      kind == r.kind(),
      "cannot load the state of a ",
      kind,
      " into a ",
      r.kind());
  // Validate the timing before changing anything.
  (void)historySize(stepTime, duration, inclusive);
  r.setInclusive(inclusive);
  r.setDuration(duration);
  r.setStepTime(stepTime);
  r.setInplace(inplace);
  const std::map<std::string, double> current = r.params();
  for (const auto& [name, value] : mapOf(params)) {
    r.setParam(name, value);
  }
  // A parameter the saved reducer did not have is unset (NaN), e.g. a
  // trace's tolerance.
  for (const auto& entry : current) {
    if (!params.contains(entry.first)) {
      r.setParam(entry.first, std::numeric_limits<double>::quiet_NaN());
    }
  }
  r.restore(FoldReducer::Snapshot{storage, allocated, next, hasState, steps});
}

c10::intrusive_ptr<ScriptReducer> ScriptReducer::fromState(const State& state) {
  const auto& [version, kind, stepTime, duration, inclusive, inplace, params,
               criterionName, threshold, storage, allocated, next, hasState,
               steps] = state;
  checkVersion(version);
  std::shared_ptr<FoldReducer> reducer = makeReducer(
      kind,
      stepTime,
      duration,
      inclusive,
      inplace,
      mapOf(params),
      criterionFromName(criterionName, threshold));
  reducer->restore(
      FoldReducer::Snapshot{storage, allocated, next, hasState, steps});
  return c10::make_intrusive<ScriptReducer>(std::move(reducer));
}

at::Tensor viewTime(const c10::IValue& time, const char* owner) {
  if (time.isDouble() || time.isInt()) {
    return at::scalar_tensor(time.toScalar().toDouble(), at::kDouble);
  }
  TORCH_CHECK_TYPE(
      time.isTensor(),
      owner,
      ".view: time must be a float, an int or a Tensor, got ",
      time.tagKind());
  return time.toTensor();
}

void registerReducerClasses(torch::Library& m) {
  auto cls = m.class_<ScriptReducer>("Reducer");
  defineFlatten(cls, [](ScriptReducer& self) {
    checkNoPythonCode(self, "torch.compile / torch.export");
    FoldReducer& fold = self.fold();
    const std::optional<Criterion> criterion = fold.criterion();
    return Config{
        {"kind", std::string(fold.kind())},
        {"arity", static_cast<int64_t>(fold.arity())},
        {"step_time", fold.stepTime()},
        {"duration", fold.duration()},
        {"inclusive", fold.inclusive()},
        {"inplace", fold.inplace()},
        {"params", dictOf(fold.params())},
        {"criterion", criterion ? criterion->repr() : std::string()}};
  });
  cls.def(
          torch::init(textChecked([](const std::string& kind,
                         double stepTime,
                         double duration,
                         bool inclusive,
                         bool inplace,
                         std::optional<c10::Dict<std::string, double>> params,
                         const std::string& criterion,
                         double threshold) {
            return c10::make_intrusive<ScriptReducer>(makeReducer(
                kind,
                stepTime,
                duration,
                inclusive,
                inplace,
                params ? mapOf(*params) : std::map<std::string, double>(),
                criterionFromName(criterion, threshold)));
          })),
          "Reducer(kind, step_time, duration=0.0, inclusive=False, "
          "inplace=False, params=None, criterion='', threshold=0.0): kind is "
          "an inferno class name such as 'EMAReducer'; params its parameters "
          "by name (e.g. {'alpha': 0.5}); criterion a built-in test (eq, ne, "
          "gt, ge, lt, le against threshold, or nonzero)",
          {torch::arg("kind"),
           torch::arg("step_time"),
           torch::arg("duration") = 0.0,
           torch::arg("inclusive") = false,
           torch::arg("inplace") = false,
           torch::arg("params") = c10::IValue(),
           torch::arg("criterion") = std::string(),
           torch::arg("threshold") = 0.0})
      .def(
          "forward",
          [](const Self& self, const std::vector<at::Tensor>& inputs) {
            self->reducer()->forward(inputs);
          },
          "folds the inputs of one step into a new state and records it",
          {torch::arg("inputs")})
      .def(
          "peek",
          [](const Self& self) { return self->reducer()->peek(); },
          "the newest state, None before the first step")
      .def(
          "dump",
          [](const Self& self) { return self->reducer()->dump(); },
          "every recorded state, newest first, None before the first step")
      .def(
          "view",
          [](const Self& self, const c10::IValue& time, double tolerance) {
            return self->reducer()->view(viewTime(time, "Reducer"), tolerance);
          },
          "the state `time` before the newest (a float, or a tensor of times "
          "per element), interpolated between recorded states",
          {torch::arg("time"), torch::arg("tolerance") = kViewTolerance})
      .def(
          "clear",
          [](const Self& self, bool keepshape) {
            self->reducer()->clear(keepshape);
          },
          "back to the initial state; keepshape keeps the storage allocated",
          {torch::arg("keepshape") = false})
      .def(
          "kind",
          [](const Self& self) { return std::string(self->fold().kind()); },
          "the inferno class name, such as 'EMAReducer'")
      .def(
          "arity",
          [](const Self& self) {
            return static_cast<int64_t>(self->fold().arity());
          },
          "how many tensors forward() takes (2 for the conditional traces)")
      .def(
          "step_time",
          [](const Self& self) { return self->fold().stepTime(); },
          "the time one step takes")
      .def(
          "set_step_time",
          [](const Self& self, double v) { self->fold().setStepTime(v); },
          "sets the time one step takes",
          {torch::arg("value")})
      .def(
          "duration",
          [](const Self& self) { return self->fold().duration(); },
          "how much time the history covers")
      .def(
          "set_duration",
          [](const Self& self, double v) { self->fold().setDuration(v); },
          "sets how much time the history covers",
          {torch::arg("value")})
      .def(
          "inclusive",
          [](const Self& self) { return self->fold().inclusive(); },
          "whether the history holds one state more (the one `duration` back)")
      .def(
          "set_inclusive",
          [](const Self& self, bool v) { self->fold().setInclusive(v); },
          "sets whether the history holds one state more (the one `duration` back)",
          {torch::arg("value")})
      .def(
          "inplace",
          [](const Self& self) { return self->fold().inplace(); },
          "whether the history is written in place")
      .def(
          "set_inplace",
          [](const Self& self, bool v) { self->fold().setInplace(v); },
          "sets whether the history is written in place",
          {torch::arg("value")})
      .def(
          "history_size",
          [](const Self& self) { return self->fold().historySize(); },
          "the number of states kept")
      .def(
          "steps",
          [](const Self& self) { return self->fold().steps(); },
          "the steps folded since construction or the last clear()")
      .def(
          "fill",
          [](const Self& self) { return self->fold().fill(); },
          "the value of the history's rows before a state is written there")
      .def(
          "params",
          [](const Self& self) { return dictOf(self->fold().params()); },
          "the kind's own parameters by name (an unset optional one is "
          "absent)")
      .def(
          "set_param",
          [](const Self& self, const std::string& name, double value) {
            self->fold().setParam(name, value);
          },
          "sets the reducer's parameter `name` (see params())",
          {torch::arg("name"), torch::arg("value")})
      .def(
          "criterion",
          [](const Self& self) {
            const std::optional<Criterion> c = self->fold().criterion();
            return c ? c->repr() : std::string();
          },
          "the criterion as text ('gt(0.5)', 'nonzero', a callable's repr), "
          "'' for reducers without one")
      .def(
          "set_criterion",
          [](const Self& self, const std::string& name, double threshold) {
            self->fold().setCriterion(Criterion::builtin(name, threshold));
          },
          "replaces the criterion by a built-in one",
          {torch::arg("name"), torch::arg("threshold") = 0.0})
      .def(
          "storage",
          [](const Self& self) {
            // A new TensorImpl over the same memory: Python keeps the
            // TensorImpls it has seen alive (PyObject preservation), and a
            // history whose own TensorImpl is shared can no longer be written
            // in place (every step would copy all N rows).
            return at::alias(self->fold().storage());
          },
          "the history tensor in storage order ([N, *state shape]; an empty "
          "tensor of the history's dtype and device before the first step)")
      .def(
          "set_storage",
          [](const Self& self, const at::Tensor& storage) {
            self->fold().setStorage(storage);
          },
          "replaces the history tensor by one of the same shape (another "
          "dtype or device)",
          {torch::arg("storage")})
      .def(
          "to",
          [](const Self& self,
             std::optional<c10::Device> device,
             std::optional<c10::ScalarType> dtype) {
            self->fold().to(device, dtype);
          },
          "moves and/or casts the history",
          {torch::arg("device") = c10::IValue(), torch::arg("dtype") = c10::IValue()})
      .def(
          "state",
          [](const Self& self) { return self->state(/*forSaving=*/false); },
          "the reducer's state as saved (a custom criterion is recorded as "
          "'custom')")
      .def(
          "load_state",
          [](const Self& self, ScriptReducer::State state) {
            self->loadState(state);
          },
          "loads a state() into this reducer in place",
          {torch::arg("state")})
      .def_pickle(
          [](const Self& self) { return self->state(/*forSaving=*/true); },
          [](ScriptReducer::State state) {
            checkTextIn(c10::IValue(state), "Reducer's saved state");
            return ScriptReducer::fromState(state);
          });
}

} // namespace torch_monitor::script
