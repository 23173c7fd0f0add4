#pragma once

// The one helper that keeps the library's locks usable in a child of fork().
// A child has only the thread that called fork(); a lock that another thread
// held at that instant would stay held in the child forever. Two ways to
// avoid it, by how long a lock lives:
//  - ForkSafeLocks enrols the locks of a long-lived object (a sink, a
//    registry): fork() takes or resets them (ForkStage::kForkSafeLocks);
//  - ForkSafeMutex needs no enrolment (a reducer or a monitor, built by the
//    thousand, would pay for one): it is rebuilt at its first use in a child.
// Not part of the stable API.

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <vector>

#include <torch_monitor/detail/lifecycle.h>
#include <torch_monitor/export.h>

namespace torch_monitor::detail {

// How fork() treats an enrolled lock.
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
  // or guards data the child starts afresh: fork() never waits for it, and
  // the child gets it back unlocked (re-initialised).
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

// A recursive mutex that a forked child can always take: it remembers the
// fork generation (lifecycle.h) it was made in, and the first lock in a
// newer generation builds it anew (the old one may be held by a thread that
// does not exist there). Recursive, because a reducer's public methods call
// each other. Lock it through BlockingLock (blocking_lock.h).
// Thread safety: current() from any thread; lock what it returns as a mutex.
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

} // namespace torch_monitor::detail
