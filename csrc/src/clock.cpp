#include <torch_monitor/clock.h>

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

namespace test_hooks {
void setFakeMonotonicMs(int64_t ms) noexcept {
  detail::fakeMonotonicMs.store(ms, std::memory_order_relaxed);
}
void clearFakeMonotonicClock() noexcept {
  detail::fakeMonotonicMs.store(detail::kNoFakeClock, std::memory_order_relaxed);
}
} // namespace test_hooks

} // namespace torch_monitor
