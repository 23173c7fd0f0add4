#include <torch_monitor/reducers/general.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>

namespace torch_monitor {

PassthroughReducer::PassthroughReducer(
    double stepTime,
    double duration,
    bool inclusive,
    bool inplace)
    : FoldReducer(stepTime, duration, inclusive, inplace, 0.0) {}

at::Tensor PassthroughReducer::fold(
    const std::vector<at::Tensor>& inputs,
    const std::optional<at::Tensor>& /*state*/) {
  return asState(inputs[0]);
}

at::Tensor PassthroughReducer::interpolate(
    const at::Tensor& prev,
    const at::Tensor& /*next*/,
    const at::Tensor& /*sampleAt*/,
    double /*stepTime*/) const {
  return prev;
}

double EventReducer::initialValue(const std::string& initial) {
  std::string lower = initial;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  if (lower == "inf") {
    return std::numeric_limits<double>::infinity();
  }
  if (lower == "zero") {
    return 0.0;
  }
  TORCH_CHECK_VALUE(
      lower == "nan",
      "EventReducer: initial must be 'inf', 'zero' or 'nan' (the value before "
      "the first event), got '",
      initial,
      "'");
  return std::numeric_limits<double>::quiet_NaN();
}

EventReducer::EventReducer(
    double stepTime,
    Criterion criterion,
    const std::string& initial,
    double duration,
    bool inclusive,
    bool inplace)
    : FoldReducer(stepTime, duration, inclusive, inplace, initialValue(initial)),
      criterion_(std::move(criterion)) {
  TORCH_CHECK_VALUE(
      criterion_.valid(),
      "EventReducer needs a criterion (e.g. Criterion::builtin(\"gt\", 0.0))");
}

std::map<std::string, double> EventReducer::paramsLocked() const {
  return {{"initial", fill()}};
}

void EventReducer::setParamLocked(const std::string& name, double value) {
  if (name != "initial") {
    unknownParam(name);
  }
  const bool same =
      value == fill() || (std::isnan(value) && std::isnan(fill()));
  TORCH_CHECK_VALUE(
      same,
      "EventReducer: initial is fixed at construction (it is ",
      fill(),
      "); build a new reducer to use ",
      value);
}

void EventReducer::setCriterionLocked(Criterion criterion) {
  TORCH_CHECK_VALUE(
      criterion.valid(), "EventReducer: the criterion cannot be empty");
  criterion_ = std::move(criterion);
}

at::Tensor EventReducer::fold(
    const std::vector<at::Tensor>& inputs,
    const std::optional<at::Tensor>& state) {
  const at::Tensor matched = criterion_(inputs[0]);
  if (!state) {
    return at::full(
               matched.sizes(), fill(), matched.options().dtype(dtype()))
        .masked_fill_(matched, 0.0);
  }
  return at::where(matched, 0.0, *state + stepTime());
}

at::Tensor EventReducer::interpolate(
    const at::Tensor& prev,
    const at::Tensor& /*next*/,
    const at::Tensor& sampleAt,
    double /*stepTime*/) const {
  return prev + sampleAt;
}

} // namespace torch_monitor
