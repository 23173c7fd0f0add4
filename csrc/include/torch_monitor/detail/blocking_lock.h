#pragma once

#include <mutex>

#include <torch_monitor/detail/fork_safe_locks.h>
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

// A scoped lock of a ForkSafeMutex (fork_safe_locks.h): try_lock first (the
// uncontended case), else the installed wait. Thread safety: one guard
// belongs to the thread that created it.
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
