#include <torch_monitor/detail/word_lock.h>

#include <climits>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace torch_monitor::detail {
namespace {

static_assert(
    std::atomic<uint32_t>::is_always_lock_free &&
        sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
    "futex(2) needs the atomic to be the plain 32-bit word");

long futex(std::atomic<uint32_t>& word, int op, uint32_t value) noexcept {
  return syscall(
      SYS_futex, reinterpret_cast<uint32_t*>(&word), op, value, nullptr, nullptr, 0);
}

} // namespace

void WordLock::lockContended() noexcept {
  // Mark the word contended (2) whenever we may sleep on it, so that the
  // holder's unlock wakes someone; we own the lock once the exchange finds
  // it free (0).
  while (word_.exchange(2, std::memory_order_acquire) != 0) {
    // Returns at once if the word is no longer 2 (EAGAIN), on a wake, or
    // on a signal (EINTR): each case retries.
    futex(word_, FUTEX_WAIT_PRIVATE, 2);
  }
}

void WordLock::wakeOne() noexcept {
  futex(word_, FUTEX_WAKE_PRIVATE, 1);
}

} // namespace torch_monitor::detail
