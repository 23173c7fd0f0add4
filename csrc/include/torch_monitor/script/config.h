#pragma once

// An object's configuration: what its constructor took, as (name, value)
// pairs. It serves PyTorch 2 (__obj_flatten__) and, for an object whose
// configuration is all it has to save, the one versioned state that every
// copy kind goes through (defineConfigState).

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/util/TypeList.h>
#include <torch/custom_class.h>

namespace torch_monitor::script {

// An object's configuration as (key, value) pairs: what its constructor
// took, never what changes from step to step.
using Config = std::vector<std::pair<std::string, c10::IValue>>;

// ((key, value), ...) as PyTorch 2 expects from __obj_flatten__.
c10::IValue flattenConfig(Config config);

// A TorchScript dict argument (a sink's labels, a reducer's parameters) as
// the std::map the core takes, and back.
template <class K, class V>
std::map<K, V> mapOf(const c10::Dict<K, V>& dict) {
  std::map<K, V> out;
  for (const auto& entry : dict) {
    out.emplace(entry.key(), entry.value());
  }
  return out;
}
template <class K, class V>
c10::Dict<K, V> dictOf(const std::map<K, V>& map) {
  c10::Dict<K, V> out;
  for (const auto& [key, value] : map) {
    out.insert(key, value);
  }
  return out;
}

// Gives a custom class what torch.compile and torch.export need of it:
// * __obj_flatten__: they build the class's fake object (torch_monitor._fake)
//   from what it returns, and Dynamo guards on it. `config(self)` must
//   therefore list configuration only; a per-step number there would
//   recompile every step.
// * __eq__, by the C++ object: PT2 compares the objects it lifts into a
//   graph, and torch.ScriptObject's == raises for a class without one. Each
//   read of an object held by another (a monitor's reducer()) wraps it in a
//   new TorchScript object, equal to the first.
template <class Holder, class ConfigOf>
torch::class_<Holder>& defineFlatten(
    torch::class_<Holder>& cls,
    ConfigOf config) {
  return cls
      .def(
          "__obj_flatten__",
          [config](const c10::intrusive_ptr<Holder>& self) -> c10::IValue {
            return flattenConfig(config(*self));
          })
      .def(
          "__eq__",
          [](const c10::intrusive_ptr<Holder>& self, const c10::IValue& other) {
            return other.isCustomClass() &&
                other.type() ==
                c10::getCustomClassType<c10::intrusive_ptr<Holder>>() &&
                other.toCustomClass<Holder>().get() == self.get();
          });
}

// Text: every string a torch_monitor object is made from passes the one
// check (detail::checkText: UTF-8 without NUL) before the object sees it,
// whatever the class. textChecked() wraps a constructor's function (what
// torch::init takes) so that its text arguments are checked, each named as
// the class's schema names it ("Stat() argument 'name'"); checkTextIn()
// walks a saved state before it is loaded ("Stat's saved state"). A class
// registered through them needs no check of its own. Each throws
// c10::ValueError.
void checkTextIn(const c10::IValue& value, const std::string& what);

template <class T>
void checkTextArgument(const std::string&, const T&) {} // holds no text
void checkTextArgument(const std::string& what, const std::string& text);
void checkTextArgument(const std::string& what, const c10::IValue& value);
// (Declared together so that each finds the others for what it holds.)
template <class T>
void checkTextArgument(const std::string& what, const std::vector<T>& values);
template <class T>
void checkTextArgument(const std::string& what, const std::optional<T>& value);
template <class K, class V>
void checkTextArgument(const std::string& what, const c10::Dict<K, V>& values);
template <class T>
void checkTextArgument(const std::string& what, const std::vector<T>& values) {
  for (const T& value : values) {
    checkTextArgument(what, value);
  }
}
template <class T>
void checkTextArgument(const std::string& what, const std::optional<T>& value) {
  if (value) {
    checkTextArgument(what, *value);
  }
}
template <class K, class V>
void checkTextArgument(const std::string& what, const c10::Dict<K, V>& values) {
  for (const auto& entry : values) {
    checkTextArgument(what, entry.key());
    checkTextArgument(what, entry.value());
  }
}

// "Stat() argument 'name'", ... for each argument of class `cls`'s
// constructor schema (without self).
std::vector<std::string> constructorArgumentNames(const c10::ClassTypePtr& cls);

template <class F, class... Args>
auto textCheckedFunction(F function, c10::guts::typelist::typelist<Args...>) {
  using Holder = typename std::invoke_result_t<F, Args...>::element_type;
  return [function](Args... args) {
    // Read from the registered schema once (the first construction, on the
    // constructing thread).
    static const std::vector<std::string> names = constructorArgumentNames(
        c10::getCustomClassType<c10::intrusive_ptr<Holder>>());
    size_t i = 0;
    (checkTextArgument(names.at(i++), args), ...);
    return function(std::forward<Args>(args)...);
  };
}

// `function` (a constructor's, for torch::init) with its text arguments
// checked first.
template <class F>
auto textChecked(F function) {
  using Traits = c10::guts::infer_function_traits_t<F>;
  return textCheckedFunction(std::move(function), typename Traits::parameter_types{});
}

// What an earlier state version held: its fields, in order, after the
// version number (a tuple without names), named as the constructor's
// arguments or, where a field was saved in another form, by a name
// `upgrade` replaces with the arguments it stands for.
struct LegacyState {
  int64_t version;
  std::vector<std::string> arguments;
  std::function<void(std::map<std::string, c10::IValue>&)> upgrade = nullptr;
};

// The arguments of class `cls`'s constructor (its registered schema,
// without self), each read from the state's named values: the value saved
// under the argument's name, else the schema's default (a state saved
// before the argument existed). Throws c10::Error, naming the class, for a
// state that is not of this class's versions or lacks a required argument.
std::vector<c10::IValue> savedConstructorArguments(
    const c10::ClassTypePtr& cls,
    const c10::IValue& state,
    int64_t version,
    const std::vector<LegacyState>& legacy);

// A saved value as the constructor function's argument type (an IValue
// argument takes it as it is).
template <class T>
T argumentAs(c10::IValue&& value) {
  if constexpr (std::is_same_v<T, c10::IValue>) {
    return std::move(value);
  } else {
    return std::move(value).to<T>();
  }
}

template <class Holder, class... Args, size_t... I>
c10::intrusive_ptr<Holder> callWithArguments(
    c10::intrusive_ptr<Holder> (*make)(Args...),
    std::vector<c10::IValue>& values,
    std::index_sequence<I...>) {
  return make(argumentAs<std::decay_t<Args>>(std::move(values[I]))...);
}

// What defineConfigState keeps per class: torch::class_::def_pickle takes
// only lambdas without captures, which reach it through here.
// A function-local static, built on first use: the library's registration
// runs during static initialisation, before an inline static member of a
// template is guaranteed to exist.
template <class Holder>
struct ConfigState {
  std::function<c10::IValue(Holder&)> save;
  std::function<c10::intrusive_ptr<Holder>(const c10::IValue&)> load;

  static ConfigState& of() {
    static ConfigState state;
    return state;
  }
};

// Defines the object's one versioned state, (version, ((argument, value),
// ...)): `config(self)` names every constructor argument, so whatever the
// constructor takes is saved, and loading calls `make` (the function the
// constructor runs) with the saved values by name. A state of an earlier
// version is read by the names `legacy` gives its fields, and an argument
// added since then takes its schema default: adding a constructor argument
// to such a class touches its registration only. `make` refuses what the
// constructor refuses (a path with NUL, an unknown name): a corrupted
// archive gets the constructor's error. `config` may throw to refuse a
// save (a monitor holding a Python callable).
template <class Holder, class ConfigOf, class... Args>
torch::class_<Holder>& defineConfigPickle(
    torch::class_<Holder>& cls,
    int64_t version,
    c10::intrusive_ptr<Holder> (*make)(Args...),
    ConfigOf config,
    std::vector<LegacyState> legacy = {}) {
  ConfigState<Holder>::of().save = [config, version](Holder& self) -> c10::IValue {
    return c10::ivalue::Tuple::create(
        c10::IValue(version), flattenConfig(config(self)));
  };
  ConfigState<Holder>::of().load = [make, version, legacy = std::move(legacy)](
                                  const c10::IValue& state) {
    std::vector<c10::IValue> values = savedConstructorArguments(
        c10::getCustomClassType<c10::intrusive_ptr<Holder>>(),
        state,
        version,
        legacy);
    TORCH_INTERNAL_ASSERT(
        values.size() == sizeof...(Args),
        "the constructor's schema and its function differ in arity");
    return callWithArguments(make, values, std::index_sequence_for<Args...>{});
  };
  return cls.def_pickle(
      [](const c10::intrusive_ptr<Holder>& self) -> c10::IValue {
        return ConfigState<Holder>::of().save(*self);
      },
      [](c10::IValue state) { return ConfigState<Holder>::of().load(state); });
}

// defineFlatten and defineConfigPickle with one configuration: for an
// object whose constructor arguments are also what PyTorch 2 guards on.
template <class Holder, class ConfigOf, class... Args>
torch::class_<Holder>& defineConfigState(
    torch::class_<Holder>& cls,
    int64_t version,
    c10::intrusive_ptr<Holder> (*make)(Args...),
    ConfigOf config,
    std::vector<LegacyState> legacy = {}) {
  defineFlatten(cls, config);
  return defineConfigPickle(cls, version, make, config, std::move(legacy));
}

} // namespace torch_monitor::script
