#include <torch_monitor/reducers/fold_reducer.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>

namespace torch_monitor {
namespace {

const char* inputsWord(size_t arity) {
  return arity == 1 ? "one tensor (the observation)"
                    : "two tensors (the observation and the condition)";
}

// Undoes a step count when fold() or the checks after it throw, so a failed
// forward leaves the reducer as it was.
class StepGuard {
 public:
  explicit StepGuard(int64_t& steps) : steps_(steps) {
    ++steps_;
  }
  ~StepGuard() {
    if (!committed_) {
      --steps_;
    }
  }
  void commit() noexcept {
    committed_ = true;
  }

 private:
  int64_t& steps_;
  bool committed_ = false;
};

} // namespace

FoldReducer::FoldReducer(
    const ReducerKind& kind,
    double stepTime,
    double duration,
    bool inclusive,
    bool inplace,
    const std::map<std::string, double>& params,
    Criterion criterion)
    : kind_(kind),
      params_(kind.resolveParams(params)),
      criterion_(std::move(criterion)),
      stepTime_(stepTime),
      duration_(duration),
      inclusive_(inclusive),
      inplace_(inplace),
      history_(
          torch_monitor::historySize(stepTime, duration, inclusive),
          kind.fill(params_)) {
  if (kind_.takesCriterion()) {
    checkCriterion(criterion_);
  } else {
    TORCH_CHECK_VALUE(
        !criterion_.valid(),
        kind_.name,
        " takes no criterion, got ",
        criterion_.repr());
  }
}

void FoldReducer::checkCriterion(const Criterion& criterion) const {
  TORCH_CHECK_VALUE(
      criterion.valid(),
      kind_.name,
      " needs a criterion: a built-in one (eq, ne, gt, ge, lt, le with a "
      "threshold, or nonzero) or, from Python, a callable");
}

void FoldReducer::checkInputs(const std::vector<at::Tensor>& inputs) const {
  TORCH_CHECK_VALUE(
      ownFold() ? !inputs.empty() : inputs.size() == arity(),
      name(),
      ".forward takes ",
      ownFold() ? "at least one tensor" : inputsWord(arity()),
      ", got ",
      inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& x = inputs[i];
    TORCH_CHECK_VALUE(
        x.defined(), name(), ".forward: input ", i, " is undefined (None)");
    TORCH_CHECK_VALUE(
        x.device() == device(),
        name(),
        ".forward: input ",
        i,
        " is on ",
        x.device(),
        " but the reducer's history is on ",
        device(),
        "; move the reducer first (reducer.to('",
        x.device(),
        "')) or the input to ",
        device());
    if (history_.allocated() && !ownFold()) { // a custom fold may reshape
      TORCH_CHECK_VALUE(
          x.sizes() == history_.stateShape(),
          name(),
          ".forward: input ",
          i,
          " has the wrong shape: expected ",
          history_.stateShape(),
          " (the shape of the recorded states), got ",
          x.sizes(),
          ". Call clear() to start a history of another shape.");
    }
  }
}

void FoldReducer::forward(const std::vector<at::Tensor>& inputs) {
  detail::BlockingLock guard(mutex_);
  checkInputs(inputs);
  StepGuard step(steps_);
  at::Tensor state;
  {
    std::optional<at::Tensor> previous;
    if (hasState_ && (ownFold() || kind_.fold != FoldRule::Passthrough)) {
      previous = history_.row(1);
    }
    state = fold(inputs, previous);
    // `previous` (a view of the history) dies here, before the push: a live
    // view would force the push to copy the whole history.
  }
  state = asState(state);
  // A wrong state comes from the user's fold when there is one, else from a
  // criterion (the kinds' own folds keep the shape and device).
  const std::string culprit = ownFold()
      ? "does " + custom_->description + ".fold return"
      : std::string("does the criterion return");
  if (history_.allocated()) {
    TORCH_CHECK_VALUE(
        state.sizes() == history_.stateShape(),
        name(),
        ".forward: the new state has shape ",
        state.sizes(),
        " but the recorded states have shape ",
        history_.stateShape(),
        " (",
        culprit,
        ownFold() ? " a state of that shape? clear() starts a history of another "
                  "shape)"
                : " a mask shaped like its input?)");
  }
  TORCH_CHECK_VALUE(
      state.device() == device(),
      name(),
      ".forward: the new state is on ",
      state.device(),
      " but the history is on ",
      device(),
      " (",
      culprit,
      ownFold() ? " its state on the inputs' device?)"
              : " its mask on the input's device?)");
  history_.push(state, inplace_);
  hasState_ = true;
  step.commit();
}

bool FoldReducer::forwardInto(
    const at::Tensor& like,
    const std::function<void(at::Tensor& row)>& write) {
  detail::BlockingLock guard(mutex_);
  // Anything forward() would cast, reject or fold goes through forward().
  if (ownFold() || kind_.fold != FoldRule::Passthrough || !like.defined() ||
      like.scalar_type() != dtype() || like.device() != device() ||
      (history_.allocated() && like.sizes() != history_.stateShape())) {
    return false;
  }
  // The row is ours alone (nextRowToWrite): autograd has nothing to record.
  const at::AutoDispatchBelowADInplaceOrView belowAutograd;
  at::Tensor row = history_.nextRowToWrite(like.sizes());
  if (!row.defined()) {
    return false;
  }
  write(row);
  history_.advance();
  ++steps_;
  hasState_ = true;
  return true;
}

std::optional<at::Tensor> FoldReducer::peek() const {
  detail::BlockingLock guard(mutex_);
  if (!hasState_) {
    return std::nullopt;
  }
  return history_.row(1);
}

std::optional<at::Tensor> FoldReducer::dump() const {
  detail::BlockingLock guard(mutex_);
  if (!hasState_) {
    return std::nullopt;
  }
  return history_.newestFirst();
}

void FoldReducer::checkTolerance(double tolerance) const {
  // An infinite tolerance lets any time through the range check, and the
  // time then picks a row index no int64 holds.
  TORCH_CHECK_VALUE(
      std::isfinite(tolerance) && tolerance >= 0,
      name(),
      ".view: tolerance must be a finite number >= 0 (how far a time may be "
      "from a recorded step to read that step), got ",
      tolerance);
}

std::optional<at::Tensor> FoldReducer::view(double time, double tolerance)
    const {
  detail::BlockingLock guard(mutex_);
  checkTolerance(tolerance);
  if (!hasState_) {
    return std::nullopt;
  }
  const double dt = stepTime_;
  const double oldest = dt * static_cast<double>(history_.size() - 1);
  // Written so that NaN fails too.
  TORCH_CHECK_VALUE(
      time >= -tolerance && time <= oldest + tolerance,
      name(),
      ".view: time ",
      time,
      " is outside the recorded range [",
      -tolerance,
      ", ",
      oldest + tolerance,
      "] (0 is the newest state, ",
      oldest,
      " the oldest, each widened by the tolerance ",
      tolerance,
      ")");
  const double shift = time / dt;
  // Round half to even, as Python's round(). A time the tolerance lets in
  // beyond either end reads that end.
  const double nearest = std::clamp(
      std::nearbyint(shift), 0.0, static_cast<double>(history_.size() - 1));
  if (std::abs(dt * nearest - time) <= tolerance) {
    return history_.row(1 + static_cast<int64_t>(nearest));
  }
  const double offset = 1.0 + shift;
  const at::Tensor prev = history_.row(static_cast<int64_t>(std::ceil(offset)));
  const at::Tensor next = history_.row(static_cast<int64_t>(std::floor(offset)));
  double frac = std::fmod(shift, 1.0);
  if (frac < 0) {
    frac += 1.0;
  }
  const at::Tensor sampleAt =
      at::scalar_tensor(dt - dt * frac, history_.options());
  return asState(interpolate(prev, next, sampleAt, dt));
}

std::optional<at::Tensor> FoldReducer::view(
    const at::Tensor& time,
    double tolerance) const {
  detail::BlockingLock guard(mutex_);
  TORCH_CHECK_VALUE(time.defined(), name(), ".view: time is undefined");
  checkTolerance(tolerance);
  if (!hasState_) {
    return std::nullopt;
  }
  return viewTensor(time, tolerance);
}

std::optional<at::Tensor> FoldReducer::viewTensor(
    const at::Tensor& time,
    double tolerance) const {
  const at::IntArrayRef stateShape = history_.stateShape();
  const int64_t stateDim = static_cast<int64_t>(stateShape.size());
  at::Tensor t = time;
  if (!at::isFloatingType(t.scalar_type())) {
    t = t.to(at::typeMetaToScalarType(c10::get_default_dtype()));
  }
  t = t.to(device());

  // Times as [*state shape, D]: one 0-dim time for all elements, a time per
  // element, or D times per element along the last dimension (broadcast
  // over the elements).
  bool squeeze = true;
  if (t.dim() == 0) {
    t = t.expand(stateShape).unsqueeze(-1);
  } else if (t.dim() == stateDim) {
    t = t.unsqueeze(-1);
  } else if (t.dim() == stateDim + 1) {
    squeeze = false;
  } else {
    TORCH_CHECK_VALUE(
        false,
        name(),
        ".view: time has ",
        t.dim(),
        " dimensions; give a single time, a tensor with the state's ",
        stateDim,
        " dimensions (one time per element) or ",
        stateDim + 1,
        " (several times per element along the last dimension)");
  }
  const at::IntArrayRef leading = t.sizes().slice(0, stateDim);
  TORCH_CHECK_VALUE(
      at::is_expandable_to(leading, stateShape),
      name(),
      ".view: times of shape ",
      time.sizes(),
      " do not fit states of shape ",
      stateShape,
      ": expected ",
      stateShape,
      " (or a shape broadcastable to it), optionally followed by a dimension "
      "of several times");
  std::vector<int64_t> full(stateShape.begin(), stateShape.end());
  full.push_back(t.size(-1));
  t = t.expand(full);

  const double dt = stepTime_;
  const double oldest = dt * static_cast<double>(history_.size() - 1);
  if (t.numel() > 0) {
    // The range check reads two values back to the host; view() is not on
    // the forward path.
    const auto [lo, hi] = at::aminmax(t);
    const double tmin = lo.item<double>();
    const double tmax = hi.item<double>();
    TORCH_CHECK_VALUE(
        tmin >= -tolerance && tmax <= oldest + tolerance,
        name(),
        ".view: times (min ",
        tmin,
        ", max ",
        tmax,
        ") must lie in the recorded range [",
        -tolerance,
        ", ",
        oldest + tolerance,
        "] (0 is the newest state, ",
        oldest,
        " the oldest, each widened by the tolerance)");
  }

  // The same arithmetic as the scalar view, element-wise: times within the
  // tolerance of a step read that step exactly.
  at::Tensor shift = t / dt;
  const at::Tensor rounded =
      shift.round().clamp(0, static_cast<double>(history_.size() - 1));
  shift = at::where((rounded * dt - t).abs() <= tolerance, rounded, shift);
  shift = shift.movedim(-1, 0); // [D, *state shape], like the storage
  const at::Tensor offset = shift + 1;
  const at::Tensor prevBack = offset.ceil();
  const at::Tensor nextBack = offset.floor();
  const int64_t n = history_.size();
  const int64_t next = history_.next();
  auto rowsAt = [&](const at::Tensor& back) {
    return at::remainder(at::rsub(back.to(at::kLong), next), n);
  };
  const at::Tensor& storage = history_.storage();
  const at::Tensor prev = storage.gather(0, rowsAt(prevBack));
  const at::Tensor nextRows = storage.gather(0, rowsAt(nextBack));
  const at::Tensor sampleAt = at::rsub(at::remainder(shift, 1) * dt, dt);
  at::Tensor result = interpolate(prev, nextRows, sampleAt, dt);
  result = at::where(prevBack == nextBack, prev, result).movedim(0, -1);
  if (squeeze) {
    result = result.squeeze(-1);
  }
  return asState(result);
}

void FoldReducer::clear(bool keepshape) {
  detail::BlockingLock guard(mutex_);
  if (keepshape) {
    history_.refill();
  } else {
    history_.release();
  }
  hasState_ = false;
  steps_ = 0;
}

std::map<std::string, double> FoldReducer::params() const {
  detail::BlockingLock guard(mutex_);
  return params_;
}

void FoldReducer::setParam(const std::string& name, double value) {
  detail::BlockingLock guard(mutex_);
  kind_.checkParam(name, value);
  const ParamSpec& spec = *kind_.param(name);
  if (spec.fixed) {
    const double current = params_.at(name);
    TORCH_CHECK_VALUE(
        value == current || (std::isnan(value) && std::isnan(current)),
        kind_.name,
        ": ",
        name,
        " is fixed at construction (it is ",
        current,
        "); build a new reducer to use ",
        value);
  } else if (spec.unsettable && std::isnan(value)) {
    params_.erase(name);
  } else {
    params_[name] = value;
  }
}

std::optional<Criterion> FoldReducer::criterion() const {
  detail::BlockingLock guard(mutex_);
  if (!kind_.takesCriterion()) {
    return std::nullopt;
  }
  return criterion_;
}

void FoldReducer::setCriterion(Criterion criterion) {
  detail::BlockingLock guard(mutex_);
  TORCH_CHECK_VALUE(kind_.takesCriterion(), kind_.name, " takes no criterion");
  checkCriterion(criterion);
  criterion_ = std::move(criterion);
}

void FoldReducer::setStepTime(double stepTime) {
  detail::BlockingLock guard(mutex_);
  const int64_t size =
      torch_monitor::historySize(stepTime, duration_, inclusive_);
  if (stepTime == stepTime_) {
    return;
  }
  stepTime_ = stepTime;
  history_.resize(size);
}

void FoldReducer::setDuration(double duration) {
  detail::BlockingLock guard(mutex_);
  const int64_t size =
      torch_monitor::historySize(stepTime_, duration, inclusive_);
  duration_ = duration;
  history_.resize(size);
}

void FoldReducer::setInclusive(bool inclusive) {
  detail::BlockingLock guard(mutex_);
  const int64_t size =
      torch_monitor::historySize(stepTime_, duration_, inclusive);
  inclusive_ = inclusive;
  history_.resize(size);
}

void FoldReducer::to(
    std::optional<at::Device> device,
    std::optional<at::ScalarType> dtype) {
  detail::BlockingLock guard(mutex_);
  history_.setStorage(history_.storage().to(
      device.value_or(this->device()), dtype.value_or(this->dtype())));
}

void FoldReducer::setStorage(const at::Tensor& storage) {
  detail::BlockingLock guard(mutex_);
  history_.setStorage(storage);
}

void FoldReducer::setCustomFold(std::shared_ptr<const CustomFold> custom) {
  TORCH_CHECK_VALUE(
      custom == nullptr || custom->fold || custom->interpolate,
      kind(),
      ": a custom fold needs a fold or an interpolate function");
  detail::BlockingLock guard(mutex_);
  custom_ = std::move(custom);
}

std::shared_ptr<const FoldReducer::CustomFold> FoldReducer::customFold() const {
  detail::BlockingLock guard(mutex_);
  return custom_;
}

FoldReducer::Snapshot FoldReducer::snapshot() const {
  detail::BlockingLock guard(mutex_);
  return Snapshot{
      history_.storage(),
      history_.allocated(),
      history_.next(),
      hasState_,
      steps_};
}

void FoldReducer::restore(const Snapshot& snapshot) {
  detail::BlockingLock guard(mutex_);
  TORCH_CHECK_VALUE(
      !snapshot.hasState || snapshot.allocated,
      "a saved ",
      kind(),
      " claims a state but holds no history");
  TORCH_CHECK_VALUE(
      snapshot.steps >= 0,
      "a saved ",
      kind(),
      " has a negative step count ",
      snapshot.steps);
  history_.restore(snapshot.storage, snapshot.allocated, snapshot.next);
  hasState_ = snapshot.hasState;
  steps_ = snapshot.steps;
}

double FoldReducer::stepTime() const {
  detail::BlockingLock guard(mutex_);
  return stepTime_;
}

double FoldReducer::duration() const {
  detail::BlockingLock guard(mutex_);
  return duration_;
}

bool FoldReducer::inclusive() const {
  detail::BlockingLock guard(mutex_);
  return inclusive_;
}

bool FoldReducer::inplace() const {
  detail::BlockingLock guard(mutex_);
  return inplace_;
}

void FoldReducer::setInplace(bool inplace) {
  detail::BlockingLock guard(mutex_);
  inplace_ = inplace;
}

int64_t FoldReducer::historySize() const {
  detail::BlockingLock guard(mutex_);
  return history_.size();
}

bool FoldReducer::hasState() const {
  detail::BlockingLock guard(mutex_);
  return hasState_;
}

int64_t FoldReducer::steps() const {
  detail::BlockingLock guard(mutex_);
  return steps_;
}

double FoldReducer::fill() const {
  return history_.fill(); // fixed at construction
}

at::Tensor FoldReducer::storage() const {
  detail::BlockingLock guard(mutex_);
  return history_.storage();
}

at::ScalarType FoldReducer::dtype() const {
  detail::BlockingLock guard(mutex_);
  return history_.storage().scalar_type();
}

at::Device FoldReducer::device() const {
  detail::BlockingLock guard(mutex_);
  return history_.storage().device();
}

bool FoldReducer::ownFold() const noexcept {
  return custom_ != nullptr && static_cast<bool>(custom_->fold);
}

std::string FoldReducer::name() const {
  return custom_ ? custom_->description : kind_.name;
}

at::Tensor FoldReducer::asState(const at::Tensor& x) const {
  return x.scalar_type() == dtype() ? x : x.to(dtype());
}

// The folds and interpolations that reducerKindTable() names, as FoldReducer
// applies them. A new kind of fold is a FoldRule and its case here.

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
  if (ownFold()) {
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
