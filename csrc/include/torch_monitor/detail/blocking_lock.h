#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include <torch_monitor/export.h>

namespace torch_monitor::detail {

// How a thread waits for a contended lock of a monitor or reducer. The
// default blocks. An embedder that holds a lock of its own while calling us
// (the Python binding: the GIL) installs a wait that releases it meanwhile:
// the holder of our lock may need that very lock to finish (a reducer's
// Python criterion, a monitor's Python map_), and waiting while holding it
// would deadlock both threads.
using BlockingWait = void (*)(std::recursive_mutex& mutex);

// Installs `wait` (nullptr restores the default); the Python binding calls
// this once at import.
TORCH_MONITOR_API void setBlockingWait(BlockingWait wait) noexcept;
TORCH_MONITOR_API BlockingWait blockingWait() noexcept;

// Incremented in the child after every fork() (a pthread_atfork handler).
TORCH_MONITOR_API uint64_t forkGeneration() noexcept;

// A recursive mutex that a forked child can always take. fork() copies a
// mutex in whatever state it was, and a mutex that another thread of the
// parent held stays locked forever in the child (that thread does not exist
// there). Registering every reducer with pthread_atfork would cost a global
// registry; instead each mutex remembers the fork generation it was made in,
// and the first lock in a newer generation builds it anew. Recursive,
// because a reducer's public methods call each other.
// Thread safety: lock()/unlock() from any thread, as a mutex.
class TORCH_MONITOR_API ForkSafeMutex {
 public:
  ForkSafeMutex() noexcept : generation_(forkGeneration()) {}
  ForkSafeMutex(const ForkSafeMutex&) = delete;
  ForkSafeMutex& operator=(const ForkSafeMutex&) = delete;

  // The mutex to lock now: rebuilt first if a fork happened since it was
  // made (one relaxed load and a compare otherwise).
  std::recursive_mutex& current() noexcept {
    if (generation_.load(std::memory_order_acquire) != forkGeneration()) {
      renew();
    }
    return mutex_;
  }

 private:
  void renew() noexcept;

  std::recursive_mutex mutex_;
  std::atomic<uint64_t> generation_;
};

// A scoped lock: try_lock first (the uncontended case), else the installed
// wait. Thread safety: one guard belongs to the thread that created it.
class BlockingLock {
 public:
  explicit BlockingLock(ForkSafeMutex& mutex) : mutex_(mutex.current()) {
    if (!mutex_.try_lock()) {
      blockingWait()(mutex_);
    }
  }
  ~BlockingLock() {
    mutex_.unlock();
  }
  BlockingLock(const BlockingLock&) = delete;
  BlockingLock& operator=(const BlockingLock&) = delete;

 private:
  std::recursive_mutex& mutex_;
};

} // namespace torch_monitor::detail
