#pragma once

#include <atomic>
#include <cstdint>
#include <ctime>
#include <limits>

#include <torch_monitor/export.h>
#include <torch_monitor/step.h>

namespace torch_monitor {

// Which clock a Stat's windows follow. COARSE (CLOCK_MONOTONIC_COARSE,
// ~3 ns) lags the precise clock (~25 ns) by at most one kernel tick, so it
// is used only for windows much longer than a tick (see
// coarseClockIsPreciseEnough). STEP is the training step (step.h): windows
// measured in steps.
enum class ClockSource : uint8_t { PRECISE, COARSE, STEP }; // one byte

namespace detail {
inline constexpr int64_t kNoFakeClock = std::numeric_limits<int64_t>::min();
// The fake clock used by tests; kNoFakeClock when the real clock is in use.
TORCH_MONITOR_API extern std::atomic<int64_t> fakeMonotonicMs;
} // namespace detail

// The clock's reading: for STEP the training step (0 until one is set);
// otherwise milliseconds on the monotonic clock (the clock
// std::chrono::steady_clock reads on Linux), or the fake clock's value while
// one is set.
inline int64_t readClock(ClockSource source) noexcept {
  if (source == ClockSource::STEP) {
    return getStep().value_or(0);
  }
  const int64_t fake = detail::fakeMonotonicMs.load(std::memory_order_relaxed);
  if (__builtin_expect(fake != detail::kNoFakeClock, 0)) {
    return fake;
  }
  timespec ts;
  clock_gettime(
      source == ClockSource::COARSE ? CLOCK_MONOTONIC_COARSE : CLOCK_MONOTONIC,
      &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// The index by which ranks match a time window `lengthMs` long that ends
// at `endMs` on `clock` (PRECISE or COARSE; the fake clock while set).
// Monotonic clocks differ between machines, so the window is named by the
// wall-clock window holding its middle, which matches across ranks while
// their clocks agree to well within a window (docs/distributed.md).
TORCH_MONITOR_API int64_t rankTimeWindowIndex(
    int64_t endMs,
    int64_t lengthMs,
    ClockSource clock = ClockSource::PRECISE) noexcept;

// True when the coarse clock's resolution is at most 1% of the window, so a
// window boundary is late by at most 1% of the window.
TORCH_MONITOR_API bool coarseClockIsPreciseEnough(int64_t windowMs) noexcept;

namespace test_hooks {
// Replaces the monotonic clock of every Stat by a fake one set to `ms`, so
// window tests are deterministic without sleeping. Process-wide.
TORCH_MONITOR_API void setFakeMonotonicMs(int64_t ms) noexcept;
// Returns to the real monotonic clock.
TORCH_MONITOR_API void clearFakeMonotonicClock() noexcept;
} // namespace test_hooks

} // namespace torch_monitor
