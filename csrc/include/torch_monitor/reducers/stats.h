#pragma once

#include <torch_monitor/reducers/fold_reducer.h>

namespace torch_monitor {

// Exponential moving average: s = x at the first step, then
// alpha * x + (1 - alpha) * s. Linear interpolation; fill 0.
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API EMAReducer : public FoldReducer {
 public:
  // Throws c10::ValueError unless 0 <= alpha <= 1.
  EMAReducer(
      double stepTime,
      double alpha,
      double duration = 0.0,
      bool inclusive = false,
      bool inplace = false);

  const char* kind() const noexcept override {
    return "EMAReducer";
  }
  double alpha() const {
    detail::BlockingLock guard(mutex());
    return alpha_;
  }
  void setAlpha(double alpha);

 protected:
  std::map<std::string, double> paramsLocked() const override;
  void setParamLocked(const std::string& name, double value) override;
  at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) override;
  at::Tensor interpolate(
      const at::Tensor& prev,
      const at::Tensor& next,
      const at::Tensor& sampleAt,
      double stepTime) const override;

 private:
  double alpha_;
};

// Cumulative average of every observation since the last clear():
// s = s + (x - s) / n at the n-th step. Linear interpolation; fill 0.
// Thread safety: as FoldReducer (every method takes its lock).
class TORCH_MONITOR_API CAReducer : public FoldReducer {
 public:
  explicit CAReducer(
      double stepTime,
      double duration = 0.0,
      bool inclusive = false,
      bool inplace = false);

  const char* kind() const noexcept override {
    return "CAReducer";
  }

 protected:
  at::Tensor fold(
      const std::vector<at::Tensor>& inputs,
      const std::optional<at::Tensor>& state) override;
  at::Tensor interpolate(
      const at::Tensor& prev,
      const at::Tensor& next,
      const at::Tensor& sampleAt,
      double stepTime) const override;
};

} // namespace torch_monitor
