#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch_monitor/aggregation.h>
#include <torch_monitor/clock.h>
#include <torch_monitor/engine/stat_engine.h>
#include <torch_monitor/export.h>

namespace at {
class Tensor;
} // namespace at

namespace torch_monitor {
struct RankGroup; // rank_sync.h

// A window length in training steps (step.h), for the Stat constructor:
// `Stat<double> loss("loss", {Aggregation::MEAN}, WindowSteps{100});`.
// Thread safety: a plain value.
struct WindowSteps {
  int64_t steps;
};

// When a Stat's finished window is closed and logged.
enum class WindowClose : uint8_t {
  // torch.monitor's rule: by the next add() (or destruction, or exit).
  LAZY,
  // Also by the window timer, a background thread shared by all such Stats,
  // shortly after the window ends if it holds samples; handlers then run on
  // that thread. Bound, exit and fork: see engine/window_timer.h.
  ON_TIME,
};

// Windowed summary statistics of a stream of samples, with the semantics of
// torch::monitor::Stat: windows are aligned to multiples of `windowSize` on
// the monotonic clock (or, built with WindowSteps, to multiples of that
// many training steps: the window [0, N) ends when setStep() reaches N, so
// every rank that sets the same steps closes the same windows); a finished
// window is closed by the next add() (or by
// destruction), which logs one "torch.monitor.Stat" event carrying one
// "<name>.<aggregation>" key per enabled aggregation.
//
// With the default (unbounded) maxSamples, add() is lock-free and each thread
// accumulates into a shard of its own (the engine: engine/stat_engine.h and
// engine/thread_shard.h); with a finite maxSamples the per-window cap needs
// one exact count, so add() takes the stat's mutex.
//
// Every live Stat is known to a process-wide registry (joined at
// construction, left at destruction, never touched by add()), so that
// closeAllStats() can log open windows at exit and fork() leaves every Stat
// usable in the child. The child starts with an empty open window: the
// samples it inherited belong to the parent's window, which the parent logs.
//
// Tensors are samples too (add(const at::Tensor&)): a CPU tensor is read in
// place; a tensor on another device stays there (engine/tensor_window.h)
// until its window closes, so adding it never waits for the device.
//
// With WindowClose::ON_TIME a window is also closed shortly after it ends,
// on the window timer's thread; add() costs the same.
//
// Thread safety: no concurrent call to any API of this type causes a data
// race, and no sample is lost or counted twice across a window close.
template <typename T>
class TORCH_MONITOR_API Stat : private detail::StatEngine<T> {
 public:
  static constexpr int64_t kUnlimitedSamples =
      std::numeric_limits<int64_t>::max();
  // The longest window: datetime.timedelta.max (999999999 days, about 2.7
  // million years) in whole ms, so that every face can report it.
  static constexpr int64_t kMaxWindowMs = 86'399'999'999'999'999;

  // Throws c10::ValueError for a name that is not valid UTF-8 or contains
  // NUL, a window under 1 ms or over kMaxWindowMs, maxSamples < 1 or an
  // invalid aggregation. An empty list is accepted (as torch::monitor does):
  // its windows log events without data.
  Stat(
      std::string name,
      std::initializer_list<Aggregation> aggregations,
      std::chrono::milliseconds windowSize,
      int64_t maxSamples = kUnlimitedSamples,
      WindowClose windowClose = WindowClose::LAZY)
      : Stat(
            std::move(name),
            std::vector<Aggregation>(aggregations),
            windowSize,
            maxSamples,
            windowClose) {}
  Stat(
      std::string name,
      std::vector<Aggregation> aggregations,
      std::chrono::milliseconds windowSize,
      int64_t maxSamples = kUnlimitedSamples,
      WindowClose windowClose = WindowClose::LAZY);
  // Windows of `windowSteps.steps` training steps (at least 1, else
  // c10::ValueError). Until setStep() is first called the step reads 0.
  // Closed lazily only: the window timer follows time, not steps.
  Stat(
      std::string name,
      std::initializer_list<Aggregation> aggregations,
      WindowSteps windowSteps,
      int64_t maxSamples = kUnlimitedSamples)
      : Stat(
            std::move(name),
            std::vector<Aggregation>(aggregations),
            windowSteps,
            maxSamples) {}
  Stat(
      std::string name,
      std::vector<Aggregation> aggregations,
      WindowSteps windowSteps,
      int64_t maxSamples = kUnlimitedSamples);

  Stat(const Stat&) = delete;
  Stat& operator=(const Stat&) = delete;

  // Closes the open window: logs it if it holds samples, even if it has not
  // elapsed. A throwing handler is reported as a warning here. Virtual, as
  // torch::monitor's: code deletes subclasses through a Stat pointer.
  virtual ~Stat();

  // Adds one sample to the current window, closing the previous window first
  // if it has ended. The sample is added even when a handler of the closing
  // event throws; that exception then propagates after every handler ran.
  void add(T v) {
    this->addSample(v);
  }
  // Adds `v` only if it falls in the open window of an uncapped Stat: then
  // nothing closes and no event handler runs. Returns false, having added
  // nothing, when the add would close or open a window (add() it then). For
  // callers that must not run handlers where they are: PyTorch's counter
  // backends add this way while a capture's removal waits for them.
  bool addIfWindowOpen(T v) {
    return this->addSampleIfOpen(v);
  }

  // Adds every element of `values` as one sample, in flattened order,
  // detached from autograd. A CPU tensor is read in place. A tensor on
  // another device is summarised there without waiting for it (a scalar
  // costs one copy kernel, a larger tensor about seven small ones) and the
  // host reads the window's summaries once, when the window closes; only
  // with a finite maxSamples, whose cap counts single samples, is it copied
  // to the host at once. Throws c10::TypeError for a complex tensor, and for
  // a floating-point one in a Stat<int64_t>; c10::ValueError for an
  // undefined tensor or one on the meta device (it holds no values).
  void add(const at::Tensor& values);

  const std::string& name() const noexcept {
    return this->name_;
  }
  // Samples accepted in the open window.
  int64_t count() const;
  // The aggregates of the last closed window (zeros before the first close),
  // one entry per enabled aggregation.
  std::unordered_map<Aggregation, T, AggregationHash> get() const;

  // The window length: windowSize() for time windows (0 for step windows),
  // windowSteps() for step windows (0 for time windows).
  std::chrono::milliseconds windowSize() const noexcept {
    return std::chrono::milliseconds(
        this->clock_ == ClockSource::STEP ? 0 : this->windowLength_);
  }
  int64_t windowSteps() const noexcept {
    return this->clock_ == ClockSource::STEP ? this->windowLength_ : 0;
  }
  int64_t maxSamples() const noexcept {
    return this->capped_ ? this->state_.capped->maxSamples
                         : kUnlimitedSamples;
  }
  WindowClose windowClose() const noexcept {
    return this->closedOnTime_ ? WindowClose::ON_TIME : WindowClose::LAZY;
  }
  // As given to the constructor (duplicates kept).
  std::vector<Aggregation> aggregations() const {
    return this->aggregationList_.unpack();
  }

  // Merges this Stat's windows across the ranks of `group` (nullptr: the
  // process default group, see rank_sync.h) from now on: each closed window
  // is posted to the group's Store instead of being logged here, and the
  // root (rank 0) logs the window of all ranks, with the data key
  // "<name>.ranks" (how many ranks it covers), in window order. get() keeps
  // this rank's own last window.
  // Call it before the first window closes; the Stat's name must be unique
  // among the group's synced Stats. Windows are matched by index: exact for
  // step windows, by wall-clock time for time windows. See
  // docs/distributed.md.
  void syncRanks(std::shared_ptr<const RankGroup> group);
  bool syncsRanks() const noexcept {
    return this->syncRanks_.load(std::memory_order_relaxed);
  }

 protected:
  // The id of the window a sample added now belongs to (at least 1):
  // torch::monitor's override point, which tests override to drive the
  // windows of each stat by hand. This implementation reads the stat's own
  // clock (time, steps, or the fake clock of test_hooks).
  //
  // It is asked only at a window boundary of the stat's own clock, so add()
  // makes no virtual call within a window. From the first answer that is not
  // this implementation's, the stat follows the override alone: every add()
  // then asks it, and a window ends when its answer changes (also for
  // WindowClose::ON_TIME, whose timer then leaves the stat alone).
  // Called with the stat's mutex held: an override must not call the stat.
  //   virtual uint64_t currentWindowId() const;  (declared by the engine)
  using detail::StatEngine<T>::currentWindowId;

 private:
  // Both public constructors: a window of `length` units of `clock`.
  Stat(
      std::string name,
      std::vector<Aggregation> aggregations,
      ClockSource clock,
      int64_t length,
      int64_t maxSamples,
      WindowClose windowClose);
};

// Converts a window given in seconds (Python's convention) to the whole
// milliseconds a Stat keeps: truncated (timedelta(microseconds=1500) is
// 1 ms, as in torch.monitor), but a value a rounding error away from whole
// milliseconds is taken as meant (1.001 s is 1001 ms); throws
// c10::ValueError for a negative, non-finite or too large value. The Stat
// constructor rejects < 1 ms.
TORCH_MONITOR_API std::chrono::milliseconds windowFromSeconds(double seconds);
// The window in seconds, as a float that windowFromSeconds reads back as
// `window` (what a saved state holds): every window up to
// datetime.timedelta.max survives a copy.
TORCH_MONITOR_API double secondsOfWindow(std::chrono::milliseconds window);

// Closes the open window of every live Stat of both types and logs those
// that hold samples, as if their windows had ended now; the Stats stay
// usable. Runs by itself at process exit (std::atexit, before the sinks'
// final flush) and, in Python, from the package's atexit hook before Python
// handlers are removed, so a last window reaches the handlers even when its
// Stat is never destroyed. A failing handler is reported as a warning.
// Thread safety: callable from any thread, concurrently with every Stat API.
TORCH_MONITOR_API void closeAllStats() noexcept;

// The names of the Stats alive now, sorted, for exporters and debugging:
// every Stat and IntStat, those of WaitCounters and of a PyTorch counter
// capture's keys included (a name twice for two Stats of one name).
// Thread safety: callable from any thread, concurrently with every Stat API.
TORCH_MONITOR_API std::vector<std::string> liveStatNames();

namespace test_hooks {
// Routes CPU tensors through the path other devices' tensors take (their
// summaries kept as tensors until the window closes), so that tests on a
// machine without an accelerator cover it. Process-wide.
TORCH_MONITOR_API void setCpuTensorsTakeDevicePath(bool on) noexcept;
// Whether they do (TensorBoardWriter's points of tensors follow it too).
TORCH_MONITOR_API bool cpuTensorsTakeDevicePath() noexcept;
} // namespace test_hooks

extern template class Stat<double>;
extern template class Stat<int64_t>;

} // namespace torch_monitor
