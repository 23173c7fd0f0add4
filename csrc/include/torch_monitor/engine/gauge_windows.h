#pragma once

// Windows of gauges: values read when a window closes, not samples added
// during it (the units of work a PyTorch counter has running, c10's dynamic
// counters: pytorch_counters.h). They follow a Stat's windows (training
// steps, or time aligned to multiples of the window on the monotonic
// clock), but a gauge has no sample whose add() could close its window, so
// these windows close by themselves: a step window at the setStep() that
// ends it, a time window on the window timer, the open one at close() and
// with every Stat's (closeAllStats(), exit). Each close reads the gauges
// and logs one "torch.monitor.Stat" event holding them, nothing when none
// reads a value. Merged across ranks, rank 0 logs each gauge's sum over the
// ranks and how many ranks it covers.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch_monitor/detail/fork_safe_locks.h>
#include <torch_monitor/engine/live_stats.h>
#include <torch_monitor/export.h>
#include <torch_monitor/step.h>

namespace torch_monitor {
struct RankGroup; // rank_sync.h
} // namespace torch_monitor

namespace torch_monitor::detail {

// Gauges as read at one close: (key, value) pairs, each key once.
using Gauges = std::vector<std::pair<std::string, int64_t>>;

// Thread safety: a plain value.
struct GaugeWindowOptions {
  int64_t windowSteps = 0; // > 0: windows of training steps
  std::chrono::milliseconds windowSize{60'000}; // else windows of time
  // Set: merged across the ranks of this group, under `syncName` (unique
  // among the group's synced owners, the same on every rank).
  std::shared_ptr<const RankGroup> group;
  std::string syncName;
  std::string ranksKey; // the merged event's "how many ranks" key
};

// Thread safety: every method may be called from any thread, concurrently
// with step changes and the window timer. `read` runs under this object's
// own lock (so closes read in window order), and at exit under the
// live-stat registry's, which fork() takes after the locks of earlier
// stages: it must take none of those, nor block, nor close these windows.
class TORCH_MONITOR_API GaugeWindows final : public LiveStat,
                                             public StepListener {
 public:
  using Reader = std::function<Gauges()>;

  // Opens the first window now and starts following the step or the timer.
  static std::shared_ptr<GaugeWindows> start(
      GaugeWindowOptions options,
      Reader read);
  // close() if not yet.
  ~GaugeWindows() override;

  // Logs the open window (the step after the last one set: stepOfEarlyClose)
  // and stops. Later calls do nothing. A handler's exception propagates.
  void close();

  // LiveStat (the registry's exit and fork hooks, steps going back).
  std::optional<Event> closeOpenWindow() override;
  std::optional<Event> closeWindowLeftBehind(
      int64_t step,
      std::optional<int64_t> stamp) override;
  void lockBeforeFork() override {}
  void unlockAfterForkInParent() override {}
  void resetAfterForkInChild() override {}
  // TimedWindows (the window timer, time windows).
  std::vector<Event> closeEndedWindow(int64_t& openEndMs) override;
  // StepListener (step windows).
  void onStep(int64_t step) override;

 private:
  GaugeWindows(GaugeWindowOptions options, Reader read);
  // Reads the gauges of the window now open and moves to the next (whose
  // index is `next`); the event to log, if any (posted across ranks: none).
  // Callers hold mutex_.
  std::optional<Event> closeLocked(
      std::optional<int64_t> eventStep,
      int64_t next);

  const GaugeWindowOptions options_;
  const Reader read_;
  // Rebuilt in a forked child rather than taken by fork(): a close holds
  // it while it reads and posts, which fork() need not wait for.
  ForkSafeMutex mutex_;
  bool closed_ = false;
  int64_t index_ = 0; // the open window: step / windowSteps, or ms / size
  bool readEarly_ = false; // the open window was read before its end
};

} // namespace torch_monitor::detail
