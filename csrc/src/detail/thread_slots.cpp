#include <torch_monitor/detail/thread_slots.h>

#include <bitset>
#include <cstdint>
#include <cstdlib>
#include <mutex>

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <torch_monitor/detail/lifecycle.h>

namespace torch_monitor::detail {

__thread int threadSlotPlusOne __attribute__((tls_model("initial-exec"))) = 0;
std::atomic<bool> heavyBarrierAvailable{false};

namespace {

struct SlotTable {
  std::mutex mutex;
  std::bitset<kMaxThreadSlots> used;
  pthread_key_t exitKey{};
};

// Never destroyed: threads may exit during static destruction.
SlotTable& slotTable() {
  static SlotTable* table = [] {
    auto* t = new SlotTable();
    // Frees a thread's slot when it exits, so a program that keeps creating
    // threads does not run out of slots.
    pthread_key_create(&t->exitKey, [](void* value) {
      SlotTable& table = slotTable();
      std::lock_guard<std::mutex> guard(table.mutex);
      table.used.reset(static_cast<size_t>(reinterpret_cast<intptr_t>(value) - 1));
      threadSlotPlusOne = 0;
    });
    // In a forked child only the forking thread exists: the table's mutex
    // must not stay held by a thread that was assigning or freeing a slot,
    // and the other threads' slots are free again (their shards are reset
    // by the Stats' own fork hooks).
    static constexpr ForkHooks kHooks{
        [] { slotTable().mutex.lock(); },
        [] { slotTable().mutex.unlock(); },
        [] {
          SlotTable& table = slotTable();
          table.used.reset();
          const int own = threadSlotPlusOne - 1;
          if (own >= 0 && own < kMaxThreadSlots) {
            table.used.set(own);
          }
          table.mutex.unlock();
        }};
    onFork(ForkStage::kThreadSlots, kHooks);
    return t;
  }();
  return *table;
}

// Built when the library loads, not by the first thread that adds: a fork
// while another thread was still inside the lazy initialisation above left
// the child waiting forever on the initialisation guard (seen as a hung
// child in StatFork.ChildCanUseEveryStatWhileOtherThreadsAddAndLog).
const bool kSlotTableBuiltAtLoad = (slotTable(), true);

long membarrier(int cmd) {
  return syscall(__NR_membarrier, cmd, 0, 0);
}

// Registration is per process image; a forked child registers again (with
// one thread, no add can be in flight in it).
bool registerMembarrier() {
  if (std::getenv("TORCH_MONITOR_NO_MEMBARRIER") != nullptr) {
    return false;
  }
  const long supported = membarrier(MEMBARRIER_CMD_QUERY);
  return supported > 0 &&
      (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
      membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

} // namespace

int assignThreadSlot() {
  SlotTable& table = slotTable();
  std::lock_guard<std::mutex> guard(table.mutex);
  int slot = kOverflowSlot;
  for (int i = 0; i < kMaxThreadSlots; ++i) {
    if (!table.used.test(i)) {
      slot = i;
      table.used.set(i);
      pthread_setspecific(
          table.exitKey, reinterpret_cast<void*>(intptr_t(i) + 1));
      break;
    }
  }
  threadSlotPlusOne = slot + 1;
  return slot;
}

void ensureAsymmetricBarrier() {
  static std::once_flag once;
  std::call_once(once, [] {
    heavyBarrierAvailable.store(registerMembarrier(), std::memory_order_relaxed);
    static constexpr ForkHooks kHooks{nullptr, nullptr, [] {
      heavyBarrierAvailable.store(
          registerMembarrier(), std::memory_order_relaxed);
    }};
    onFork(ForkStage::kAsymmetricBarrier, kHooks);
  });
}

void heavyBarrier() {
  if (heavyBarrierAvailable.load(std::memory_order_relaxed) &&
      membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) {
    return;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

} // namespace torch_monitor::detail
