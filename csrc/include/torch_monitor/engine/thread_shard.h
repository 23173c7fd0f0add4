#pragma once

#include <atomic>
#include <cstdint>

#include <torch_monitor/detail/thread_slots.h>
#include <torch_monitor/engine/accumulator.h>

// The lock-free per-thread part of Stat::add.
//
// Each thread that adds to a Stat writes only to its own shard (one per
// thread slot, detail/thread_slots.h), so two threads never share a written
// cache line on the hot path. A window is closed by "harvesting" every
// shard. The owner and the harvester meet in the asymmetric Dekker
// handshake of detail/thread_slots.h: the owner publishes `busy` and then
// reads `frozen`; the harvester publishes `frozen`, issues heavyBarrier()
// and then reads `busy`.

namespace torch_monitor::detail {

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
// write the same line. Thread safety: as ThreadShard.
template <typename T>
struct alignas(64) CacheLineShard : ThreadShard<T> {};

} // namespace torch_monitor::detail
