#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch_monitor/aggregation.h>
#include <torch_monitor/clock.h>
#include <torch_monitor/detail/aggregation_list.h>
#include <torch_monitor/detail/accumulator.h>
#include <torch_monitor/detail/live_stats.h>
#include <torch_monitor/detail/thread_shard.h>
#include <torch_monitor/event.h>
#include <torch_monitor/export.h>

namespace at {
class Tensor;
} // namespace at

namespace torch_monitor {
namespace detail {
template <typename T>
class TensorWindow;
} // namespace detail
struct RankGroup; // rank_sync.h

// A window length in training steps (step.h), for the Stat constructor:
// `Stat<double> loss("loss", {Aggregation::MEAN}, WindowSteps{100});`.
struct WindowSteps {
  int64_t steps;
};

// When a Stat's finished window is closed and logged.
enum class WindowClose : uint8_t {
  // torch.monitor's rule: by the next add() (or destruction, or exit).
  LAZY,
  // Also by the window timer, a background thread shared by all such Stats,
  // shortly after the window ends if it holds samples; handlers then run on
  // that thread. Bound, exit and fork: see detail/window_timer.h.
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
// accumulates into a shard of its own (see detail/thread_shard.h); with a
// finite maxSamples the per-window cap needs one exact count, so add() takes
// the stat's mutex.
//
// Every live Stat is known to a process-wide registry (joined at
// construction, left at destruction, never touched by add()), so that
// closeAllStats() can log open windows at exit and fork() leaves every Stat
// usable in the child. The child starts with an empty open window: the
// samples it inherited belong to the parent's window, which the parent logs.
//
// Tensors are samples too (add(const at::Tensor&)): a CPU tensor is read in
// place; a tensor on another device stays there (detail/tensor_window.h)
// until its window closes, so adding it never waits for the device.
//
// With WindowClose::ON_TIME a window is also closed shortly after it ends,
// on the window timer's thread; add() costs the same.
//
// Thread safety: no concurrent call to any API of this type causes a data
// race, and no sample is lost or counted twice across a window close.
template <typename T>
class TORCH_MONITOR_API Stat : private detail::LiveStat {
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
    if (capped_) {
      addCapped(v);
      return;
    }
    const int64_t now = readClock(clock_);
    if (__builtin_expect(
            now >= windowEndMs_.load(std::memory_order_acquire), 0)) {
      addAfterRollOver(v, now);
    } else {
      addSharded(v, now);
    }
  }

  // Adds every element of `values` as one sample, in flattened order,
  // detached from autograd. A CPU tensor is read in place. A tensor on
  // another device is summarised there without waiting for it (a scalar
  // costs one copy kernel, a larger tensor about seven small ones) and the
  // host reads the window's summaries once, when the window closes; only
  // with a finite maxSamples, whose cap counts single samples, is it copied
  // to the host at once. Throws c10::TypeError for a complex tensor, and for
  // a floating-point one in a Stat<int64_t>.
  void add(const at::Tensor& values);

  const std::string& name() const noexcept {
    return name_;
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
        clock_ == ClockSource::STEP ? 0 : windowLength_);
  }
  int64_t windowSteps() const noexcept {
    return clock_ == ClockSource::STEP ? windowLength_ : 0;
  }
  int64_t maxSamples() const noexcept {
    return capped_ ? state_.capped->maxSamples : kUnlimitedSamples;
  }
  WindowClose windowClose() const noexcept {
    return windowClose_;
  }
  // As given to the constructor (duplicates kept).
  std::vector<Aggregation> aggregations() const {
    return aggregationList_.unpack();
  }

  // Merges this Stat's windows across the ranks of `group` (nullptr: the
  // process default group, see rank_sync.h) from now on: each closed window
  // is posted to the group's Store instead of being logged here, and the
  // root (rank 0) logs the window of all ranks, with the data key
  // "<name>.ranks" (how many ranks it covers), in window order. get() keeps this rank's own last window.
  // Call it before the first window closes; the Stat's name must be unique
  // among the group's synced Stats. Windows are matched by index: exact for
  // step windows, by wall-clock time for time windows. See
  // docs/distributed.md.
  void syncRanks(std::shared_ptr<const RankGroup> group);
  bool syncsRanks() const noexcept {
    return syncRanks_.load(std::memory_order_relaxed);
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
  virtual uint64_t currentWindowId() const;

 private:
  struct ClosedWindow {
    detail::Accumulator<T> values;
    bool emit = false;
    int64_t endMs = 0; // the window's end, in clock_'s units
  };
  // The shards of the threads after the first one to add (the overflow
  // shard last), created when a second thread adds.
  // Also holds the samples added as device tensors, created by the first
  // such add: stats that never get one pay nothing for them.
  struct ShardTable {
    std::atomic<detail::CacheLineShard<T>*>
        shards[detail::kMaxThreadSlots + 1] = {};
    detail::TensorWindow<T>* tensors = nullptr; // guarded by mutex_
    // The open window's id while an override of currentWindowId() drives
    // the windows (guarded by mutex_).
    int64_t drivenWindowId = 0;
  };
  // Capped mode only: torch::monitor's window state machine.
  struct CappedWindow {
    explicit CappedWindow(int64_t max) : maxSamples(max) {}
    const int64_t maxSamples;
    detail::Accumulator<T> current;
    int64_t windowId = 0; // 0: none (before the first add, after the timer)
    int64_t lastClosedWindowId = 0;
    bool driven = false; // by an override of currentWindowId()
  };
  static constexpr int16_t kNoSlot = -1;

  // Both public constructors: a window of `length` units of `clock`.
  Stat(
      std::string name,
      std::vector<Aggregation> aggregations,
      ClockSource clock,
      int64_t length,
      int64_t maxSamples,
      WindowClose windowClose);

  void addSharded(T v, int64_t now) {
    const int slot = detail::threadSlot();
    detail::ThreadShard<T>* shard = &firstShard_;
    // One compare for the first thread to add, which is most often the only
    // one.
    if (__builtin_expect(
            slot != firstSlot_.load(std::memory_order_relaxed), 0)) {
      const ShardTable* table = state_.table.load(std::memory_order_acquire);
      shard = table != nullptr && slot != detail::kOverflowSlot
          ? table->shards[slot].load(std::memory_order_acquire)
          : nullptr;
      if (shard == nullptr) {
        addToNewOrSharedShard(slot, v, now);
        return;
      }
    }
    shard->enter();
    shard->acc.add(v, now);
    shard->leave();
  }
  void addAfterRollOver(T v, int64_t now);
  // Asks currentWindowId() for the window of a sample added now; `driven`
  // tells whether an override answered rather than this stat's own clock.
  int64_t askWindowId(bool& driven) const;
  // Closes the open window if it ended before `now` and opens the one
  // holding `now`; returns the closed window for emission outside the lock
  // (callers hold mutex_).
  ClosedWindow closeIfEndedLocked(int64_t now);
  // Closes the open window (if it holds samples) and opens the one ending at
  // nextEndMs; 0 opens none, until the next add (callers hold mutex_).
  ClosedWindow rollOverLocked(int64_t nextEndMs);
  // Capped mode: closes the current window and makes nextWindowId current;
  // 0 makes none current, until the next add (callers hold mutex_).
  void closeCappedLocked(ClosedWindow& out, int64_t nextWindowId);
  // The first add of a thread, or any add from the overflow slot.
  void addToNewOrSharedShard(int slot, T v, int64_t now);
  // The shard table, created on first use (callers hold mutex_).
  ShardTable& tableLocked();
  // Reads the clock under the mutex: a reading taken before it could be
  // older than a window another thread has opened meanwhile.
  void addCapped(T v);
  // Collects every shard's share of the open window (callers hold mutex_).
  // When `probe` is one of the shards, *probeCount gets its sample count.
  detail::Accumulator<T> harvest(
      bool reset,
      const void* probe = nullptr,
      int64_t* probeCount = nullptr) const;
  // Takes the whole open window, the device tensors' samples included
  // (callers hold mutex_).
  detail::Accumulator<T> takeOpenWindowLocked();
  // Adds a tensor that is not on the CPU (see add(const at::Tensor&)).
  void addOnDevice(const at::Tensor& values);
  // The shard of the thread holding `slot` (not the overflow slot), claimed
  // or created on its first use; `locked` when the caller holds mutex_.
  detail::ThreadShard<T>* claimShard(int slot, bool locked);
  // The calling thread's shard (claimed if need be) and its sample count;
  // (nullptr, 0) for an overflow thread before any of them added a number
  // (callers hold mutex_).
  std::pair<const void*, int64_t> ownShardLocked();
  // Makes `closed`, which ends at endMs, the previous window; returns it for
  // emission outside the lock (callers hold mutex_).
  ClosedWindow closeLocked(const detail::Accumulator<T>& closed, int64_t endMs);
  // The event of a window, or nothing for an empty one or one a synced Stat
  // posted to its rank group.
  std::optional<Event> eventOf(const ClosedWindow& closed) const;
  // The index that names the window ending at endMs on every rank.
  int64_t rankWindowIndex(int64_t endMs) const noexcept;
  void emit(const ClosedWindow& closed) const;

  // detail::LiveStat, for closeAllStats() and fork().
  std::optional<Event> closeOpenWindow() override;
  std::optional<Event> closeEndedWindow(int64_t& openEndMs) override;
  void lockBeforeFork() override {
    mutex_.lock();
  }
  void unlockAfterForkInParent() override {
    mutex_.unlock();
  }
  void resetAfterForkInChild() override;
  // (aggregation, aggregate) per aggregation of `enabled`, in ascending
  // order.
  static std::vector<std::pair<Aggregation, T>> aggregatesOf(
      AggregationSet enabled,
      const detail::Accumulator<T>& window);
  // A window's event: one "<name>.<aggregation>" key per enabled one.
  static Event eventOfWindow(
      const std::string& name,
      AggregationSet enabled,
      const detail::Accumulator<T>& window);
  int64_t windowIdAt(int64_t nowMs) const noexcept {
    return nowMs / windowLength_ + 1;
  }

  // The layout keeps a stat small (about as small as torch::monitor's) and
  // keeps firstShard_, which its owner writes on every add, off the cache
  // lines of the fields that other threads' adds read (the first three), of
  // the bytes that locking writes, and of neighbouring heap blocks: at least
  // 56 bytes of rarely written fields on each side (heap blocks are 16-byte
  // aligned).

  // End (exclusive, in clock_'s units: monotonic ms or steps) of the open
  // window; 0 before the first add and after the window timer closed a
  // window; kDrivenByOverride once an override of currentWindowId() drives
  // the windows (every add then takes the slow path).
  std::atomic<int64_t> windowEndMs_{0};
  static constexpr int64_t kDrivenByOverride =
      std::numeric_limits<int64_t>::min();
  // The slot of the thread that owns firstShard_, kNoSlot before the first
  // add. The overflow slot never owns it.
  std::atomic<int16_t> firstSlot_{kNoSlot};
  const bool capped_;
  const ClockSource clock_;
  // In the bytes AggregationSet left free: costs no memory.
  const WindowClose windowClose_;
  const AggregationSet aggregations_;
  // Set once by syncRanks(); the group itself lives in rank_sync.cpp's
  // table, so Stats that never sync pay one byte.
  std::atomic<bool> syncRanks_{false};
  // The mode (capped_) never changes, so its state shares one pointer.
  union ModeState {
    explicit ModeState(CappedWindow* c) : capped(c) {}
    ModeState() : table(nullptr) {}
    std::atomic<ShardTable*> table; // unlimited: written under mutex_
    CappedWindow* capped; // capped: owned, created by the constructor
  } state_;

  const int64_t windowLength_; // the window length, in clock_'s units
  // Guards window closing, prev_, the shard table's creation, the overflow
  // shard and the capped state.
  mutable std::mutex mutex_;
  const std::string name_;
  detail::ThreadShard<T> firstShard_;
  detail::Accumulator<T> prev_;
  const detail::PackedAggregationList aggregationList_;
};

// Converts a window given in seconds (Python's convention) to the whole
// milliseconds a Stat keeps, truncating; throws c10::ValueError for a
// negative, non-finite or too large value. The Stat constructor rejects
// < 1 ms.
TORCH_MONITOR_API std::chrono::milliseconds windowFromSeconds(double seconds);

// Closes the open window of every live Stat of both types and logs those
// that hold samples, as if their windows had ended now; the Stats stay
// usable. Runs by itself at process exit (std::atexit, before the sinks'
// final flush) and, in Python, from the package's atexit hook before Python
// handlers are removed, so a last window reaches the handlers even when its
// Stat is never destroyed. A failing handler is reported as a warning.
// Thread safety: callable from any thread, concurrently with every Stat API.
TORCH_MONITOR_API void closeAllStats() noexcept;

namespace test_hooks {
// Routes CPU tensors through the path other devices' tensors take (their
// summaries kept as tensors until the window closes), so that tests on a
// machine without an accelerator cover it. Process-wide.
TORCH_MONITOR_API void setCpuTensorsTakeDevicePath(bool on) noexcept;
// Whether it is on (watch/recorder.cpp follows it too).
TORCH_MONITOR_API bool cpuTensorsTakeDevicePath() noexcept;
} // namespace test_hooks

extern template class Stat<double>;
extern template class Stat<int64_t>;

} // namespace torch_monitor
