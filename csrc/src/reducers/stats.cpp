#include <torch_monitor/reducers/stats.h>

#include <ATen/ATen.h>

namespace torch_monitor {
namespace {

// prev + (next - prev) / dt * sampleAt, in inferno's order of operations so
// float32 results match it bit for bit.
at::Tensor interpolateLinear(
    const at::Tensor& prev,
    const at::Tensor& next,
    const at::Tensor& sampleAt,
    double stepTime) {
  return prev + (next - prev) / stepTime * sampleAt;
}

void checkAlpha(double alpha) {
  TORCH_CHECK_VALUE(
      alpha >= 0.0 && alpha <= 1.0,
      "EMAReducer: alpha must be in [0, 1] (the weight of each new "
      "observation), got ",
      alpha);
}

} // namespace

EMAReducer::EMAReducer(
    double stepTime,
    double alpha,
    double duration,
    bool inclusive,
    bool inplace)
    : FoldReducer(stepTime, duration, inclusive, inplace, 0.0), alpha_(alpha) {
  checkAlpha(alpha);
}

void EMAReducer::setAlpha(double alpha) {
  detail::BlockingLock guard(mutex());
  checkAlpha(alpha);
  alpha_ = alpha;
}

std::map<std::string, double> EMAReducer::paramsLocked() const {
  return {{"alpha", alpha_}};
}

void EMAReducer::setParamLocked(const std::string& name, double value) {
  if (name != "alpha") {
    unknownParam(name);
  }
  setAlpha(value);
}

at::Tensor EMAReducer::fold(
    const std::vector<at::Tensor>& inputs,
    const std::optional<at::Tensor>& state) {
  const at::Tensor x = asState(inputs[0]);
  if (!state) {
    return x;
  }
  return x * alpha_ + *state * (1.0 - alpha_);
}

at::Tensor EMAReducer::interpolate(
    const at::Tensor& prev,
    const at::Tensor& next,
    const at::Tensor& sampleAt,
    double stepTime) const {
  return interpolateLinear(prev, next, sampleAt, stepTime);
}

CAReducer::CAReducer(
    double stepTime,
    double duration,
    bool inclusive,
    bool inplace)
    : FoldReducer(stepTime, duration, inclusive, inplace, 0.0) {}

at::Tensor CAReducer::fold(
    const std::vector<at::Tensor>& inputs,
    const std::optional<at::Tensor>& state) {
  const at::Tensor x = asState(inputs[0]);
  if (!state) {
    return x;
  }
  // steps() counts this observation: the n of s + (x - s) / n. A host
  // number, so nothing is read back from the device.
  return *state + (x - *state) / static_cast<double>(steps());
}

at::Tensor CAReducer::interpolate(
    const at::Tensor& prev,
    const at::Tensor& next,
    const at::Tensor& sampleAt,
    double stepTime) const {
  return interpolateLinear(prev, next, sampleAt, stepTime);
}

} // namespace torch_monitor
