#include <torch_monitor/script/event.h>

#include <ATen/core/Tensor.h>

#include <torch_monitor/detail/text.h>
#include <torch_monitor/event_handler.h>
#include <torch_monitor/script/config.h>
#include <torch_monitor/script/registration.h>
#include <torch_monitor/step.h>

namespace torch_monitor::script {
namespace {

// Scripted code can build any bytes (slicing a str cuts inside characters),
// so every string is checked here, where it enters.
template <typename V>
void defineSetter(
    torch::class_<ScriptEvent>& cls,
    const char* method) {
  cls.def(method, [](const c10::intrusive_ptr<ScriptEvent>& self,
                     std::string key,
                     V value) {
    detail::checkText(key, "Event data key");
    if constexpr (std::is_same_v<V, std::string>) {
      detail::checkText(value, "Event data['" + key + "']");
    }
    self->event().data[std::move(key)] = data_value_t(std::move(value));
  },
  "sets data[key] to value",
  {torch::arg("key"), torch::arg("value")});
}

// One value of log_event_values: a one-element tensor read when the op runs
// (checked by the caller); its dtype says which Event value type it becomes.
data_value_t valueOfTensor(const at::Tensor& tensor, const std::string& key) {
  const c10::Scalar value = tensor.item();
  if (value.isBoolean()) {
    return value.toBool();
  }
  if (value.isIntegral(/*includeBool=*/false)) {
    return value.toLong();
  }
  TORCH_CHECK_TYPE(
      value.isFloatingPoint(),
      "log_event: the value of '",
      key,
      "' must be a real number, got a ",
      tensor.scalar_type(),
      " tensor");
  return value.toDouble();
}

// The kernel of log_event_values: the traceable log_event (PyTorch 2 cannot
// build an Event object inside traced code, but can pass tensors and
// strings to an op). The event is stamped when the op runs.
void logEventValues(
    const std::string& name,
    const std::vector<std::string>& keys,
    at::TensorList values,
    const std::vector<std::string>& textKeys,
    const std::vector<std::string>& texts) {
  TORCH_CHECK_VALUE(
      keys.size() == values.size() && textKeys.size() == texts.size(),
      "log_event_values: got ",
      keys.size(),
      " keys for ",
      values.size(),
      " values and ",
      textKeys.size(),
      " text keys for ",
      texts.size(),
      " texts; each key needs exactly one value");
  // Everything but the values' contents is checked with or without
  // handlers, so that a mistake shows at once.
  detail::checkText(name, "Event name");
  for (size_t i = 0; i < keys.size(); ++i) {
    detail::checkText(keys[i], "Event data key");
    TORCH_CHECK_VALUE(
        values[i].numel() == 1,
        "log_event: the value of '",
        keys[i],
        "' must be a number or a one-element tensor, got a tensor of ",
        values[i].numel(),
        " elements (log a reduction such as t.mean(), or each element)");
    TORCH_CHECK_VALUE(
        !values[i].is_meta(),
        "log_event: the value of '",
        keys[i],
        "' is a tensor on the meta device, which holds no value to log; log "
        "the tensor computed on a real device");
  }
  for (size_t i = 0; i < textKeys.size(); ++i) {
    detail::checkText(textKeys[i], "Event data key");
    detail::checkText(texts[i], "Event data['" + textKeys[i] + "']");
  }
  if (!hasEventHandlers()) {
    return; // nothing reads it: skip the reads (a sync on CUDA)
  }
  Event event;
  event.name = name;
  event.timestamp = std::chrono::system_clock::now();
  for (size_t i = 0; i < keys.size(); ++i) {
    event.data[keys[i]] = valueOfTensor(values[i], keys[i]);
  }
  for (size_t i = 0; i < textKeys.size(); ++i) {
    event.data[textKeys[i]] = texts[i];
  }
  detail::dispatchEvent(event);
}

} // namespace

ScriptEvent::State ScriptEvent::state() const {
  State s;
  auto& [version, name, micros, keys, kinds, strings, doubles, ints] = s;
  version = kStateVersion;
  name = event_.name;
  micros = toEpochMicros(event_.timestamp);
  for (const auto& [key, value] : event_.data) {
    keys.push_back(key);
    kinds.push_back(static_cast<int64_t>(value.index()));
    strings.push_back(
        std::holds_alternative<std::string>(value) ? std::get<std::string>(value)
                                                   : std::string());
    doubles.push_back(
        std::holds_alternative<double>(value) ? std::get<double>(value) : 0.0);
    ints.push_back(
        std::holds_alternative<int64_t>(value)
            ? std::get<int64_t>(value)
            : (std::holds_alternative<bool>(value) ? std::get<bool>(value) : 0));
  }
  return s;
}

c10::intrusive_ptr<ScriptEvent> ScriptEvent::fromState(State s) {
  auto& [version, name, micros, keys, kinds, strings, doubles, ints] = s;
  TORCH_CHECK(
      version == kStateVersion,
      "cannot load a torch_monitor Event saved with state version ",
      version,
      "; this build reads version ",
      kStateVersion);
  const size_t n = keys.size();
  TORCH_CHECK_VALUE(
      kinds.size() == n && strings.size() == n && doubles.size() == n &&
          ints.size() == n,
      "corrupt torch_monitor Event state: its data columns differ in length");
  Event event;
  event.name = std::move(name);
  event.timestamp = fromEpochMicros(micros);
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(
        kinds[i] >= 0 && kinds[i] < int64_t(std::variant_size_v<data_value_t>),
        "corrupt torch_monitor Event state: unknown value kind ",
        kinds[i]);
    data_value_t value;
    switch (kinds[i]) {
      case 0:
        value = std::move(strings[i]);
        break;
      case 1:
        value = doubles[i];
        break;
      case 2:
        value = ints[i];
        break;
      default:
        value = ints[i] != 0;
        break;
    }
    event.data.emplace(std::move(keys[i]), std::move(value));
  }
  checkEvent(event); // a saved archive can hold any bytes
  return c10::make_intrusive<ScriptEvent>(std::move(event));
}

void registerEventClassAndOps(torch::Library& m) {
  auto cls = m.class_<ScriptEvent>("Event");
  // An event is data, built and logged at run time: only its name is
  // configuration to a trace that holds one.
  defineFlatten(cls, [](ScriptEvent& self) {
    return Config{{"name", self.event().name}};
  });
  cls.def(
         torch::init(textChecked([](std::string name) {
           detail::checkText(name, "Event name");
           Event event;
           event.name = std::move(name);
           event.timestamp = std::chrono::system_clock::now();
           return c10::make_intrusive<ScriptEvent>(std::move(event));
         })),
         "Event(name): an event stamped with the current time",
         {torch::arg("name")})
      .def(
          "name",
          [](const c10::intrusive_ptr<ScriptEvent>& self) {
            return self->event().name;
          })
      .def(
          "timestamp_us",
          [](const c10::intrusive_ptr<ScriptEvent>& self) {
            return toEpochMicros(self->event().timestamp);
          })
      .def(
          "set_timestamp_us",
          [](const c10::intrusive_ptr<ScriptEvent>& self, int64_t micros) {
            self->event().timestamp = fromEpochMicros(micros);
          },
          "sets the event's time, in microseconds since the epoch",
          {torch::arg("value")})
      .def(
          "step",
          [](const c10::intrusive_ptr<ScriptEvent>& self) {
            return self->event().step;
          },
          "The training step the event belongs to, or None")
      .def(
          "set_step",
          [](const c10::intrusive_ptr<ScriptEvent>& self,
             std::optional<int64_t> step) {
            if (step) {
              checkStep(*step, "Event step");
            }
            self->event().step = step;
          },
          "Sets the event's training step (None: none)",
          {torch::arg("step")})
      .def_pickle(
          [](const c10::intrusive_ptr<ScriptEvent>& self) {
            return self->state();
          },
          [](ScriptEvent::State state) {
            checkTextIn(c10::IValue(state), "Event's saved state");
            return ScriptEvent::fromState(std::move(state));
          });
  defineSetter<double>(cls, "set_float");
  defineSetter<int64_t>(cls, "set_int");
  defineSetter<bool>(cls, "set_bool");
  defineSetter<std::string>(cls, "set_str");

  // The ops' fake kernels (no outputs) and the ordered-effect marks that keep
  // them in compiled and exported graphs are registered by this module.
  m.set_python_module("torch_monitor._fake");
  // CONSERVATIVE: the ops return nothing, and the JIT would otherwise treat
  // them as pure and eliminate them as dead code. Their kernels are
  // CompositeExplicitAutograd: one kernel for every backend, which runs even
  // when no argument is a tensor, and which PT2 may give a fake.
  m.def(torch::schema(
      "log_event(__torch__.torch.classes.torch_monitor.Event event) -> ()",
      c10::AliasAnalysisKind::CONSERVATIVE));
  m.impl(
      "log_event",
      c10::DispatchKey::CompositeExplicitAutograd,
      [](const c10::intrusive_ptr<ScriptEvent>& event) {
        // Every string was checked as it was set.
        detail::dispatchEvent(event->event());
      });
  m.def(torch::schema(
      "log_event_values(str name, str[] keys, Tensor[] values, "
      "str[] text_keys, str[] texts) -> ()",
      c10::AliasAnalysisKind::CONSERVATIVE));
  m.impl(
      "log_event_values",
      c10::DispatchKey::CompositeExplicitAutograd,
      TORCH_FN(logEventValues));
}

} // namespace torch_monitor::script
