#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>
#include <torch_monitor/sinks/sink.h>

namespace torch_monitor::sinks {

// Keeps copies of the last `capacity` events in a ring buffer, for tests and
// notebooks: the oldest is overwritten (and counted in dropped()) when full.
// Thread safety: no concurrent call to any API of this type causes a data
// race; handle() may run on many threads at once.
class TORCH_MONITOR_API MemoryHandler final : public Sink {
 public:
  static constexpr size_t kDefaultCapacity = 10000;

  explicit MemoryHandler(
      size_t capacity = kDefaultCapacity,
      std::vector<std::string> eventNames = {});
  ~MemoryHandler() override;

  void handle(const Event& event) override;

  // A copy of the events held, oldest first.
  std::vector<Event> events() const;
  void clear();
  size_t size() const;
  size_t capacity() const noexcept {
    return capacity_;
  }
  const std::vector<std::string>& eventNames() const noexcept {
    return filter_.names();
  }
  // Events overwritten because the buffer was full.
  int64_t dropped() const override;

 private:
  const size_t capacity_;
  const EventNameFilter filter_;
  mutable std::mutex mutex_;
  std::vector<Event> ring_; // grows to capacity_, then wraps
  size_t next_ = 0; // slot the next event goes to, once full
  int64_t overwritten_ = 0;
  // Held across fork(): a forked child finds the ring whole and unlocked.
  torch_monitor::detail::ForkSafeLocks forkLocks_{
      torch_monitor::detail::ForkLockMode::kInner, {&mutex_}};
};

} // namespace torch_monitor::sinks
