#pragma once

#include <string>

#include <torch_monitor/reducers/fold_reducer.h>

namespace torch_monitor {

// Records the observations themselves: s = x. Interpolation takes the older
// neighbour; fill 0.
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API PassthroughReducer : public FoldReducer {
 public:
  explicit PassthroughReducer(
      double stepTime,
      double duration = 0.0,
      bool inclusive = false,
      bool inplace = false);

  const char* kind() const noexcept override {
    return "PassthroughReducer";
  }

 protected:
  bool foldReadsState() const noexcept override {
    return false;
  }
  at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) override;
  at::Tensor interpolate(
      const at::Tensor& prev,
      const at::Tensor& next,
      const at::Tensor& sampleAt,
      double stepTime) const override;
};

// Records, per element, the time since the criterion last matched: 0 on a
// match, else the previous value + stepTime; before the first match the
// initial value ("inf", "zero" or "nan"), which is also the fill.
// Interpolation adds the time elapsed since the older neighbour.
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API EventReducer : public FoldReducer {
 public:
  // `initial` is "inf", "zero" or "nan" (any case); anything else, or an
  // empty criterion, throws c10::ValueError.
  EventReducer(
      double stepTime,
      Criterion criterion,
      const std::string& initial = "inf",
      double duration = 0.0,
      bool inclusive = false,
      bool inplace = false);

  const char* kind() const noexcept override {
    return "EventReducer";
  }
  // inf, 0 or nan; fixed at construction (params()["initial"]).
  double initial() const noexcept {
    return fill();
  }
  // The value of `initial` named by "inf"/"zero"/"nan"; throws otherwise.
  static double initialValue(const std::string& initial);

 protected:
  const Criterion* criterionLocked() const noexcept override {
    return &criterion_;
  }
  // {"initial": inf | 0 | nan}.
  std::map<std::string, double> paramsLocked() const override;
  void setParamLocked(const std::string& name, double value) override;
  void setCriterionLocked(Criterion criterion) override;
  at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) override;
  at::Tensor interpolate(
      const at::Tensor& prev,
      const at::Tensor& next,
      const at::Tensor& sampleAt,
      double stepTime) const override;

 private:
  Criterion criterion_;
};

} // namespace torch_monitor
