#include <torch_monitor/stat.h>

#include <cmath>
#include <exception>

#include <c10/util/Exception.h>

#include <torch_monitor/detail/text.h>
#include <torch_monitor/event_handler.h>

namespace torch_monitor {

template <typename T>
Stat<T>::Stat(
    std::string name,
    std::vector<Aggregation> aggregations,
    std::chrono::milliseconds windowSize,
    int64_t maxSamples)
    : name_(std::move(name)),
      aggregationList_(std::move(aggregations)),
      aggregations_(aggregationList_),
      windowMs_(windowSize.count()),
      maxSamples_(maxSamples),
      capped_(maxSamples != kUnlimitedSamples),
      clock_(
          coarseClockIsPreciseEnough(windowMs_) ? ClockSource::COARSE
                                                : ClockSource::PRECISE) {
  detail::checkText(name_, "Stat name");
  // torch.monitor divides by the window (SIGFPE at the first add) when it is
  // under 1 ms and silently treats maxSamples < 1 as 1.
  TORCH_CHECK_VALUE(
      windowMs_ >= 1,
      "Stat '",
      name_,
      "': window_size must be at least 1 millisecond (it is kept with "
      "millisecond precision), got ",
      windowMs_,
      " ms");
  TORCH_CHECK_VALUE(
      windowMs_ <= kMaxWindowMs,
      "Stat '",
      name_,
      "': window_size must be at most ",
      kMaxWindowMs,
      " ms (datetime.timedelta.max, about 2.7 million years), got ",
      windowMs_,
      " ms");
  TORCH_CHECK_VALUE(
      maxSamples_ >= 1,
      "Stat '",
      name_,
      "': max_samples must be at least 1, got ",
      maxSamples_);
  for (Aggregation a : aggregations_.members()) {
    eventKeys_.emplace_back(a, name_ + "." + aggregationName(a));
  }
  detail::ensureAsymmetricBarrier();
  track(); // last: the registry may call in from now on
}

template <typename T>
Stat<T>::~Stat() {
  untrack(); // first: closeAllStats() and fork() no longer see this Stat
  try {
    if (auto event = closeOpenWindow()) {
      detail::dispatchEvent(*event);
    }
  } catch (const std::exception& e) {
    TORCH_WARN(
        "torch_monitor: an event handler failed while Stat '",
        name_,
        "' logged its last window on destruction: ",
        e.what());
  } catch (...) {
    TORCH_WARN(
        "torch_monitor: an event handler failed while Stat '",
        name_,
        "' logged its last window on destruction");
  }
  for (auto& shard : shards_) {
    delete shard.load(std::memory_order_relaxed);
  }
}

template <typename T>
void Stat<T>::addAfterRollOver(T v, int64_t now) {
  ClosedWindow closed;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    // Another thread may have closed the window since we read the clock.
    if (now >= windowEndMs_.load(std::memory_order_relaxed)) {
      closed = closeLocked(harvest(/*reset=*/true));
      windowEndMs_.store(windowIdAt(now) * windowMs_, std::memory_order_release);
    }
  }
  addSharded(v, now);
  emit(closed);
}

template <typename T>
void Stat<T>::addToNewOrSharedShard(int slot, T v, int64_t now) {
  if (slot == detail::kOverflowSlot) {
    // Threads beyond kMaxThreadSlots share one shard; the mutex excludes both
    // them and the harvester, so no handshake is needed.
    std::lock_guard<std::mutex> guard(mutex_);
    auto* shard = shards_[slot].load(std::memory_order_relaxed);
    if (shard == nullptr) {
      shard = new detail::ThreadShard<T>();
      shards_[slot].store(shard, std::memory_order_release);
    }
    shard->acc.add(v, now);
    return;
  }
  // Only the thread owning `slot` ever creates its shard.
  auto* shard = new detail::ThreadShard<T>();
  shards_[slot].store(shard, std::memory_order_release);
  shard->enter();
  shard->acc.add(v, now);
  shard->leave();
}

template <typename T>
void Stat<T>::addCapped(T v) {
  // torch::monitor's state machine: a window that reached maxSamples is closed
  // at once and later samples of that window are discarded; the first add of
  // a later window then closes the (empty) discarded window.
  ClosedWindow closed[2];
  {
    std::lock_guard<std::mutex> guard(mutex_);
    const int64_t now = monotonicMs(clock_);
    const int64_t windowId = windowIdAt(now);
    const auto closeCurrent = [&](ClosedWindow& out) {
      out = closeLocked(current_);
      current_ = detail::Accumulator<T>();
      lastClosedWindowId_ = windowId_;
      windowId_ = windowId;
    };
    if ((windowId != windowId_ || current_.count >= maxSamples_) &&
        lastClosedWindowId_ != windowId) {
      closeCurrent(closed[0]);
    }
    if (lastClosedWindowId_ != windowId) {
      current_.add(v, now);
      if (current_.count >= maxSamples_) {
        closeCurrent(closed[1]);
      }
    }
  }
  // Both are emitted even if the first one's handlers throw.
  std::exception_ptr first;
  for (const ClosedWindow& c : closed) {
    try {
      emit(c);
    } catch (...) {
      if (!first) {
        first = std::current_exception();
      }
    }
  }
  if (first) {
    std::rethrow_exception(first);
  }
}

template <typename T>
detail::Accumulator<T> Stat<T>::harvest(bool reset) const {
  detail::ThreadShard<T>* live[detail::kMaxThreadSlots + 1];
  int n = 0;
  for (auto& slot : shards_) {
    if (auto* shard = slot.load(std::memory_order_acquire)) {
      shard->freeze();
      live[n++] = shard;
    }
  }
  detail::Accumulator<T> total;
  if (n == 0) {
    return total;
  }
  detail::heavyBarrier();
  for (int i = 0; i < n; ++i) {
    total.merge(live[i]->drain(reset));
  }
  return total;
}

template <typename T>
typename Stat<T>::ClosedWindow Stat<T>::closeLocked(
    const detail::Accumulator<T>& closed) {
  prev_ = closed;
  return ClosedWindow{closed, closed.count > 0};
}

template <typename T>
std::vector<std::pair<Aggregation, T>> Stat<T>::aggregatesOf(
    const detail::Accumulator<T>& window) const {
  std::vector<std::pair<Aggregation, T>> out;
  out.reserve(eventKeys_.size());
  for (const auto& entry : eventKeys_) {
    const Aggregation aggregation = entry.first;
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
std::optional<Event> Stat<T>::eventOf(const ClosedWindow& closed) const {
  if (!closed.emit) {
    return std::nullopt;
  }
  Event event;
  event.name = kStatEventName;
  event.timestamp = std::chrono::system_clock::now();
  const auto aggregates = aggregatesOf(closed.values);
  event.data.reserve(aggregates.size());
  for (size_t i = 0; i < aggregates.size(); ++i) {
    event.data.emplace(eventKeys_[i].second, aggregates[i].second);
  }
  return event;
}

template <typename T>
void Stat<T>::emit(const ClosedWindow& closed) const {
  if (auto event = eventOf(closed)) {
    detail::dispatchEvent(*event);
  }
}

template <typename T>
std::optional<Event> Stat<T>::closeOpenWindow() {
  ClosedWindow closed;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (capped_) {
      closed = closeLocked(current_);
      current_ = detail::Accumulator<T>();
    } else {
      closed = closeLocked(harvest(/*reset=*/true));
    }
  }
  return eventOf(closed);
}

template <typename T>
void Stat<T>::resetAfterForkInChild() {
  // Only the thread that called fork() exists here, and it holds mutex_
  // (lockBeforeFork). A shard whose owner was inside add() stays marked busy
  // forever (a harvest would spin on it) and may hold a torn update; the
  // samples of the open window are the parent's to log. So every shard and
  // the capped window start empty; the last closed window (get()) stays.
  for (auto& slot : shards_) {
    if (auto* shard = slot.load(std::memory_order_relaxed)) {
      shard->busy.store(0, std::memory_order_relaxed);
      shard->frozen.store(0, std::memory_order_relaxed);
      shard->acc = detail::Accumulator<T>();
    }
  }
  current_ = detail::Accumulator<T>();
  mutex_.unlock();
}

template <typename T>
int64_t Stat<T>::count() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return capped_ ? current_.count : harvest(/*reset=*/false).count;
}

template <typename T>
std::unordered_map<Aggregation, T> Stat<T>::get() const {
  std::lock_guard<std::mutex> guard(mutex_);
  const auto aggregates = aggregatesOf(prev_);
  return {aggregates.begin(), aggregates.end()};
}

std::chrono::milliseconds windowFromSeconds(double seconds) {
  TORCH_CHECK_VALUE(
      std::isfinite(seconds) && seconds >= 0,
      "window_size must be a finite, non-negative number of seconds, got ",
      seconds);
  // Checked before the conversion, which is undefined for values beyond
  // int64. (Rounding may let through a value a few ms above the limit; the
  // Stat constructor rejects it exactly.)
  TORCH_CHECK_VALUE(
      seconds * 1000.0 <= double(Stat<double>::kMaxWindowMs),
      "window_size must be at most ",
      Stat<double>::kMaxWindowMs / 1000,
      " s (datetime.timedelta.max, about 2.7 million years), got ",
      seconds,
      " s");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

template class Stat<double>;
template class Stat<int64_t>;

} // namespace torch_monitor
