#pragma once

#include <optional>

#include <torch_monitor/reducers/fold_reducer.h>

namespace torch_monitor {

// What the six trace reducers share: a trace that decays by
// decay = exp(-stepTime / timeConstant) per step between matches, read
// between steps as prev * exp(-sampleAt / timeConstant); fill 0. The decay
// factor follows changes of the step time and of the time constant.
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API TraceReducer : public FoldReducer {
 public:
  double timeConstant() const {
    detail::BlockingLock guard(mutex());
    return timeConstant_;
  }
  // Throws c10::ValueError unless timeConstant > 0.
  void setTimeConstant(double timeConstant);
  double decay() const {
    detail::BlockingLock guard(mutex());
    return decay_;
  }
  double amplitude() const {
    detail::BlockingLock guard(mutex());
    return amplitude_;
  }
  void setAmplitude(double amplitude);

 protected:
  // {"time_constant", "amplitude"} plus the subclass's own.
  std::map<std::string, double> paramsLocked() const override;
  void setParamLocked(const std::string& name, double value) override;
  // `kindName` names the subclass in constructor errors (kind() is not
  // callable while a base is being constructed).
  TraceReducer(
      const char* kindName,
      double stepTime,
      double timeConstant,
      double amplitude,
      bool amplitudeMayBeZero,
      double duration,
      bool inclusive,
      bool inplace);

  at::Tensor interpolate(
      const at::Tensor& prev,
      const at::Tensor& next,
      const at::Tensor& sampleAt,
      double stepTime) const override;
  void onStepTimeChanged() override;

 private:
  static void checkTimeConstant(const char* kindName, double timeConstant);
  static void checkAmplitude(
      const char* kindName,
      double amplitude,
      bool mayBeZero);
  void updateDecay();

  double timeConstant_;
  double decay_ = 0.0;
  double amplitude_;
  bool amplitudeMayBeZero_;
};

// Traces whose matches are observations equal to `target` (or within
// `tolerance` of it): NearestTraceReducer and CumulativeTraceReducer.
// Observations are cast to the reducer's dtype before the comparison.
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API TargetTraceReducer : public TraceReducer {
 public:
  double target() const {
    detail::BlockingLock guard(mutex());
    return target_;
  }
  void setTarget(double target) {
    detail::BlockingLock guard(mutex());
    target_ = target;
  }
  std::optional<double> tolerance() const {
    detail::BlockingLock guard(mutex());
    return tolerance_;
  }
  // nullopt: exact equality; else throws c10::ValueError unless > 0.
  void setTolerance(std::optional<double> tolerance);

 protected:
  // Adds "target" and, when set, "tolerance" (setParam("tolerance", NaN)
  // unsets it).
  std::map<std::string, double> paramsLocked() const override;
  void setParamLocked(const std::string& name, double value) override;
  TargetTraceReducer(
      const char* kindName,
      double stepTime,
      double timeConstant,
      double amplitude,
      double target,
      std::optional<double> tolerance,
      double duration,
      bool inclusive,
      bool inplace);

  // abs(x - target) <= tolerance, or x == target without a tolerance.
  at::Tensor matches(const at::Tensor& x) const;

 private:
  static void checkTolerance(
      const char* kindName,
      const std::optional<double>& tolerance);

  double target_;
  std::optional<double> tolerance_;
};

// s = amplitude where x matches the target, else decay * s.
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API NearestTraceReducer : public TargetTraceReducer {
 public:
  // Throws c10::ValueError for timeConstant <= 0, amplitude == 0 or a
  // tolerance <= 0.
  NearestTraceReducer(
      double stepTime,
      double timeConstant,
      double amplitude,
      double target,
      std::optional<double> tolerance = std::nullopt,
      double duration = 0.0,
      bool inclusive = false,
      bool inplace = false);
  const char* kind() const noexcept override {
    return "NearestTraceReducer";
  }

 protected:
  at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) override;
};

// s = decay * s + amplitude * [x matches the target].
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API CumulativeTraceReducer : public TargetTraceReducer {
 public:
  // Throws like NearestTraceReducer.
  CumulativeTraceReducer(
      double stepTime,
      double timeConstant,
      double amplitude,
      double target,
      std::optional<double> tolerance = std::nullopt,
      double duration = 0.0,
      bool inclusive = false,
      bool inplace = false);
  const char* kind() const noexcept override {
    return "CumulativeTraceReducer";
  }

 protected:
  at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) override;
};

// Traces that add scale * x + amplitude on a match, the match being a
// criterion of x (Scaled*) or a second input (Conditional*).
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API ScaledTraceReducer : public TraceReducer {
 public:
  double scale() const {
    detail::BlockingLock guard(mutex());
    return scale_;
  }
  void setScale(double scale) {
    detail::BlockingLock guard(mutex());
    scale_ = scale;
  }

 protected:
  // Adds "scale".
  std::map<std::string, double> paramsLocked() const override;
  void setParamLocked(const std::string& name, double value) override;
  ScaledTraceReducer(
      const char* kindName,
      double stepTime,
      double timeConstant,
      double amplitude,
      double scale,
      double duration,
      bool inclusive,
      bool inplace);

  // where(mask, scale * x + amplitude, decay * s); (scale * x + amplitude) *
  // mask at the first step.
  at::Tensor foldNearest(
      const at::Tensor& x,
      const at::Tensor& mask,
      const std::optional<at::Tensor>& state) const;
  // decay * s + (scale * x + amplitude) * mask.
  at::Tensor foldCumulative(
      const at::Tensor& x,
      const at::Tensor& mask,
      const std::optional<at::Tensor>& state) const;

 private:
  double scale_;
};

// Scaled nearest trace whose matches are criterion(x).
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API ScaledNearestTraceReducer : public ScaledTraceReducer {
 public:
  // Throws c10::ValueError for timeConstant <= 0 or an empty criterion.
  ScaledNearestTraceReducer(
      double stepTime,
      double timeConstant,
      double amplitude,
      double scale,
      Criterion criterion,
      double duration = 0.0,
      bool inclusive = false,
      bool inplace = false);
  const char* kind() const noexcept override {
    return "ScaledNearestTraceReducer";
  }

 protected:
  const Criterion* criterionLocked() const noexcept override {
    return &criterion_;
  }
  void setCriterionLocked(Criterion criterion) override;
  at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) override;

 private:
  Criterion criterion_;
};

// Scaled cumulative trace whose matches are criterion(x).
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API ScaledCumulativeTraceReducer
    : public ScaledTraceReducer {
 public:
  // Throws like ScaledNearestTraceReducer.
  ScaledCumulativeTraceReducer(
      double stepTime,
      double timeConstant,
      double amplitude,
      double scale,
      Criterion criterion,
      double duration = 0.0,
      bool inclusive = false,
      bool inplace = false);
  const char* kind() const noexcept override {
    return "ScaledCumulativeTraceReducer";
  }

 protected:
  const Criterion* criterionLocked() const noexcept override {
    return &criterion_;
  }
  void setCriterionLocked(Criterion criterion) override;
  at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) override;

 private:
  Criterion criterion_;
};

// Scaled nearest trace fed two inputs, (x, condition): the matches are the
// condition (a bool tensor, or nonzero elements of another dtype).
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API ConditionalNearestTraceReducer
    : public ScaledTraceReducer {
 public:
  // Throws c10::ValueError for timeConstant <= 0.
  ConditionalNearestTraceReducer(
      double stepTime,
      double timeConstant,
      double amplitude,
      double scale,
      double duration = 0.0,
      bool inclusive = false,
      bool inplace = false);
  const char* kind() const noexcept override {
    return "ConditionalNearestTraceReducer";
  }
  size_t arity() const noexcept override {
    return 2;
  }

 protected:
  at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) override;
};

// Scaled cumulative trace fed (x, condition); see
// ConditionalNearestTraceReducer.
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API ConditionalCumulativeTraceReducer
    : public ScaledTraceReducer {
 public:
  // Throws c10::ValueError for timeConstant <= 0.
  ConditionalCumulativeTraceReducer(
      double stepTime,
      double timeConstant,
      double amplitude,
      double scale,
      double duration = 0.0,
      bool inclusive = false,
      bool inplace = false);
  const char* kind() const noexcept override {
    return "ConditionalCumulativeTraceReducer";
  }
  size_t arity() const noexcept override {
    return 2;
  }

 protected:
  at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) override;
};

} // namespace torch_monitor
