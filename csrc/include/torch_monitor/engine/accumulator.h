#pragma once

#include <cstdint>
#include <type_traits>

namespace torch_monitor::detail {

// The running aggregates of one window (or of one thread's share of it).
// Every aggregate is always updated: that is cheaper than testing which ones
// are enabled, and only the enabled ones are ever reported.
// Thread safety: none of its own; a shard's owner and the harvester share
// one through ThreadShard's handshake, and the others are guarded by their
// Stat's mutex.
template <typename T>
struct Accumulator {
  T value{0};
  T sum{0};
  T min{0};
  T max{0};
  int64_t count{0};
  // Monotonic ms of the latest add: orders VALUE across threads' shares.
  int64_t lastMs{0};

  void add(T v, int64_t nowMs) noexcept {
    value = v;
    sum = wrappingAdd(sum, v);
    // The first sample initialises MAX and MIN, so a NaN first sample
    // poisons them and later NaNs (whose comparisons are false) are ignored,
    // exactly as torch.monitor does.
    if (max < v || count == 0) {
      max = v;
    }
    if (min > v || count == 0) {
      min = v;
    }
    ++count;
    lastMs = nowMs;
  }

  // Folds another share of the same window into this one.
  void merge(const Accumulator& other) noexcept {
    if (other.count == 0) {
      return;
    }
    if (count == 0 || other.lastMs >= lastMs) {
      value = other.value;
      lastMs = other.lastMs;
    }
    sum = wrappingAdd(sum, other.sum);
    if (max < other.max || count == 0) {
      max = other.max;
    }
    if (min > other.min || count == 0) {
      min = other.min;
    }
    count += other.count;
  }

  // Sum/count, 0 for an empty window; integer division for integer stats.
  T mean() const noexcept {
    return count == 0 ? T(0) : T(sum / T(count));
  }

 private:
  // Integer sums wrap instead of overflowing (which would be undefined).
  static T wrappingAdd(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>) {
      return T(uint64_t(a) + uint64_t(b));
    } else {
      return a + b;
    }
  }
};

} // namespace torch_monitor::detail
