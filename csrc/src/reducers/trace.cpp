#include <torch_monitor/reducers/trace.h>

#include <cmath>

#include <ATen/ATen.h>

namespace torch_monitor {
namespace {

// The conditional traces accept any dtype for the condition; nonzero counts
// as a match.
at::Tensor asMask(const at::Tensor& condition) {
  return condition.scalar_type() == at::kBool ? condition : at::ne(condition, 0);
}

} // namespace

// ---- TraceReducer -------------------------------------------------------

TraceReducer::TraceReducer(
    const char* kindName,
    double stepTime,
    double timeConstant,
    double amplitude,
    bool amplitudeMayBeZero,
    double duration,
    bool inclusive,
    bool inplace)
    : FoldReducer(stepTime, duration, inclusive, inplace, 0.0),
      timeConstant_(timeConstant),
      amplitude_(amplitude),
      amplitudeMayBeZero_(amplitudeMayBeZero) {
  checkTimeConstant(kindName, timeConstant);
  checkAmplitude(kindName, amplitude, amplitudeMayBeZero);
  updateDecay();
}

void TraceReducer::checkTimeConstant(const char* kindName, double timeConstant) {
  TORCH_CHECK_VALUE(
      timeConstant > 0,
      kindName,
      ": time_constant must be greater than 0, got ",
      timeConstant);
}

void TraceReducer::checkAmplitude(
    const char* kindName,
    double amplitude,
    bool mayBeZero) {
  TORCH_CHECK_VALUE(
      mayBeZero || amplitude != 0.0,
      kindName,
      ": amplitude must not be 0 (the value a match sets or adds)");
}

void TraceReducer::setTimeConstant(double timeConstant) {
  detail::BlockingLock guard(mutex());
  checkTimeConstant(kind(), timeConstant);
  timeConstant_ = timeConstant;
  updateDecay();
}

void TraceReducer::setAmplitude(double amplitude) {
  detail::BlockingLock guard(mutex());
  checkAmplitude(kind(), amplitude, amplitudeMayBeZero_);
  amplitude_ = amplitude;
}

void TraceReducer::updateDecay() {
  decay_ = std::exp(-stepTime() / timeConstant_);
}

void TraceReducer::onStepTimeChanged() {
  updateDecay();
}

std::map<std::string, double> TraceReducer::paramsLocked() const {
  return {{"time_constant", timeConstant_}, {"amplitude", amplitude_}};
}

void TraceReducer::setParamLocked(const std::string& name, double value) {
  if (name == "time_constant") {
    setTimeConstant(value);
  } else if (name == "amplitude") {
    setAmplitude(value);
  } else {
    unknownParam(name);
  }
}

at::Tensor TraceReducer::interpolate(
    const at::Tensor& prev,
    const at::Tensor& /*next*/,
    const at::Tensor& sampleAt,
    double /*stepTime*/) const {
  return prev * at::exp(sampleAt.neg() / timeConstant_);
}

// ---- TargetTraceReducer -------------------------------------------------

TargetTraceReducer::TargetTraceReducer(
    const char* kindName,
    double stepTime,
    double timeConstant,
    double amplitude,
    double target,
    std::optional<double> tolerance,
    double duration,
    bool inclusive,
    bool inplace)
    : TraceReducer(
          kindName,
          stepTime,
          timeConstant,
          amplitude,
          /*amplitudeMayBeZero=*/false,
          duration,
          inclusive,
          inplace),
      target_(target),
      tolerance_(tolerance) {
  checkTolerance(kindName, tolerance);
}

void TargetTraceReducer::checkTolerance(
    const char* kindName,
    const std::optional<double>& tolerance) {
  TORCH_CHECK_VALUE(
      !tolerance || *tolerance > 0,
      kindName,
      ": tolerance must be greater than 0 (or None for exact matches), got ",
      tolerance.value_or(0.0));
}

void TargetTraceReducer::setTolerance(std::optional<double> tolerance) {
  detail::BlockingLock guard(mutex());
  checkTolerance(kind(), tolerance);
  tolerance_ = tolerance;
}

std::map<std::string, double> TargetTraceReducer::paramsLocked() const {
  auto out = TraceReducer::paramsLocked();
  out["target"] = target_;
  if (tolerance_) {
    out["tolerance"] = *tolerance_;
  }
  return out;
}

void TargetTraceReducer::setParamLocked(const std::string& name, double value) {
  if (name == "target") {
    setTarget(value);
  } else if (name == "tolerance") {
    // NaN unsets it (exact matches), as None does in Python.
    setTolerance(
        std::isnan(value) ? std::nullopt : std::optional<double>(value));
  } else {
    TraceReducer::setParamLocked(name, value);
  }
}

at::Tensor TargetTraceReducer::matches(const at::Tensor& x) const {
  if (tolerance_) {
    return (x - target_).abs() <= *tolerance_;
  }
  return at::eq(x, target_);
}

NearestTraceReducer::NearestTraceReducer(
    double stepTime,
    double timeConstant,
    double amplitude,
    double target,
    std::optional<double> tolerance,
    double duration,
    bool inclusive,
    bool inplace)
    : TargetTraceReducer(
          "NearestTraceReducer",
          stepTime,
          timeConstant,
          amplitude,
          target,
          tolerance,
          duration,
          inclusive,
          inplace) {}

at::Tensor NearestTraceReducer::fold(
    const std::vector<at::Tensor>& inputs,
    const std::optional<at::Tensor>& state) {
  const at::Tensor x = asState(inputs[0]);
  const at::Tensor mask = matches(x);
  if (!state) {
    return mask.to(x.scalar_type()) * amplitude();
  }
  return at::where(mask, amplitude(), *state * decay());
}

CumulativeTraceReducer::CumulativeTraceReducer(
    double stepTime,
    double timeConstant,
    double amplitude,
    double target,
    std::optional<double> tolerance,
    double duration,
    bool inclusive,
    bool inplace)
    : TargetTraceReducer(
          "CumulativeTraceReducer",
          stepTime,
          timeConstant,
          amplitude,
          target,
          tolerance,
          duration,
          inclusive,
          inplace) {}

at::Tensor CumulativeTraceReducer::fold(
    const std::vector<at::Tensor>& inputs,
    const std::optional<at::Tensor>& state) {
  const at::Tensor x = asState(inputs[0]);
  const at::Tensor mask = matches(x);
  if (!state) {
    return mask.to(x.scalar_type()) * amplitude();
  }
  return *state * decay() + mask.to(state->scalar_type()) * amplitude();
}

// ---- ScaledTraceReducer -------------------------------------------------

ScaledTraceReducer::ScaledTraceReducer(
    const char* kindName,
    double stepTime,
    double timeConstant,
    double amplitude,
    double scale,
    double duration,
    bool inclusive,
    bool inplace)
    : TraceReducer(
          kindName,
          stepTime,
          timeConstant,
          amplitude,
          /*amplitudeMayBeZero=*/true,
          duration,
          inclusive,
          inplace),
      scale_(scale) {}

std::map<std::string, double> ScaledTraceReducer::paramsLocked() const {
  auto out = TraceReducer::paramsLocked();
  out["scale"] = scale_;
  return out;
}

void ScaledTraceReducer::setParamLocked(const std::string& name, double value) {
  if (name == "scale") {
    setScale(value);
  } else {
    TraceReducer::setParamLocked(name, value);
  }
}

at::Tensor ScaledTraceReducer::foldNearest(
    const at::Tensor& x,
    const at::Tensor& mask,
    const std::optional<at::Tensor>& state) const {
  const at::Tensor value = x * scale_ + amplitude();
  if (!state) {
    return value * mask;
  }
  return at::where(mask, value, *state * decay());
}

at::Tensor ScaledTraceReducer::foldCumulative(
    const at::Tensor& x,
    const at::Tensor& mask,
    const std::optional<at::Tensor>& state) const {
  const at::Tensor value = x * scale_ + amplitude();
  if (!state) {
    return value * mask;
  }
  return *state * decay() + value * mask;
}

namespace {
void checkCriterion(const Criterion& criterion, const char* kind) {
  TORCH_CHECK_VALUE(
      criterion.valid(),
      kind,
      " needs a criterion (e.g. Criterion::builtin(\"gt\", 0.0))");
}
} // namespace

ScaledNearestTraceReducer::ScaledNearestTraceReducer(
    double stepTime,
    double timeConstant,
    double amplitude,
    double scale,
    Criterion criterion,
    double duration,
    bool inclusive,
    bool inplace)
    : ScaledTraceReducer(
          "ScaledNearestTraceReducer",
          stepTime,
          timeConstant,
          amplitude,
          scale,
          duration,
          inclusive,
          inplace),
      criterion_(std::move(criterion)) {
  checkCriterion(criterion_, kind());
}

void ScaledNearestTraceReducer::setCriterionLocked(Criterion criterion) {
  checkCriterion(criterion, kind());
  criterion_ = std::move(criterion);
}

at::Tensor ScaledNearestTraceReducer::fold(
    const std::vector<at::Tensor>& inputs,
    const std::optional<at::Tensor>& state) {
  // The criterion sees the observation as given (a bool spike tensor stays
  // bool); the trace arithmetic runs in the history's dtype.
  const at::Tensor mask = criterion_(inputs[0]);
  return foldNearest(asState(inputs[0]), mask, state);
}

ScaledCumulativeTraceReducer::ScaledCumulativeTraceReducer(
    double stepTime,
    double timeConstant,
    double amplitude,
    double scale,
    Criterion criterion,
    double duration,
    bool inclusive,
    bool inplace)
    : ScaledTraceReducer(
          "ScaledCumulativeTraceReducer",
          stepTime,
          timeConstant,
          amplitude,
          scale,
          duration,
          inclusive,
          inplace),
      criterion_(std::move(criterion)) {
  checkCriterion(criterion_, kind());
}

void ScaledCumulativeTraceReducer::setCriterionLocked(Criterion criterion) {
  checkCriterion(criterion, kind());
  criterion_ = std::move(criterion);
}

at::Tensor ScaledCumulativeTraceReducer::fold(
    const std::vector<at::Tensor>& inputs,
    const std::optional<at::Tensor>& state) {
  const at::Tensor mask = criterion_(inputs[0]);
  return foldCumulative(asState(inputs[0]), mask, state);
}

ConditionalNearestTraceReducer::ConditionalNearestTraceReducer(
    double stepTime,
    double timeConstant,
    double amplitude,
    double scale,
    double duration,
    bool inclusive,
    bool inplace)
    : ScaledTraceReducer(
          "ConditionalNearestTraceReducer",
          stepTime,
          timeConstant,
          amplitude,
          scale,
          duration,
          inclusive,
          inplace) {}

at::Tensor ConditionalNearestTraceReducer::fold(
    const std::vector<at::Tensor>& inputs,
    const std::optional<at::Tensor>& state) {
  return foldNearest(asState(inputs[0]), asMask(inputs[1]), state);
}

ConditionalCumulativeTraceReducer::ConditionalCumulativeTraceReducer(
    double stepTime,
    double timeConstant,
    double amplitude,
    double scale,
    double duration,
    bool inclusive,
    bool inplace)
    : ScaledTraceReducer(
          "ConditionalCumulativeTraceReducer",
          stepTime,
          timeConstant,
          amplitude,
          scale,
          duration,
          inclusive,
          inplace) {}

at::Tensor ConditionalCumulativeTraceReducer::fold(
    const std::vector<at::Tensor>& inputs,
    const std::optional<at::Tensor>& state) {
  return foldCumulative(asState(inputs[0]), asMask(inputs[1]), state);
}

} // namespace torch_monitor
