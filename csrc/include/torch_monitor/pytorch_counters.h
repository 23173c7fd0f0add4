#pragma once

// PyTorch's own timings: torch_monitor as a backend of c10's wait counters
// (c10/util/WaitCounter.h). PyTorch times compilation, process-group set-up,
// every TCPStore operation and more with them (docs/pytorch_counters.md);
// a program sees none of it unless a backend takes it. The library
// registers its backend when it loads; a capture makes the counters it
// matches into Stats, so every sink, the windows and the cross-rank merge
// take them as they take any Stat.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch_monitor/export.h>

namespace torch_monitor {

struct RankGroup; // rank_sync.h

// What a capture takes and how it windows it; a plain value.
struct PytorchCounterOptions {
  // Windows of this many training steps (set_step) when > 0; else windows
  // of windowSize.
  int64_t windowSteps = 0;
  std::chrono::milliseconds windowSize{60'000};
  // Regular expressions (ECMAScript, as std::regex reads them) searched in
  // each key: a key is captured when `include` (if given) matches and
  // `exclude` (if given) does not.
  std::optional<std::string> include;
  std::optional<std::string> exclude;
  // Time windows only: the window timer closes them (WindowClose::ON_TIME).
  bool closeOnTime = false;
  // Merge each key's windows across the ranks of `group` (nullptr: the
  // process default group, which must be set when the capture starts), as
  // Stat::syncRanks does: rank 0 logs each window of all ranks.
  bool syncRanks = false;
  std::shared_ptr<const RankGroup> group;
};

// One capture: from its construction to remove() (or its destruction),
// every unit of work a c10 wait counter times under a key it matches is one
// sample, its duration in microseconds, of a Stat<double> named after the
// key with COUNT, SUM, MAX and MEAN (torch_monitor::WaitCounter's events:
// "<key>.count", "<key>.sum", "<key>.max", "<key>.mean"). A unit counts
// when it both started and stopped while the capture was active. The key's
// Stat is made at the first such unit, so a window logs only the keys timed
// in it. Each window's close also reads the capture's gauges (engine/
// gauge_windows.h) into one more "torch.monitor.Stat" event: "<key>.active"
// for each key with units running (started while a capture ran, not yet
// stopped), and "<key>" for each c10 dynamic counter (c10/util/
// DynamicCounter.h) the capture takes; merged across ranks, their sums. Units timed on the library's own threads (its rank sync's Store
// traffic) are torch_monitor's work and are not captured.
//
// c10 gives a key its backends when the key is first used, and a dynamic
// counter when it is made: a key first used (a counter made) before this
// library was loaded is not seen by any capture. Several captures may run
// at once (at most kMaxCaptures); each logs its own events.
//
// Thread safety: every method may be called from any thread, while other
// threads time work, and from event handlers. remove() never waits for a
// unit being added (whose window close may run handlers): a key's Stat
// then logs its last window when that add ends, on the adding thread.
class TORCH_MONITOR_API PytorchCounterCapture {
 public:
  static constexpr int kMaxCaptures = 64;

  // Throws c10::ValueError for a window Stat refuses, close_on_time with
  // step windows, syncRanks without a group (none given, no default set), a regular expression that does not compile, text that is
  // not UTF-8 or holds NUL, or a capture beyond kMaxCaptures.
  explicit PytorchCounterCapture(PytorchCounterOptions options = {});
  ~PytorchCounterCapture();
  PytorchCounterCapture(const PytorchCounterCapture&) = delete;
  PytorchCounterCapture& operator=(const PytorchCounterCapture&) = delete;

  // Stops capturing and closes every key's open window (logging it, at the
  // step a window closed early lands on: see step.h). Later calls do
  // nothing.
  void remove();
  bool removed() const noexcept;
  const PytorchCounterOptions& options() const noexcept {
    return options_;
  }
  // The keys captured so far, sorted (none once removed).
  std::vector<std::string> keys() const;

  struct State; // the capture's slot and Stats (pytorch_counters.cpp)

 private:
  const PytorchCounterOptions options_;
  std::shared_ptr<State> state_;
};

// Starts a capture, which lasts until the handle is destroyed:
//   torch_monitor::PytorchCounterOptions options;
//   options.windowSteps = 100;
//   auto capture = torch_monitor::capturePytorchCounters(options);
TORCH_MONITOR_API std::unique_ptr<PytorchCounterCapture> capturePytorchCounters(
    PytorchCounterOptions options = {});

} // namespace torch_monitor
