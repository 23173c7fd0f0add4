#include <torch_monitor/reducers/kinds.h>

#include <cmath>
#include <limits>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace torch_monitor {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool allowed(ParamCheck check, double value) {
  switch (check) {
    case ParamCheck::Any:
      return true;
    case ParamCheck::Positive:
      return value > 0;
    case ParamCheck::NonZero:
      return value != 0;
    case ParamCheck::UnitInterval:
      return value >= 0 && value <= 1;
    case ParamCheck::InfZeroNan:
      return std::isnan(value) || value == 0 || value == kInf;
  }
  return false;
}

std::vector<std::string> paramNames(const ReducerKind& kind) {
  std::vector<std::string> names;
  for (const ParamSpec& spec : kind.params) {
    names.push_back(spec.name);
  }
  return names;
}

[[noreturn]] void unknownParam(const ReducerKind& kind, const std::string& name) {
  const std::vector<std::string> names = paramNames(kind);
  C10_THROW_ERROR(
      ValueError,
      c10::str(
          kind.name,
          " has no parameter '",
          name,
          "'",
          names.empty() ? std::string("; it takes none")
                        : "; its parameters are " + c10::Join(", ", names)));
}

} // namespace

const std::vector<ReducerKind>& reducerKindTable() {
  static const std::vector<ReducerKind> table = [] {
    using M = MatchSource;
    using F = FoldRule;
    using I = Interpolation;
    // Parameters several kinds share (locals: no static initialisation order
    // to depend on).
    const ParamSpec kTimeConstant{"time_constant", std::nullopt, ParamCheck::Positive};
    const ParamSpec kMatchAmplitude{"amplitude", std::nullopt, ParamCheck::NonZero};
    const ParamSpec kScaledAmplitude{"amplitude", std::nullopt, ParamCheck::Any};
    const ParamSpec kTarget{"target", std::nullopt, ParamCheck::Any};
    const ParamSpec kTolerance{"tolerance", std::nullopt, ParamCheck::Positive, /*unsettable=*/true};
    const ParamSpec kScale{"scale", std::nullopt, ParamCheck::Any};
    // name, parameters, matches, fold, interpolation, fill parameter.
    return std::vector<ReducerKind>{
        {"PassthroughReducer", {}, M::None, F::Passthrough, I::Previous, ""},
        {"EventReducer", {{"initial", kInf, ParamCheck::InfZeroNan, false, /*fixed=*/true}}, M::Criterion, F::Event, I::Elapsed, "initial"},
        {"EMAReducer", {{"alpha", std::nullopt, ParamCheck::UnitInterval}}, M::None, F::MovingAverage, I::Linear, ""},
        {"CAReducer", {}, M::None, F::CumulativeAverage, I::Linear, ""},
        {"NearestTraceReducer", {kTimeConstant, kMatchAmplitude, kTarget, kTolerance}, M::Target, F::NearestTrace, I::Decay, ""},
        {"CumulativeTraceReducer", {kTimeConstant, kMatchAmplitude, kTarget, kTolerance}, M::Target, F::CumulativeTrace, I::Decay, ""},
        {"ScaledNearestTraceReducer", {kTimeConstant, kScaledAmplitude, kScale}, M::Criterion, F::NearestTrace, I::Decay, ""},
        {"ScaledCumulativeTraceReducer", {kTimeConstant, kScaledAmplitude, kScale}, M::Criterion, F::CumulativeTrace, I::Decay, ""},
        {"ConditionalNearestTraceReducer", {kTimeConstant, kScaledAmplitude, kScale}, M::Condition, F::NearestTrace, I::Decay, ""},
        {"ConditionalCumulativeTraceReducer", {kTimeConstant, kScaledAmplitude, kScale}, M::Condition, F::CumulativeTrace, I::Decay, ""},
    };
  }();
  return table;
}

const std::vector<std::string>& reducerKinds() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const ReducerKind& kind : reducerKindTable()) {
      out.push_back(kind.name);
    }
    return out;
  }();
  return names;
}

const ReducerKind& reducerKind(const std::string& name) {
  for (const ReducerKind& kind : reducerKindTable()) {
    if (kind.name == name) {
      return kind;
    }
  }
  C10_THROW_ERROR(
      ValueError,
      c10::str(
          "unknown reducer kind '",
          name,
          "'; the kinds are ",
          c10::Join(", ", reducerKinds())));
}

const char* describeCheck(ParamCheck check) noexcept {
  switch (check) {
    case ParamCheck::Any:
      return "any number";
    case ParamCheck::Positive:
      return "greater than 0";
    case ParamCheck::NonZero:
      return "non-zero";
    case ParamCheck::UnitInterval:
      return "in [0, 1]";
    case ParamCheck::InfZeroNan:
      return "inf, 0 or nan (in Python 'inf', 'zero' or 'nan')";
  }
  return "";
}

const ParamSpec* ReducerKind::param(const std::string& name) const noexcept {
  for (const ParamSpec& spec : params) {
    if (spec.name == name) {
      return &spec;
    }
  }
  return nullptr;
}

void ReducerKind::checkParam(const std::string& name, double value) const {
  const ParamSpec* spec = param(name);
  if (spec == nullptr) {
    unknownParam(*this, name);
  }
  TORCH_CHECK_VALUE(
      allowed(spec->check, value) || (spec->unsettable && std::isnan(value)),
      this->name,
      ": ",
      name,
      " must be ",
      describeCheck(spec->check),
      spec->unsettable ? " (or unset: None in Python, NaN in C++)" : "",
      ", got ",
      value);
}

std::map<std::string, double> ReducerKind::resolveParams(
    const std::map<std::string, double>& given) const {
  for (const auto& entry : given) {
    checkParam(entry.first, entry.second);
  }
  std::map<std::string, double> out;
  for (const ParamSpec& spec : params) {
    const auto it = given.find(spec.name);
    if (it != given.end()) {
      if (!(spec.unsettable && std::isnan(it->second))) {
        out.emplace(spec.name, it->second);
      }
    } else if (spec.defaultValue) {
      out.emplace(spec.name, *spec.defaultValue);
    } else {
      TORCH_CHECK_VALUE(
          spec.unsettable,
          name,
          " needs the parameter '",
          spec.name,
          "' (",
          describeCheck(spec.check),
          ")");
    }
  }
  return out;
}

double ReducerKind::fill(const std::map<std::string, double>& resolved) const {
  return fillParam.empty() ? 0.0 : resolved.at(fillParam);
}

} // namespace torch_monitor
