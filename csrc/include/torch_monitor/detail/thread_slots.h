#pragma once

#include <atomic>

#include <torch_monitor/export.h>

// What the library's two lock-free handshakes share (a Stat's shards,
// engine/thread_shard.h, and the handler registry's reader marks,
// event_handler.cpp): a small slot number per thread, so that each thread
// writes only to its own cache line, and the asymmetric barrier that lets
// the reader's side of the handshake skip its fence.
//
// Both are asymmetric Dekker handshakes: the frequent side publishes a flag
// and then reads the other's; the rare side publishes its own flag and then
// reads. The frequent side needs no fence of its own because the rare side
// issues membarrier(2), which makes every running thread of the process
// execute a full barrier; when the kernel lacks it, both sides use ordinary
// seq_cst fences instead (correct, ~5 ns slower per add).

namespace torch_monitor::detail {

// Threads with a slot of their own at most (per process); threads beyond
// this many live ones share the overflow slot, behind a mutex.
inline constexpr int kMaxThreadSlots = 64;
inline constexpr int kOverflowSlot = kMaxThreadSlots;

// 1 + this thread's slot, or 0 before its first use. initial-exec TLS avoids
// a __tls_get_addr call on every add.
TORCH_MONITOR_API extern __thread int threadSlotPlusOne
    __attribute__((tls_model("initial-exec")));

// Assigns the calling thread a slot (freed again when the thread exits).
// Thread safety: any thread; the slot table has a mutex of its own.
TORCH_MONITOR_API int assignThreadSlot();

inline int threadSlot() {
  const int slot = threadSlotPlusOne;
  return __builtin_expect(slot != 0, 1) ? slot - 1 : assignThreadSlot();
}

// True once membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) is registered; set
// once by ensureAsymmetricBarrier() before the first Stat exists.
TORCH_MONITOR_API extern std::atomic<bool> heavyBarrierAvailable;
TORCH_MONITOR_API void ensureAsymmetricBarrier();
// The rare side of the handshake.
TORCH_MONITOR_API void heavyBarrier();

// The frequent side: a compiler barrier when the rare side can use
// membarrier.
inline void lightBarrier() noexcept {
  if (__builtin_expect(
          heavyBarrierAvailable.load(std::memory_order_relaxed), 1)) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

inline void cpuRelax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

} // namespace torch_monitor::detail
