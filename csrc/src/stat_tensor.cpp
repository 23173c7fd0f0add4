// Stat::add for tensors: the host loop for CPU tensors and the hand-over of
// other devices' tensors to the window's TensorWindow.
#include <torch_monitor/stat.h>

#include <atomic>
#include <mutex>
#include <type_traits>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <torch_monitor/detail/tensor_window.h>

namespace torch_monitor {
namespace {
std::atomic<bool> cpuTensorsOnDevicePath{false};
} // namespace

namespace test_hooks {
void setCpuTensorsTakeDevicePath(bool on) noexcept {
  cpuTensorsOnDevicePath.store(on, std::memory_order_relaxed);
}
bool cpuTensorsTakeDevicePath() noexcept {
  return cpuTensorsOnDevicePath.load(std::memory_order_relaxed);
}
} // namespace test_hooks

template <typename T>
void Stat<T>::add(const at::Tensor& values) {
  constexpr bool kInt = std::is_same_v<T, int64_t>;
  TORCH_CHECK_VALUE(
      values.defined(), "Stat '", name_, "': cannot add an undefined tensor");
  TORCH_CHECK_TYPE(
      !kInt || !at::isFloatingType(values.scalar_type()),
      "IntStat '",
      name_,
      "' takes integer tensors, got a ",
      values.scalar_type(),
      " tensor; use a Stat for floating-point values");
  TORCH_CHECK_TYPE(
      !at::isComplexType(values.scalar_type()),
      "Stat '",
      name_,
      "' takes real tensors, got a ",
      values.scalar_type(),
      " tensor; add its real part or its absolute value");
  if (values.numel() == 0) {
    return;
  }
  const bool onDevice = !values.device().is_cpu() ||
      cpuTensorsOnDevicePath.load(std::memory_order_relaxed);
  if (onDevice && !capped_) {
    addOnDevice(values.detach());
    return;
  }
  // Read in place, in the tensor's own dtype: a CPU loss costs a dtype
  // switch and a load, about what float(t) costs.
  const at::Tensor host =
      (values.device().is_cpu() ? values : values.cpu()).contiguous();
  AT_DISPATCH_ALL_TYPES_AND3(
      at::kBool, at::kHalf, at::kBFloat16, host.scalar_type(), "Stat.add", [&] {
        const scalar_t* elements = host.const_data_ptr<scalar_t>();
        for (int64_t i = 0, n = host.numel(); i < n; ++i) {
          add(static_cast<T>(elements[i]));
        }
      });
}

template <typename T>
void Stat<T>::addOnDevice(const at::Tensor& values) {
  const int64_t now = readClock(clock_);
  ClosedWindow closed;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    closed = closeIfEndedLocked(now);
    ShardTable& table = tableLocked();
    if (table.tensors == nullptr) {
      table.tensors = new detail::TensorWindow<T>();
    }
    const auto [shard, shardCount] = ownShardLocked();
    table.tensors->add(values, now, shard, shardCount);
  }
  emit(closed);
}

// stat.h declares the instantiations extern, so members defined here are
// instantiated here explicitly.
template void Stat<double>::add(const at::Tensor&);
template void Stat<int64_t>::add(const at::Tensor&);
template void Stat<double>::addOnDevice(const at::Tensor&);
template void Stat<int64_t>::addOnDevice(const at::Tensor&);

} // namespace torch_monitor
