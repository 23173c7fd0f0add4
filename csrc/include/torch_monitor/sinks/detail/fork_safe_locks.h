#pragma once

// Makes the sinks' locks survive fork(). Not part of the stable API.

#include <initializer_list>
#include <mutex>
#include <vector>

#include <torch_monitor/export.h>

namespace torch_monitor::sinks::detail {

// How fork() treats a lock (pthread_atfork handlers installed on first use).
// A child of fork() has only the thread that forked; a lock another thread
// held at that instant would stay held forever in the child.
enum class ForkLockMode {
  // Guards data the child may read: the forking thread takes the lock just
  // before fork() and releases it just after, in parent and child, so the
  // child finds the data consistent and the lock free. Held only briefly,
  // and never while another kInner lock is taken.
  kInner,
  // Like kInner, but may be held while kInner locks are taken (a list whose
  // members are visited under it): taken before every kInner lock.
  kOuter,
  // Serialises slow or blocking work (a write to a stalled console, a join)
  // and guards no data the child needs: fork() never waits for it, and the
  // child gets it back unlocked (re-initialised).
  kResetInChild,
};

// Enrols some locks of one object for its lifetime. Declare it after the
// mutexes it names (constructed after them, destroyed before them), and
// never construct or destroy one while holding a kInner or kOuter lock.
// Thread safety: construction and destruction may race with each other and
// with fork() on any thread.
class TORCH_MONITOR_API ForkSafeLocks {
 public:
  ForkSafeLocks(ForkLockMode mode, std::initializer_list<std::mutex*> locks);
  ~ForkSafeLocks();
  ForkSafeLocks(const ForkSafeLocks&) = delete;
  ForkSafeLocks& operator=(const ForkSafeLocks&) = delete;

  ForkLockMode mode() const noexcept {
    return mode_;
  }
  const std::vector<std::mutex*>& locks() const noexcept {
    return locks_;
  }

 private:
  const ForkLockMode mode_;
  const std::vector<std::mutex*> locks_;
};

} // namespace torch_monitor::sinks::detail
