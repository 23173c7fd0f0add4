#include <torch_monitor/script/config.h>

#include <algorithm>

#include <ATen/core/function.h>

#include <torch_monitor/detail/text.h>
#include <ATen/core/function_schema.h>

namespace torch_monitor::script {

c10::IValue flattenConfig(Config config) {
  std::vector<c10::IValue> items;
  items.reserve(config.size());
  for (auto& [key, value] : config) {
    items.emplace_back(
        c10::ivalue::Tuple::create(c10::IValue(key), std::move(value)));
  }
  return c10::ivalue::Tuple::create(std::move(items));
}

void checkTextArgument(const std::string& what, const std::string& text) {
  torch_monitor::detail::checkText(text, what);
}

void checkTextArgument(const std::string& what, const c10::IValue& value) {
  checkTextIn(value, what);
}

void checkTextIn(const c10::IValue& value, const std::string& what) {
  if (value.isString()) {
    torch_monitor::detail::checkText(value.toStringRef(), what);
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) {
      checkTextIn(item, what);
    }
  } else if (value.isTuple()) {
    for (const c10::IValue& item : value.toTupleRef().elements()) {
      checkTextIn(item, what);
    }
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      checkTextIn(entry.key(), what);
      checkTextIn(entry.value(), what);
    }
  }
  // Objects (a reducer inside a monitor's state) check their own state.
}

std::vector<std::string> constructorArgumentNames(const c10::ClassTypePtr& cls) {
  const auto& arguments = cls->getMethod("__init__").getSchema().arguments();
  std::vector<std::string> names;
  for (size_t i = 1; i < arguments.size(); ++i) {
    names.push_back(
        cls->name()->name() + "() argument '" + arguments[i].name() + "'");
  }
  return names;
}

namespace {

[[noreturn]] void refuse(const c10::ClassTypePtr& cls, const std::string& why) {
  TORCH_CHECK(
      false,
      "cannot load a torch_monitor ",
      cls->name()->name(), // TensorBoardWriter, not its qualified name
      ": ",
      why,
      ". Load the model with the torch_monitor release that saved it (a "
      "corrupted or foreign file?)");
}

// The state's values by argument name.
std::map<std::string, c10::IValue> namedValues(
    const c10::ClassTypePtr& cls,
    const c10::IValue& state,
    int64_t version,
    const std::vector<LegacyState>& legacy) {
  if (!state.isTuple() || state.toTupleRef().elements().empty() ||
      !state.toTupleRef().elements()[0].isInt()) {
    refuse(cls, "its saved state is not a versioned tuple");
  }
  const auto& fields = state.toTupleRef().elements();
  const int64_t saved = fields[0].toInt();
  std::map<std::string, c10::IValue> values;
  if (saved == version) {
    const bool pairs = fields.size() == 2 && fields[1].isTuple();
    if (pairs) {
      for (const c10::IValue& pair : fields[1].toTupleRef().elements()) {
        if (!pair.isTuple() || pair.toTupleRef().elements().size() != 2 ||
            !pair.toTupleRef().elements()[0].isString()) {
          refuse(cls, "an entry of its saved configuration is not a (name, value) pair");
        }
        const auto& kv = pair.toTupleRef().elements();
        values.emplace(kv[0].toStringRef(), kv[1]);
      }
      return values;
    }
    refuse(cls, "its saved state is not (version, configuration)");
  }
  for (const LegacyState& old : legacy) {
    if (old.version != saved) {
      continue;
    }
    if (fields.size() != old.arguments.size() + 1) {
      refuse(
          cls,
          "its state of version " + std::to_string(saved) + " has " +
              std::to_string(fields.size()) + " fields, not " +
              std::to_string(old.arguments.size() + 1));
    }
    for (size_t i = 0; i < old.arguments.size(); ++i) {
      values.emplace(old.arguments[i], fields[i + 1]);
    }
    if (old.upgrade) {
      old.upgrade(values);
    }
    return values;
  }
  std::string known;
  for (const LegacyState& old : legacy) {
    known += std::to_string(old.version) + ", ";
  }
  refuse(
      cls,
      "it was saved with state version " + std::to_string(saved) +
          "; this build reads versions " + known + std::to_string(version));
}

} // namespace

std::vector<c10::IValue> savedConstructorArguments(
    const c10::ClassTypePtr& cls,
    const c10::IValue& state,
    int64_t version,
    const std::vector<LegacyState>& legacy) {
  checkTextIn(state, cls->name()->name() + "'s saved state");
  std::map<std::string, c10::IValue> values =
      namedValues(cls, state, version, legacy);
  const c10::FunctionSchema& schema =
      cls->getMethod("__init__").getSchema();
  const auto& arguments = schema.arguments(); // self first
  std::vector<c10::IValue> out;
  out.reserve(arguments.size() - 1);
  for (size_t i = 1; i < arguments.size(); ++i) {
    const c10::Argument& argument = arguments[i];
    auto saved = values.find(argument.name());
    if (saved != values.end()) {
      if (argument.type()->kind() != c10::TypeKind::AnyType &&
          !saved->second.type()->isSubtypeOf(*argument.type())) {
        refuse(
            cls,
            "its saved '" + argument.name() + "' is a " +
                saved->second.type()->repr_str() + ", not a " +
                argument.type()->repr_str());
      }
      out.push_back(std::move(saved->second));
      values.erase(saved);
    } else if (argument.default_value()) {
      out.push_back(*argument.default_value());
    } else {
      refuse(cls, "its saved state has no '" + argument.name() + "'");
    }
  }
  if (!values.empty()) {
    refuse(
        cls,
        "its saved state has '" + values.begin()->first +
            "', which this build's constructor does not take");
  }
  return out;
}

} // namespace torch_monitor::script
