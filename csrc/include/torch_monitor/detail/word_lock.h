#pragma once

#include <atomic>
#include <cstdint>

namespace torch_monitor::detail {

// A mutex in one 32-bit word, for an object made by the hundred thousand (a
// Stat): std::mutex takes 40 bytes, this 4, which is what brings a Python
// Stat back under 1.4x torch.monitor's (docs/performance.md, "Memory per
// stat"). A futex(2) lock (Drepper, "Futexes Are Tricky", mutex 2): the word
// is 0 when free, 1 when held, 2 when held with possible waiters; only the
// contended paths make a system call. Built on std::atomic, so
// ThreadSanitizer sees the order it gives like any other lock's. Neither
// recursive nor fair. A forked child may unlock a lock its forking thread
// took (Stat's fork hooks do).
// Thread safety: lock, try_lock and unlock from any thread, as std::mutex.
class WordLock {
 public:
  WordLock() = default;
  WordLock(const WordLock&) = delete;
  WordLock& operator=(const WordLock&) = delete;

  void lock() noexcept {
    uint32_t free = 0;
    if (__builtin_expect(
            !word_.compare_exchange_strong(
                free, 1, std::memory_order_acquire, std::memory_order_relaxed),
            0)) {
      lockContended();
    }
  }
  bool try_lock() noexcept {
    uint32_t free = 0;
    return word_.compare_exchange_strong(
        free, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() noexcept {
    if (__builtin_expect(word_.exchange(0, std::memory_order_release) == 2, 0)) {
      wakeOne();
    }
  }

 private:
  void lockContended() noexcept;
  void wakeOne() noexcept;

  std::atomic<uint32_t> word_{0};
};

static_assert(sizeof(WordLock) == 4, "a WordLock is one futex word");

} // namespace torch_monitor::detail
