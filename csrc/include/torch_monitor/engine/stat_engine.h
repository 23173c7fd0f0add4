#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch_monitor/aggregation.h>
#include <torch_monitor/clock.h>
#include <torch_monitor/engine/accumulator.h>
#include <torch_monitor/engine/aggregation_list.h>
#include <torch_monitor/engine/live_stats.h>
#include <torch_monitor/engine/thread_shard.h>
#include <torch_monitor/detail/word_lock.h>
#include <torch_monitor/event.h>
#include <torch_monitor/export.h>

namespace at {
class Tensor;
} // namespace at

namespace torch_monitor {
struct RankGroup; // rank_sync.h
} // namespace torch_monitor

namespace torch_monitor::detail {

template <typename T>
class TensorWindow;
struct WindowShape; // what ranks compare before they merge (rank sync)

// The lock-free engine of Stat<T> (stat.h), which derives from it and adds
// the public API and its argument checks. The engine keeps the windows (on
// the monotonic clock, on training steps, or driven by an override of
// currentWindowId()), the per-thread shards that add() writes without a
// lock and the close that harvests them (thread_shard.h), the capped mode,
// the samples of device tensors (tensor_window.h), and what the live-stat
// registry, the window timer and the rank sync thread call.
// See docs/design.md, "Stat.add without locks".
// Thread safety: as Stat<T>: no concurrent call causes a data race, and no
// sample is lost or counted twice across a window close.
template <typename T>
class TORCH_MONITOR_API StatEngine : public LiveStat {
 protected:
  // A window of `length` units of `clock`; `maxSamples` caps each window
  // (nullopt: uncapped, add() is lock-free). Stat checks the arguments.
  StatEngine(
      std::string name,
      const std::vector<Aggregation>& aggregations,
      ClockSource clock,
      int64_t length,
      std::optional<int64_t> maxSamples,
      bool closedOnTime);
  // Frees the shards and the capped window; the Stat has left every
  // registry and logged its last window before.
  ~StatEngine();

  // Stat::add(T): one clock read and, within a window, a write to the
  // calling thread's shard.
  void addSample(T v) {
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

  // Stat::addIfWindowOpen(T): addSample's fast path alone.
  bool addSampleIfOpen(T v) {
    if (capped_) {
      return false;
    }
    const int64_t now = readClock(clock_);
    if (now >= windowEndMs_.load(std::memory_order_acquire)) {
      return false;
    }
    addSharded(v, now);
    return true;
  }

  // Adds a tensor that is not on the CPU (see Stat::add(const at::Tensor&)).
  void addOnDevice(const at::Tensor& values);
  // Samples in the open window (Stat::count()).
  int64_t openCount() const;
  // The aggregates of the last closed window (Stat::get()).
  std::vector<std::pair<Aggregation, T>> lastAggregates() const;
  // Posts the closed windows to `group`'s rank sync from now on
  // (Stat::syncRanks()); leaveRankSync() forgets the group (once the last
  // window is posted).
  void joinRankSync(std::shared_ptr<const RankGroup> group);
  void leaveRankSync() noexcept;

  // Stat's override point (see Stat::currentWindowId()): this
  // implementation reads the stat's own clock.
  virtual uint64_t currentWindowId() const;

  // LiveStat, for closeAllStats(), liveStatNames(), the window timer and
  // fork().
  const std::string* statName() const noexcept override {
    return &name_;
  }
  std::optional<Event> closeOpenWindow() override;
  std::vector<Event> closeEndedWindow(int64_t& openEndMs) override;
  std::optional<Event> closeWindowLeftBehind(
      int64_t step,
      std::optional<int64_t> stamp) override;
  void lockBeforeFork() override {
    mutex_.lock();
  }
  void unlockAfterForkInParent() override {
    mutex_.unlock();
  }
  void resetAfterForkInChild() override;

 private:
  struct ClosedWindow {
    Accumulator<T> values;
    bool emit = false;
    int64_t endMs = 0; // the window's end, in clock_'s units
    // The step its event carries when not the current one (a window closed
    // because the step went back carries the step the run had reached).
    std::optional<int64_t> stamp;
  };
  // The shards of the threads after the first one to add (the overflow
  // shard last), created when a second thread adds.
  // Also holds the samples added as device tensors, created by the first
  // such add: stats that never get one pay nothing for them.
  struct ShardTable {
    std::atomic<CacheLineShard<T>*> shards[kMaxThreadSlots + 1] = {};
    TensorWindow<T>* tensors = nullptr; // guarded by mutex_
    // The open window's id while an override of currentWindowId() drives
    // the windows (guarded by mutex_).
    int64_t drivenWindowId = 0;
  };
  // Capped mode only: torch::monitor's window state machine.
  struct CappedWindow {
    explicit CappedWindow(int64_t max) : maxSamples(max) {}
    const int64_t maxSamples;
    Accumulator<T> current;
    int64_t windowId = 0; // 0: none (before the first add, after the timer)
    int64_t lastClosedWindowId = 0;
    bool driven = false; // by an override of currentWindowId()
  };
  static constexpr int8_t kNoSlot = -1;

  void addSharded(T v, int64_t now) {
    const int slot = threadSlot();
    ThreadShard<T>* shard = &firstShard_;
    // One compare for the first thread to add, which is most often the only
    // one.
    if (__builtin_expect(
            slot != firstSlot_.load(std::memory_order_relaxed), 0)) {
      const ShardTable* table = state_.table.load(std::memory_order_acquire);
      shard = table != nullptr && slot != kOverflowSlot
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
  Accumulator<T> harvest(
      bool reset,
      const void* probe = nullptr,
      int64_t* probeCount = nullptr) const;
  // Takes the whole open window, the device tensors' samples included
  // (callers hold mutex_).
  Accumulator<T> takeOpenWindowLocked();
  // The shard of the thread holding `slot` (not the overflow slot), claimed
  // or created on its first use; `locked` when the caller holds mutex_.
  ThreadShard<T>* claimShard(int slot, bool locked);
  // The calling thread's shard (claimed if need be) and its sample count;
  // (nullptr, 0) for an overflow thread before any of them added a number
  // (callers hold mutex_).
  std::pair<const void*, int64_t> ownShardLocked();
  // Makes `closed`, which ends at endMs, the previous window; returns it for
  // emission outside the lock (callers hold mutex_).
  ClosedWindow closeLocked(const Accumulator<T>& closed, int64_t endMs);
  // The event of a window, or nothing for an empty one or one a synced Stat
  // posted to its rank group.
  std::optional<Event> eventOf(const ClosedWindow& closed) const;
  // The index that names the window ending at endMs on every rank.
  int64_t rankWindowIndex(int64_t endMs) const noexcept;
  void emit(const ClosedWindow& closed) const;
  // (aggregation, aggregate) per aggregation of `enabled`, in ascending
  // order.
  static std::vector<std::pair<Aggregation, T>> aggregatesOf(
      AggregationSet enabled,
      const Accumulator<T>& window);
  // A window's event: one "<name>.<aggregation>" key per enabled one.
  static Event eventOfWindow(
      const std::string& name,
      AggregationSet enabled,
      const Accumulator<T>& window,
      std::optional<int64_t> step);
  // What a rank posts to say which windows it merges: ranks of another
  // shape are never merged with it.
  WindowShape windowShape() const noexcept;
  int64_t windowIdAt(int64_t nowMs) const noexcept {
    // The window that holds step 2**63-1 would end beyond int64: it is the
    // last one and holds it (so is the id, with one-step windows).
    const int64_t completed = nowMs / windowLength_;
    return completed == std::numeric_limits<int64_t>::max() ? completed
                                                             : completed + 1;
  }
  // The end (exclusive) of window `id`; kLastWindowEnd for the last window
  // of the step range, which ends beyond int64 and holds step 2**63-1.
  int64_t windowEndOf(int64_t id) const noexcept {
    int64_t end = 0;
    return __builtin_mul_overflow(id, windowLength_, &end) ? kLastWindowEnd
                                                           : end;
  }
  static constexpr int64_t kLastWindowEnd =
      std::numeric_limits<int64_t>::max();

 protected:
  // The fields. Stat's accessors read them; only the engine writes them.
  //
  // The layout keeps a stat small (200 bytes, a 224-byte heap block with
  // its TorchScript holder: the Python Stat's memory target, docs/
  // performance.md) and keeps firstShard_, which its owner writes on every
  // add, off the cache lines of the fields that other threads' adds read
  // (windowEndMs_ and firstSlot_), of the lock word, and of neighbouring
  // heap blocks: at least 56 bytes of rarely written fields on each side
  // (heap blocks are 16-byte aligned). The registry links (LiveStat) come
  // first.

  // End (exclusive, in clock_'s units: monotonic ms or steps) of the open
  // window; 0 before the first add and after the window timer closed a
  // window; kDrivenByOverride once an override of currentWindowId() drives
  // the windows (every add then takes the slow path).
  std::atomic<int64_t> windowEndMs_{0};
  static constexpr int64_t kDrivenByOverride =
      std::numeric_limits<int64_t>::min();
  // The slot of the thread that owns firstShard_, kNoSlot before the first
  // add. The overflow slot never owns it.
  std::atomic<int8_t> firstSlot_{kNoSlot};
  // One byte for the three constant settings.
  const ClockSource clock_ : 2;
  const bool capped_ : 1;
  const bool closedOnTime_ : 1; // by the window timer (WindowClose::ON_TIME)
  const AggregationSet aggregations_;
  // Set once by Stat::syncRanks(); the group itself lives in the rank sync
  // thread's table (enableRankSync), so Stats that never sync pay one byte.
  std::atomic<bool> syncRanks_{false};
  // Guards window closing, prev_, the shard table's creation, the overflow
  // shard and the capped state. A word, not a 40-byte std::mutex.
  mutable WordLock mutex_;
  // The mode (capped_) never changes, so its state shares one pointer.
  union ModeState {
    explicit ModeState(CappedWindow* c) : capped(c) {}
    ModeState() : table(nullptr) {}
    std::atomic<ShardTable*> table; // uncapped: written under mutex_
    CappedWindow* capped; // capped: owned, created by the constructor
  } state_;

  const int64_t windowLength_; // the window length, in clock_'s units
  const PackedAggregationList aggregationList_;
  const std::string name_;
  ThreadShard<T> firstShard_;
  Accumulator<T> prev_;
};

extern template class StatEngine<double>;
extern template class StatEngine<int64_t>;

} // namespace torch_monitor::detail
