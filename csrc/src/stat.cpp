#include <torch_monitor/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <optional>
#include <type_traits>

#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>
#include <c10/util/Exception.h>

#include <torch_monitor/detail/text.h>
#include <torch_monitor/engine/window_timer.h>
#include <torch_monitor/event_handler.h>

namespace torch_monitor {

template <typename T>
Stat<T>::Stat(
    std::string name,
    std::vector<Aggregation> aggregations,
    std::chrono::milliseconds windowSize,
    int64_t maxSamples,
    WindowClose windowClose)
    : Stat(
          std::move(name),
          std::move(aggregations),
          coarseClockIsPreciseEnough(windowSize.count()) ? ClockSource::COARSE
                                                          : ClockSource::PRECISE,
          windowSize.count(),
          maxSamples,
          windowClose) {}

template <typename T>
Stat<T>::Stat(
    std::string name,
    std::vector<Aggregation> aggregations,
    WindowSteps windowSteps,
    int64_t maxSamples)
    : Stat(
          std::move(name),
          std::move(aggregations),
          ClockSource::STEP,
          windowSteps.steps,
          maxSamples,
          WindowClose::LAZY) {}

template <typename T>
Stat<T>::Stat(
    std::string name,
    std::vector<Aggregation> aggregations,
    ClockSource clock,
    int64_t length,
    int64_t maxSamples,
    WindowClose windowClose)
    : detail::StatEngine<T>(
          std::move(name),
          aggregations,
          clock,
          length,
          maxSamples == kUnlimitedSamples ? std::nullopt
                                          : std::optional<int64_t>(maxSamples),
          windowClose == WindowClose::ON_TIME) {
  detail::checkText(this->name(), "Stat name");
  // torch.monitor accepts none and logs empty events at every window close.
  TORCH_CHECK_VALUE(
      !aggregations.empty(),
      "Stat '",
      this->name(),
      "': give at least one aggregation (e.g. [Aggregation.MEAN]); with none "
      "every window would log an empty event");
  if (clock == ClockSource::STEP) {
    TORCH_CHECK_VALUE(
        length >= 1,
        "Stat '",
        this->name(),
        "': window_steps must be at least 1 (a window of that many training "
        "steps), got ",
        length);
  } else {
    // torch.monitor divides by the window (SIGFPE at the first add) when it
    // is under 1 ms.
    TORCH_CHECK_VALUE(
        length >= 1,
        "Stat '",
        this->name(),
        "': window_size must be at least 1 millisecond (it is kept with "
        "millisecond precision), got ",
        length,
        " ms");
    TORCH_CHECK_VALUE(
        length <= kMaxWindowMs,
        "Stat '",
        this->name(),
        "': window_size must be at most ",
        kMaxWindowMs,
        " ms (datetime.timedelta.max, about 2.7 million years), got ",
        length,
        " ms");
  }
  // torch.monitor silently treats maxSamples < 1 as 1.
  TORCH_CHECK_VALUE(
      maxSamples >= 1,
      "Stat '",
      this->name(),
      "': max_samples must be at least 1, got ",
      maxSamples);
  detail::ensureAsymmetricBarrier();
  // Last, once the Stat is whole: the registry may call in from now on.
  this->track();
  if (windowClose == WindowClose::ON_TIME) {
    detail::joinWindowTimer(this); // after track(): see window_timer.cpp
  }
}

template <typename T>
Stat<T>::~Stat() {
  this->untrack(); // first: closeAllStats() and fork() no longer see this Stat
  if (windowClose() == WindowClose::ON_TIME) {
    detail::leaveWindowTimer(this); // nor the window timer
  }
  try {
    if (auto event = this->closeOpenWindow()) {
      detail::dispatchEvent(*event);
    }
    if (syncsRanks()) {
      this->leaveRankSync(); // after posting the last window
    }
  } catch (const std::exception& e) {
    TORCH_WARN(
        "torch_monitor: an event handler failed while Stat '",
        name(),
        "' logged its last window on destruction: ",
        detail::errorMessage(e));
  } catch (...) {
    TORCH_WARN(
        "torch_monitor: an event handler failed while Stat '",
        name(),
        "' logged its last window on destruction");
  }
}

namespace {
std::atomic<bool> gCpuTensorsTakeDevicePath{false};
} // namespace

namespace test_hooks {
void setCpuTensorsTakeDevicePath(bool on) noexcept {
  gCpuTensorsTakeDevicePath.store(on, std::memory_order_relaxed);
}
bool cpuTensorsTakeDevicePath() noexcept {
  return gCpuTensorsTakeDevicePath.load(std::memory_order_relaxed);
}
} // namespace test_hooks

template <typename T>
void Stat<T>::add(const at::Tensor& values) {
  constexpr bool kInt = std::is_same_v<T, int64_t>;
  TORCH_CHECK_VALUE(
      values.defined(), "Stat '", name(), "': cannot add an undefined tensor");
  // A meta tensor has a shape but no values: accepted, its samples would
  // only fail later, when the window closes on some other thread.
  TORCH_CHECK_VALUE(
      !values.is_meta(),
      "Stat '",
      name(),
      "': cannot add a tensor on the meta device, which holds no values; add "
      "the tensor computed on a real device");
  TORCH_CHECK_TYPE(
      values.layout() == at::kStrided,
      "Stat '",
      name(),
      "' takes dense tensors, got a ",
      values.layout(),
      " tensor; add values.to_dense() (or a sparse tensor's values())");
  TORCH_CHECK_TYPE(
      !kInt || !at::isFloatingType(values.scalar_type()),
      "IntStat '",
      name(),
      "' takes integer tensors, got a ",
      values.scalar_type(),
      " tensor; use a Stat for floating-point values");
  TORCH_CHECK_TYPE(
      !at::isComplexType(values.scalar_type()),
      "Stat '",
      name(),
      "' takes real tensors, got a ",
      values.scalar_type(),
      " tensor; add its real part or its absolute value");
  if (values.numel() == 0) {
    return;
  }
  const bool onDevice =
      !values.device().is_cpu() || test_hooks::cpuTensorsTakeDevicePath();
  // An int64 sample cannot hold a uint64 past 2**63 - 1: refused rather than
  // wrapped, as an int add() is. Only the host can see the values.
  const bool wide = kInt && values.scalar_type() == at::kUInt64;
  TORCH_CHECK_TYPE(
      !(wide && onDevice),
      "IntStat '",
      name(),
      "' takes uint64 tensors on the CPU only (whether each element fits in "
      "an int64 would need the device's values now); add values.to(torch.int64) "
      "when they fit");
  if (onDevice && !this->capped_) {
    // Autograd never sees it: TensorWindow runs below it.
    this->addOnDevice(values);
    return;
  }
  // Read in place, in the tensor's own dtype: a CPU loss costs a dtype
  // switch and a load, about what float(t) costs.
  const at::Tensor host =
      (values.device().is_cpu() ? values : values.cpu()).contiguous();
  if (wide) {
    const uint64_t* elements = host.const_data_ptr<uint64_t>();
    for (int64_t i = 0, n = host.numel(); i < n; ++i) {
      TORCH_CHECK_VALUE(
          elements[i] <= uint64_t(std::numeric_limits<int64_t>::max()),
          "IntStat '",
          name(),
          "': element ",
          i,
          " of the uint64 tensor, ",
          elements[i],
          ", does not fit in an int64 sample (nothing of the tensor was "
          "added); use a Stat for such values");
    }
  }
  // Every dtype a tensor holds real values in, as the device path takes.
  AT_DISPATCH_V2(
      host.scalar_type(),
      "Stat.add",
      AT_WRAP([&] {
        const scalar_t* elements = host.const_data_ptr<scalar_t>();
        for (int64_t i = 0, n = host.numel(); i < n; ++i) {
          add(static_cast<T>(elements[i]));
        }
      }),
      AT_EXPAND(AT_ALL_TYPES),
      at::kBool,
      at::kHalf,
      at::kBFloat16,
      AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES),
      AT_EXPAND(AT_FLOAT8_TYPES));
}

template <typename T>
int64_t Stat<T>::count() const {
  return this->openCount();
}

template <typename T>
std::unordered_map<Aggregation, T, AggregationHash> Stat<T>::get() const {
  const auto aggregates = this->lastAggregates();
  return {aggregates.begin(), aggregates.end()};
}

template <typename T>
void Stat<T>::syncRanks(std::shared_ptr<const RankGroup> group) {
  this->joinRankSync(std::move(group));
}

std::chrono::milliseconds windowFromSeconds(double seconds) {
  TORCH_CHECK_VALUE(
      std::isfinite(seconds) && seconds >= 0,
      "window_size must be a finite, non-negative number of seconds, got ",
      seconds);
  // Checked before the conversion, which is undefined for values beyond
  // int64. Doubles this large are 16 ms apart: the nearest one to the
  // longest window is above it, so what passes is clamped to it (that is
  // how datetime.timedelta.max, converted to seconds, reads back exactly).
  TORCH_CHECK_VALUE(
      seconds * 1000.0 <= double(Stat<double>::kMaxWindowMs),
      "window_size must be at most ",
      Stat<double>::kMaxWindowMs / 1000,
      " s (datetime.timedelta.max, about 2.7 million years), got ",
      seconds,
      " s");
  // A float of seconds misses whole milliseconds by a unit in the last
  // place (timedelta(milliseconds=1001).total_seconds() * 1000 is
  // 1000.9999999999999): within that, or within a tenth of a microsecond
  // (a timedelta's resolution is one), the nearest millisecond is meant;
  // anything else is truncated, as torch.monitor's conversion of a
  // timedelta is (1.5 ms is 1 ms).
  const double ms = seconds * 1000.0;
  const double nearest = std::round(ms);
  const double slack =
      std::max(1e-4, ms * 2 * std::numeric_limits<double>::epsilon());
  const double whole = std::abs(ms - nearest) <= slack ? nearest : std::floor(ms);
  return std::chrono::milliseconds(
      std::min(static_cast<int64_t>(whole), Stat<double>::kMaxWindowMs));
}

double secondsOfWindow(std::chrono::milliseconds window) {
  double seconds = static_cast<double>(window.count()) / 1000.0;
  // Beyond 2**52 ms the nearest float may read back a millisecond off: the
  // next floats either way are tried (a window no float reads back as is
  // gets the nearest that does, which then reads back as itself).
  for (int step = 0; step < 8; ++step) {
    const auto read = windowFromSeconds(seconds);
    if (read == window) {
      break;
    }
    seconds = std::nextafter(
        seconds, read < window ? std::numeric_limits<double>::infinity() : 0.0);
  }
  return seconds;
}

void closeAllStats() noexcept {
  detail::closeAllLiveStats();
}

std::vector<std::string> liveStatNames() {
  return detail::liveStatNames();
}

// Memory per stat is a target of the project (at most 1.4x torch.monitor's
// from Python, where the TorchScript holder and the Python object come on
// top: 200 bytes here make the holder's heap block 224): a new field must
// fit in this budget or be created lazily.
static_assert(sizeof(Stat<double>) <= 200 && sizeof(Stat<int64_t>) <= 200);

template class Stat<double>;

template class Stat<int64_t>;

} // namespace torch_monitor
