// The folds and interpolations that reducerKindTable() names, as FoldReducer
// applies them. A new kind of fold is a FoldRule and its case here.

#include <torch_monitor/reducers/fold_reducer.h>

#include <cmath>

#include <ATen/ATen.h>

namespace torch_monitor {

at::Tensor FoldReducer::matches(
    const std::vector<at::Tensor>& inputs,
    const at::Tensor& x) const {
  switch (kind_.match) {
    case MatchSource::None:
      return at::Tensor();
    case MatchSource::Criterion:
      // The criterion sees the observation as given (a bool spike tensor
      // stays bool).
      return criterion_(inputs[0]);
    case MatchSource::Target: {
      const double target = params_.at("target");
      const auto tolerance = params_.find("tolerance");
      return tolerance == params_.end() ? at::eq(x, target)
                                        : (x - target).abs() <= tolerance->second;
    }
    case MatchSource::Condition:
      // Any dtype: nonzero elements match.
      return inputs[1].scalar_type() == at::kBool ? inputs[1]
                                                  : at::ne(inputs[1], 0);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled MatchSource");
}

at::Tensor FoldReducer::fold(
    const std::vector<at::Tensor>& inputs,
    const std::optional<at::Tensor>& state) const {
  if (custom_) {
    return custom_->fold(inputs, state);
  }
  // The event fold needs only the matches: spare it the cast.
  const at::Tensor x =
      kind_.fold == FoldRule::Event ? at::Tensor() : asState(inputs[0]);
  const at::Tensor mask = matches(inputs, x);
  switch (kind_.fold) {
    case FoldRule::Passthrough:
      return x;
    case FoldRule::Event:
      if (!state) {
        return at::full(mask.sizes(), history_.fill(), mask.options().dtype(dtype()))
            .masked_fill_(mask, 0.0);
      }
      return at::where(mask, 0.0, *state + stepTime_);
    case FoldRule::MovingAverage: {
      const double alpha = params_.at("alpha");
      return state ? x * alpha + *state * (1.0 - alpha) : x;
    }
    case FoldRule::CumulativeAverage:
      // steps_ counts this observation: the n of s + (x - s) / n, a host
      // number, so nothing is read back from the device.
      return state ? *state + (x - *state) / static_cast<double>(steps_) : x;
    case FoldRule::NearestTrace:
    case FoldRule::CumulativeTrace:
      return traceFold(x, mask, state);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled FoldRule");
}

// The six traces: a match sets (nearest) or adds (cumulative) its
// contribution, scale * x + amplitude (or the amplitude alone for kinds
// without a scale); otherwise the trace decays by exp(-stepTime /
// time_constant). Operations in inferno's order, so float32 results match it
// bit for bit.
at::Tensor FoldReducer::traceFold(
    const at::Tensor& x,
    const at::Tensor& mask,
    const std::optional<at::Tensor>& state) const {
  const double amplitude = params_.at("amplitude");
  const auto scale = params_.find("scale");
  const at::Tensor added = scale == params_.end()
      ? mask.to(x.scalar_type()) * amplitude
      : (x * scale->second + amplitude) * mask;
  if (!state) {
    return added;
  }
  const at::Tensor decayed =
      *state * std::exp(-stepTime_ / params_.at("time_constant"));
  if (kind_.fold == FoldRule::CumulativeTrace) {
    return decayed + added;
  }
  return at::where(mask, added, decayed);
}

at::Tensor FoldReducer::interpolate(
    const at::Tensor& prev,
    const at::Tensor& next,
    const at::Tensor& sampleAt,
    double stepTime) const {
  if (custom_ && custom_->interpolate) {
    at::Tensor state = custom_->interpolate(prev, next, sampleAt, stepTime);
    // view() would hand a wrongly shaped result back as if it were a state.
    TORCH_CHECK_VALUE(
        state.sizes() == prev.sizes(),
        custom_->description,
        ".interpolate returned a tensor of shape ",
        state.sizes(),
        " where the states it interpolates have shape ",
        prev.sizes(),
        "; it must return the state sample_at after prev, shaped like prev");
    return state;
  }
  switch (kind_.interpolation) {
    case Interpolation::Previous:
      return prev;
    case Interpolation::Elapsed:
      return prev + sampleAt;
    case Interpolation::Linear:
      return prev + (next - prev) / stepTime * sampleAt;
    case Interpolation::Decay:
      return prev * at::exp(sampleAt.neg() / params_.at("time_constant"));
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled Interpolation");
}

} // namespace torch_monitor
