#pragma once

#include <atomic>
#include <cstdint>

#include <torch_monitor/detail/accumulator.h>
#include <torch_monitor/export.h>

// The lock-free per-thread part of Stat::add.
//
// Each thread that adds to a Stat writes only to its own shard, so two threads
// never share a written cache line on the hot path. A window is closed by
// "harvesting" every shard. The owner and the harvester meet in an asymmetric
// Dekker handshake: the owner publishes `busy` and then reads `frozen`; the
// harvester publishes `frozen` and then reads `busy`. The owner's side needs
// no fence of its own because the harvester issues membarrier(2), which makes
// every running thread of the process execute a full barrier; when the kernel
// lacks it, both sides use ordinary seq_cst fences instead (correct, ~5 ns
// slower per add).

namespace torch_monitor::detail {

// Shards per Stat for threads with a slot of their own; threads beyond this
// many live ones share one overflow shard behind a mutex.
inline constexpr int kMaxThreadSlots = 64;
inline constexpr int kOverflowSlot = kMaxThreadSlots;

// 1 + this thread's slot, or 0 before its first add. initial-exec TLS avoids
// a __tls_get_addr call on every add.
TORCH_MONITOR_API extern __thread int threadSlotPlusOne
    __attribute__((tls_model("initial-exec")));

// Assigns the calling thread a slot (freed again when the thread exits).
TORCH_MONITOR_API int assignThreadSlot();

inline int threadSlot() {
  const int slot = threadSlotPlusOne;
  return __builtin_expect(slot != 0, 1) ? slot - 1 : assignThreadSlot();
}

// True once membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) is registered; set
// once by ensureAsymmetricBarrier() before the first Stat exists.
TORCH_MONITOR_API extern std::atomic<bool> heavyBarrierAvailable;
TORCH_MONITOR_API void ensureAsymmetricBarrier();
// The harvester's side of the handshake.
TORCH_MONITOR_API void heavyBarrier();

// The owner's side: a compiler barrier when the harvester can use membarrier.
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

// One thread's share of a Stat's open window. The first thread that adds to
// a Stat keeps its shard inside the Stat (which surrounds it with fields that
// the hot path never writes); later threads get a CacheLineShard each.
// Thread safety: enter()/leave() on the owning thread and freeze()/drain()
// on the harvester (under the Stat's mutex) may run concurrently: that is
// the handshake above; nothing else may.
template <typename T>
struct ThreadShard {
  std::atomic<uint32_t> busy{0}; // written by the owner only
  std::atomic<uint32_t> frozen{0}; // written by the harvester only
  Accumulator<T> acc;

  // Owner: brackets an update of `acc`.
  void enter() noexcept {
    busy.store(1, std::memory_order_relaxed);
    lightBarrier();
    if (__builtin_expect(frozen.load(std::memory_order_acquire) != 0, 0)) {
      waitWhileFrozen();
    }
  }
  void leave() noexcept {
    busy.store(0, std::memory_order_release);
  }

  // Harvester, step 1 for every shard, then heavyBarrier(), then step 2.
  void freeze() noexcept {
    frozen.store(1, std::memory_order_relaxed);
  }
  // Step 2: waits for the owner to leave, copies (and optionally resets) the
  // share, and lets the owner in again.
  Accumulator<T> drain(bool reset) noexcept {
    while (busy.load(std::memory_order_acquire) != 0) {
      cpuRelax();
    }
    Accumulator<T> out = acc;
    if (reset) {
      acc = Accumulator<T>();
    }
    frozen.store(0, std::memory_order_release);
    return out;
  }

 private:
  void waitWhileFrozen() noexcept {
    do {
      busy.store(0, std::memory_order_release);
      while (frozen.load(std::memory_order_acquire) != 0) {
        cpuRelax();
      }
      busy.store(1, std::memory_order_relaxed);
      lightBarrier();
    } while (frozen.load(std::memory_order_acquire) != 0);
  }
};

// A shard allocated on its own: a cache line of its own, so two threads never
// write the same line.
template <typename T>
struct alignas(64) CacheLineShard : ThreadShard<T> {};

} // namespace torch_monitor::detail
