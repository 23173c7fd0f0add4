#include <torch_monitor/engine/stat_engine.h>

#include <algorithm>
#include <exception>
#include <type_traits>

#include <c10/util/Exception.h>

#include <torch_monitor/detail/call_each.h>
#include <torch_monitor/engine/tensor_window.h>
#include <torch_monitor/event_handler.h>
#include <torch_monitor/rank_sync/protocol.h>
#include <torch_monitor/rank_sync/stat_share.h>
#include <torch_monitor/step.h>

namespace torch_monitor::detail {

template <typename T>
StatEngine<T>::StatEngine(
    std::string name,
    const std::vector<Aggregation>& aggregations,
    ClockSource clock,
    int64_t length,
    std::optional<int64_t> maxSamples,
    bool closedOnTime)
    : clock_(clock),
      capped_(maxSamples.has_value()),
      closedOnTime_(closedOnTime),
      aggregations_(aggregations),
      windowLength_(length),
      aggregationList_(aggregations),
      name_(std::move(name)) {
  if (capped_) {
    state_.capped = new CappedWindow(*maxSamples);
  }
}

template <typename T>
StatEngine<T>::~StatEngine() {
  if (capped_) {
    delete state_.capped;
  } else if (ShardTable* table = state_.table.load(std::memory_order_relaxed)) {
    for (auto& shard : table->shards) {
      delete shard.load(std::memory_order_relaxed);
    }
    delete table->tensors;
    delete table;
  }
}

template <typename T>
void StatEngine<T>::addAfterRollOver(T v, int64_t now) {
  ClosedWindow closed;
  {
    std::lock_guard<WordLock> guard(mutex_);
    closed = closeIfEndedLocked(now);
  }
  addSharded(v, now);
  emit(closed);
}

namespace {
// The last answer of StatEngine<T>::currentWindowId() itself on this thread
// and the stat it came from: askWindowId() tells by them whether an override
// answered, without a field in every stat.
thread_local const void* ownAnswerOf = nullptr;
thread_local uint64_t ownAnswer = 0;
} // namespace

template <typename T>
uint64_t StatEngine<T>::currentWindowId() const {
  const auto id = static_cast<uint64_t>(windowIdAt(readClock(clock_)));
  ownAnswerOf = this;
  ownAnswer = id;
  return id;
}

template <typename T>
int64_t StatEngine<T>::askWindowId(bool& driven) const {
  ownAnswerOf = nullptr;
  const uint64_t id = currentWindowId(); // the one virtual call
  // An override that returns what this implementation returned is not
  // driving anything (yet).
  driven = !(ownAnswerOf == this && ownAnswer == id);
  ownAnswerOf = nullptr;
  return static_cast<int64_t>(id);
}

template <typename T>
typename StatEngine<T>::ClosedWindow StatEngine<T>::closeIfEndedLocked(
    int64_t now) {
  const int64_t end = windowEndMs_.load(std::memory_order_relaxed);
  // Another thread may have closed the window since we read the clock; the
  // last window of the step range also holds its end (step 2**63-1).
  if (end != kDrivenByOverride && (now < end || end == kLastWindowEnd)) {
    return ClosedWindow();
  }
  bool driven = false;
  const int64_t id = askWindowId(driven);
  if (!driven && end != kDrivenByOverride) {
    return rollOverLocked(windowEndOf(id));
  }
  // From now on the override alone decides: every add comes here.
  ShardTable& table = tableLocked();
  if (id == table.drivenWindowId) {
    windowEndMs_.store(kDrivenByOverride, std::memory_order_release);
    return ClosedWindow();
  }
  table.drivenWindowId = id;
  return rollOverLocked(kDrivenByOverride);
}

template <typename T>
typename StatEngine<T>::ClosedWindow StatEngine<T>::rollOverLocked(
    int64_t nextEndMs) {
  ClosedWindow closed;
  // A window without samples (none open, or its opening add not yet in)
  // leaves the last closed window, which get() reports, as it is.
  const Accumulator<T> window = takeOpenWindowLocked();
  if (window.count > 0) {
    closed = closeLocked(window, windowEndMs_.load(std::memory_order_relaxed));
  }
  windowEndMs_.store(nextEndMs, std::memory_order_release);
  return closed;
}

template <typename T>
typename StatEngine<T>::ShardTable& StatEngine<T>::tableLocked() {
  ShardTable* table = state_.table.load(std::memory_order_relaxed);
  if (table == nullptr) {
    table = new ShardTable();
    state_.table.store(table, std::memory_order_release);
  }
  return *table;
}

template <typename T>
void StatEngine<T>::addToNewOrSharedShard(int slot, T v, int64_t now) {
  if (slot == kOverflowSlot) {
    // Threads beyond kMaxThreadSlots share one shard; the mutex excludes both
    // them and the harvester, so no handshake is needed.
    std::lock_guard<WordLock> guard(mutex_);
    auto& overflow = tableLocked().shards[slot];
    auto* shard = overflow.load(std::memory_order_relaxed);
    if (shard == nullptr) {
      shard = new CacheLineShard<T>();
      overflow.store(shard, std::memory_order_release);
    }
    shard->acc.add(v, now);
    return;
  }
  ThreadShard<T>* shard = claimShard(slot, /*locked=*/false);
  shard->enter();
  shard->acc.add(v, now);
  shard->leave();
}

template <typename T>
void StatEngine<T>::addCapped(T v) {
  // torch::monitor's state machine: a window that reached maxSamples is closed
  // at once and later samples of that window are discarded; the first add of
  // a later window then closes the (empty) discarded window.
  ClosedWindow closed[2];
  {
    std::lock_guard<WordLock> guard(mutex_);
    CappedWindow& w = *state_.capped;
    const int64_t now = readClock(clock_);
    int64_t windowId = windowIdAt(now);
    // currentWindowId() is asked at boundaries of the own clock only, or on
    // every add once an override drives the windows.
    if (w.driven || windowId != w.windowId) {
      bool driven = false;
      windowId = askWindowId(driven);
      w.driven = w.driven || driven;
    }
    if ((windowId != w.windowId || w.current.count >= w.maxSamples) &&
        w.lastClosedWindowId != windowId) {
      closeCappedLocked(closed[0], windowId);
    }
    if (w.lastClosedWindowId != windowId) {
      w.current.add(v, now);
      if (w.current.count >= w.maxSamples) {
        closeCappedLocked(closed[1], windowId);
      }
    }
  }
  // Both are emitted even if the first one's handlers throw.
  callEach(closed, [this](const ClosedWindow& c) { emit(c); });
}

template <typename T>
void StatEngine<T>::closeCappedLocked(ClosedWindow& out, int64_t nextWindowId) {
  CappedWindow& w = *state_.capped;
  // With no window current there is nothing to close; closing the empty
  // window that a full one leaves (torch.monitor's rule) does reset get().
  if (w.windowId != 0) {
    out = closeLocked(w.current, windowEndOf(w.windowId));
  }
  w.current = Accumulator<T>();
  w.lastClosedWindowId = w.windowId;
  w.windowId = nextWindowId;
}

template <typename T>
Accumulator<T> StatEngine<T>::harvest(
    bool reset,
    const void* probe,
    int64_t* probeCount) const {
  // At most the first shard and one per slot (the overflow one included).
  ThreadShard<T>* live[kMaxThreadSlots + 2];
  int n = 0;
  // A shard that is claimed or created after this scan keeps its samples
  // for the next harvest.
  if (firstSlot_.load(std::memory_order_acquire) != kNoSlot) {
    live[n++] = const_cast<ThreadShard<T>*>(&firstShard_);
  }
  if (const ShardTable* table = state_.table.load(std::memory_order_acquire)) {
    for (const auto& slot : table->shards) {
      if (auto* shard = slot.load(std::memory_order_acquire)) {
        live[n++] = shard;
      }
    }
  }
  Accumulator<T> total;
  if (n == 0) {
    return total;
  }
  for (int i = 0; i < n; ++i) {
    live[i]->freeze();
  }
  heavyBarrier();
  for (int i = 0; i < n; ++i) {
    const Accumulator<T> share = live[i]->drain(reset);
    if (live[i] == probe) {
      *probeCount = share.count;
    }
    total.merge(share);
  }
  return total;
}

template <typename T>
Accumulator<T> StatEngine<T>::takeOpenWindowLocked() {
  const ShardTable* table = state_.table.load(std::memory_order_relaxed);
  TensorWindow<T>* tensors =
      table == nullptr ? nullptr : table->tensors;
  if (tensors == nullptr || tensors->count() == 0) {
    return harvest(/*reset=*/true);
  }
  int64_t lastShardCount = 0;
  const Accumulator<T> numbers =
      harvest(/*reset=*/true, tensors->lastShard(), &lastShardCount);
  return tensors->take(numbers, lastShardCount);
}

template <typename T>
ThreadShard<T>* StatEngine<T>::claimShard(int slot, bool locked) {
  int8_t unowned = kNoSlot;
  if (slot == firstSlot_.load(std::memory_order_relaxed) ||
      firstSlot_.compare_exchange_strong(
          unowned, static_cast<int8_t>(slot), std::memory_order_acq_rel)) {
    return &firstShard_;
  }
  // A later thread: a shard of its own in the table. Only the thread owning
  // `slot` ever creates that shard.
  ShardTable* table = state_.table.load(std::memory_order_acquire);
  if (table == nullptr) {
    std::unique_lock<WordLock> guard(mutex_, std::defer_lock);
    if (!locked) {
      guard.lock();
    }
    table = &tableLocked();
  }
  if (auto* own = table->shards[slot].load(std::memory_order_relaxed)) {
    return own;
  }
  auto* own = new CacheLineShard<T>();
  table->shards[slot].store(own, std::memory_order_release);
  return own;
}

template <typename T>
std::pair<const void*, int64_t> StatEngine<T>::ownShardLocked() {
  const int slot = threadSlot();
  const ThreadShard<T>* shard = slot == kOverflowSlot
      ? tableLocked().shards[slot].load(std::memory_order_relaxed)
      : claimShard(slot, /*locked=*/true);
  // Only this thread writes its shard outside mutex_, so reading it here
  // races with nothing (the overflow shard is written under mutex_ only).
  return {shard, shard == nullptr ? 0 : shard->acc.count};
}

template <typename T>
typename StatEngine<T>::ClosedWindow StatEngine<T>::closeLocked(
    const Accumulator<T>& closed,
    int64_t endMs) {
  prev_ = closed;
  return ClosedWindow{closed, closed.count > 0, endMs, std::nullopt};
}

template <typename T>
std::vector<std::pair<Aggregation, T>> StatEngine<T>::aggregatesOf(
    AggregationSet enabled,
    const Accumulator<T>& window) {
  std::vector<std::pair<Aggregation, T>> out;
  for (int i = 1; i < NUM_AGGREGATIONS; ++i) {
    const auto aggregation = static_cast<Aggregation>(i);
    if (!enabled.contains(aggregation)) {
      continue;
    }
    switch (aggregation) {
      case Aggregation::VALUE:
        out.emplace_back(aggregation, window.value);
        break;
      case Aggregation::MEAN:
        out.emplace_back(aggregation, window.mean());
        break;
      case Aggregation::COUNT:
        out.emplace_back(aggregation, T(window.count));
        break;
      case Aggregation::SUM:
        out.emplace_back(aggregation, window.sum);
        break;
      case Aggregation::MAX:
        out.emplace_back(aggregation, window.max);
        break;
      case Aggregation::MIN:
        out.emplace_back(aggregation, window.min);
        break;
      case Aggregation::NONE:
        TORCH_INTERNAL_ASSERT(false, "NONE is never an enabled aggregation");
    }
  }
  return out;
}

template <typename T>
Event StatEngine<T>::eventOfWindow(
    const std::string& name,
    AggregationSet enabled,
    const Accumulator<T>& window,
    std::optional<int64_t> step) {
  Event event;
  event.name = kStatEventName;
  event.timestamp = std::chrono::system_clock::now();
  event.step = step;
  const auto aggregates = aggregatesOf(enabled, window);
  event.data.reserve(aggregates.size() + 1);
  // The keys are built here, once per window, rather than kept in every
  // stat: memory per stat matters more than a few string copies per window.
  for (const auto& [aggregation, value] : aggregates) {
    event.data.emplace(name + "." + aggregationName(aggregation), value);
  }
  return event;
}

template <typename T>
WindowShape StatEngine<T>::windowShape() const noexcept {
  WindowShape shape;
  shape.integer = std::is_same_v<T, int64_t>;
  shape.steps = clock_ == ClockSource::STEP;
  shape.length = windowLength_;
  for (int a = 1; a < NUM_AGGREGATIONS; ++a) {
    if (aggregations_.contains(static_cast<Aggregation>(a))) {
      shape.aggregations |= uint8_t(1u << a);
    }
  }
  if (capped_) {
    shape.maxSamples = state_.capped->maxSamples;
  }
  return shape;
}

template <typename T>
std::optional<Event> StatEngine<T>::eventOf(const ClosedWindow& closed) const {
  if (!closed.emit) {
    return std::nullopt;
  }
  const std::optional<int64_t> step = closed.stamp ? closed.stamp : getStep();
  if (syncRanks_.load(std::memory_order_relaxed)) {
    // Merged on the rank sync thread, from copies: this Stat may be gone by
    // then.
    MergedEventBuilder build =
        [name = name_, enabled = aggregations_](
            const std::vector<RankShare>& shares)
        -> std::optional<Event> {
      const MergedShares<T> merged = mergeShares<T>(shares);
      if (merged.values.count == 0) {
        return std::nullopt;
      }
      Event event = eventOfWindow(name, enabled, merged.values, merged.step);
      // Keyed by the Stat, like its aggregates: one TensorBoard tag (and
      // Prometheus sample) per synced Stat, not one "ranks" shared by all.
      event.data.emplace(name + ".ranks", merged.ranks);
      return event;
    };
    const auto share = RankShare::of(closed.values, step, windowShape());
    if (postRankWindow(
            this,
            name_,
            rankWindowIndex(closed.endMs),
            share,
            std::move(build))) {
      return std::nullopt;
    }
  }
  return eventOfWindow(name_, aggregations_, closed.values, step);
}

template <typename T>
int64_t StatEngine<T>::rankWindowIndex(int64_t endMs) const noexcept {
  if (clock_ == ClockSource::STEP) {
    return endMs / windowLength_; // the same steps on every rank
  }
  return rankTimeWindowIndex(endMs, windowLength_, clock_);
}

template <typename T>
void StatEngine<T>::emit(const ClosedWindow& closed) const {
  if (auto event = eventOf(closed)) {
    dispatchEvent(*event);
  }
}

template <typename T>
std::optional<Event> StatEngine<T>::closeOpenWindow() {
  ClosedWindow closed;
  {
    std::lock_guard<WordLock> guard(mutex_);
    if (capped_) {
      closed = closeLocked(
          state_.capped->current, windowEndOf(state_.capped->windowId));
      state_.capped->current = Accumulator<T>();
    } else {
      closed = closeLocked(
          takeOpenWindowLocked(), windowEndMs_.load(std::memory_order_relaxed));
    }
  }
  // At exit or destruction the window lands one step after the last step
  // set, never on the step of the window closed at that step. A step window
  // the step has already ended keeps the current step, the one that ended
  // it, which a later add() would have given it (as does a window an
  // override of currentWindowId() drives).
  const bool stepEnded =
      clock_ == ClockSource::STEP && readClock(clock_) >= closed.endMs;
  if (closed.endMs != kDrivenByOverride && !stepEnded) {
    closed.stamp = stepOfEarlyClose();
  }
  return eventOf(closed);
}

template <typename T>
std::vector<Event> StatEngine<T>::closeEndedWindow(int64_t& openEndMs) {
  ClosedWindow closed;
  {
    std::lock_guard<WordLock> guard(mutex_);
    // This stat's own clock, as add() reads it: a later add() never sees a
    // time before the window the timer closed.
    const int64_t now = readClock(clock_);
    if (capped_) {
      CappedWindow& w = *state_.capped;
      // A window an override of currentWindowId() drives ends when its
      // answer changes, which only add() asks.
      if (!w.driven && w.current.count > 0 && windowIdAt(now) != w.windowId) {
        closeCappedLocked(closed, /*nextWindowId=*/0);
      }
      openEndMs = !w.driven && w.current.count > 0
          ? windowEndOf(w.windowId)
          : 0;
    } else {
      const int64_t end = windowEndMs_.load(std::memory_order_relaxed);
      if (end != 0 && end != kDrivenByOverride && now >= end) {
        closed = rollOverLocked(/*nextEndMs=*/0);
      }
      const int64_t open = windowEndMs_.load(std::memory_order_relaxed);
      openEndMs = open == kDrivenByOverride ? 0 : open;
    }
  }
  std::vector<Event> events;
  if (auto event = eventOf(closed)) {
    events.push_back(std::move(*event));
  }
  return events;
}

template <typename T>
std::optional<Event> StatEngine<T>::closeWindowLeftBehind(
    int64_t step,
    std::optional<int64_t> stamp) {
  // A capped Stat compares window ids at every add, which sees a step that
  // went back by itself; time windows cannot go back.
  if (clock_ != ClockSource::STEP || capped_) {
    return std::nullopt;
  }
  ClosedWindow closed;
  {
    std::lock_guard<WordLock> guard(mutex_);
    const int64_t end = windowEndMs_.load(std::memory_order_relaxed);
    if (end == 0 || end == kDrivenByOverride) {
      return std::nullopt; // no window open, or an override decides
    }
    // The last window of the step range may be shorter than the others.
    const int64_t partial = end % windowLength_;
    const int64_t start = end -
        (end == kLastWindowEnd && partial != 0 ? partial : windowLength_);
    if (step >= start) {
      return std::nullopt; // ahead: add() closes it as usual
    }
    closed = rollOverLocked(/*nextEndMs=*/0);
  }
  closed.stamp = stamp;
  return eventOf(closed);
}

template <typename T>
void StatEngine<T>::resetAfterForkInChild() {
  // Only the thread that called fork() exists here, and it holds mutex_
  // (lockBeforeFork). A shard whose owner was inside add() stays marked busy
  // forever (a harvest would spin on it) and may hold a torn update; the
  // samples of the open window are the parent's to log. So every shard and
  // the capped window start empty; the last closed window (get()) stays.
  const auto reset = [](ThreadShard<T>& shard) {
    shard.busy.store(0, std::memory_order_relaxed);
    shard.frozen.store(0, std::memory_order_relaxed);
    shard.acc = Accumulator<T>();
  };
  if (capped_) {
    state_.capped->current = Accumulator<T>();
  } else {
    reset(firstShard_);
    if (ShardTable* table = state_.table.load(std::memory_order_relaxed)) {
      for (auto& slot : table->shards) {
        if (auto* shard = slot.load(std::memory_order_relaxed)) {
          reset(*shard);
        }
      }
      // The device samples are the parent's too, and a forked child cannot
      // use (or free) the parent's device memory: the window is dropped
      // unfreed.
      table->tensors = nullptr;
    }
  }
  mutex_.unlock();
}

template <typename T>
void StatEngine<T>::addOnDevice(const at::Tensor& values) {
  const int64_t now = readClock(clock_);
  ClosedWindow closed;
  {
    std::lock_guard<WordLock> guard(mutex_);
    closed = closeIfEndedLocked(now);
    ShardTable& table = tableLocked();
    if (table.tensors == nullptr) {
      table.tensors = new TensorWindow<T>();
    }
    const auto [shard, shardCount] = ownShardLocked();
    table.tensors->add(values, now, shard, shardCount);
  }
  emit(closed);
}

template <typename T>
int64_t StatEngine<T>::openCount() const {
  std::lock_guard<WordLock> guard(mutex_);
  if (capped_) {
    return state_.capped->current.count;
  }
  const ShardTable* table = state_.table.load(std::memory_order_relaxed);
  const int64_t onDevices =
      table != nullptr && table->tensors != nullptr ? table->tensors->count()
                                                    : 0;
  return harvest(/*reset=*/false).count + onDevices;
}

template <typename T>
std::vector<std::pair<Aggregation, T>> StatEngine<T>::lastAggregates() const {
  std::lock_guard<WordLock> guard(mutex_);
  return aggregatesOf(aggregations_, prev_);
}

template <typename T>
void StatEngine<T>::joinRankSync(std::shared_ptr<const RankGroup> group) {
  enableRankSync(this, std::move(group), name_);
  syncRanks_.store(true, std::memory_order_relaxed);
}

template <typename T>
void StatEngine<T>::leaveRankSync() noexcept {
  disableRankSync(this);
}

template class StatEngine<double>;
template class StatEngine<int64_t>;

} // namespace torch_monitor::detail
