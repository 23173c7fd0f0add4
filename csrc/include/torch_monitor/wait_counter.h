#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <torch_monitor/export.h>
#include <torch_monitor/stat.h>

namespace torch_monitor {

// A named duration counter: torch.monitor's _WaitCounter, with a backend
// that keeps what it measures. Each unit of work timed by a guard() is one
// sample, its duration in microseconds (fractional), of a Stat<double> named
// after the key, so each window logs one "torch.monitor.Stat" event with
// "<key>.count" (units finished), "<key>.sum" (their total duration),
// "<key>.max" and "<key>.mean". Windows and their closing are the Stat's.
//
// Thread safety: as Stat<double>; guards of one counter may time units of
// work on any threads at once.
class TORCH_MONITOR_API WaitCounter {
 public:
  // One minute: a window per minute keeps the event rate low for a counter
  // hit many times a second (torch::monitor advises windows of that order).
  static constexpr std::chrono::milliseconds kDefaultWindow{60'000};

  // Times one unit of work, from its creation (WaitCounter::guard()) to
  // stop() or its destruction, and records it once.
  // Thread safety: one guard is used by one thread at a time; it must not
  // outlive its counter.
  class TORCH_MONITOR_API Guard {
   public:
    Guard(Guard&& other) noexcept
        : counter_(other.counter_), start_(other.start_) {
      other.counter_ = nullptr;
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    Guard& operator=(Guard&&) = delete;
    // stop(), reporting a throwing event handler as a warning.
    ~Guard();

    // Records the unit of work as finished now; later calls do nothing. An
    // exception of an event handler (run when this closes a window)
    // propagates.
    void stop();

   private:
    friend class WaitCounter;
    explicit Guard(WaitCounter& counter)
        : counter_(&counter), start_(std::chrono::steady_clock::now()) {}

    WaitCounter* counter_; // nullptr once recorded (or moved from)
    std::chrono::steady_clock::time_point start_;
  };

  // Throws c10::ValueError for a key that is not valid UTF-8 or holds NUL,
  // and for a window Stat rejects.
  explicit WaitCounter(
      std::string key,
      std::chrono::milliseconds window = kDefaultWindow,
      WindowClose windowClose = WindowClose::LAZY)
      : stat_(
            std::move(key),
            {Aggregation::COUNT,
             Aggregation::SUM,
             Aggregation::MAX,
             Aggregation::MEAN},
            window,
            Stat<double>::kUnlimitedSamples,
            windowClose) {}

  // Starts timing one unit of work: `auto guard = counter.guard();`.
  Guard guard() {
    return Guard(*this);
  }

  // Records one unit of work that took `duration` (timed elsewhere); throws
  // c10::ValueError for a negative duration.
  void record(std::chrono::nanoseconds duration) {
    TORCH_CHECK_VALUE(
        duration.count() >= 0,
        "WaitCounter '",
        key(),
        "': a unit of work cannot take a negative time, got ",
        duration.count(),
        " ns");
    stat_.add(std::chrono::duration<double, std::micro>(duration).count());
  }

  const std::string& key() const noexcept {
    return stat_.name();
  }
  // The underlying stat (get(), count(), its window).
  const Stat<double>& stat() const noexcept {
    return stat_;
  }

 private:
  Stat<double> stat_;
};

// The process's counter of `key` (with this window and close): made at the
// first call and kept for the process's life, so every handle of one key
// times into one Stat and logs one event per window, however many handles
// are made (PyTorch's own code makes one per call: `with
// _WaitCounter(key).guard():`), as torch.monitor's _WaitCounter(key) is a
// handle of c10's one counter per key. What torch_monitor.WaitCounter holds
// in Python and TorchScript; a WaitCounter constructed in C++ is its own.
// Keys made without end (a step in the key) are each kept: use a few.
// Throws as the WaitCounter constructor does.
// Thread safety: callable from any thread.
TORCH_MONITOR_API std::shared_ptr<WaitCounter> sharedWaitCounter(
    const std::string& key,
    std::chrono::milliseconds window = WaitCounter::kDefaultWindow,
    WindowClose windowClose = WindowClose::LAZY);

} // namespace torch_monitor
