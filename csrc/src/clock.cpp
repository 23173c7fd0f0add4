#include <torch_monitor/clock.h>

#include <chrono>

namespace torch_monitor {

namespace detail {
std::atomic<int64_t> fakeMonotonicMs{kNoFakeClock};
} // namespace detail

bool coarseClockIsPreciseEnough(int64_t windowMs) noexcept {
  static const int64_t resolutionNs = [] {
    timespec res;
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) != 0) {
      return std::numeric_limits<int64_t>::max();
    }
    return int64_t(res.tv_sec) * 1000000000 + res.tv_nsec;
  }();
  // resolution <= 1% of the window, i.e. windowMs >= resolutionNs / 10^4
  // rounded up (dividing, since multiplying a huge window would overflow).
  return windowMs >= (resolutionNs + 9999) / 10000;
}

int64_t rankTimeWindowIndex(
    int64_t endMs,
    int64_t lengthMs,
    ClockSource clock) noexcept {
  const int64_t wallNowMs =
      std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count();
  const int64_t middle = endMs - lengthMs / 2;
  return (middle + (wallNowMs - readClock(clock))) / lengthMs;
}

namespace test_hooks {
void setFakeMonotonicMs(int64_t ms) noexcept {
  detail::fakeMonotonicMs.store(ms, std::memory_order_relaxed);
}
void clearFakeMonotonicClock() noexcept {
  detail::fakeMonotonicMs.store(detail::kNoFakeClock, std::memory_order_relaxed);
}
} // namespace test_hooks

} // namespace torch_monitor
