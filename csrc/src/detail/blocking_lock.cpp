#include <torch_monitor/detail/blocking_lock.h>

#include <pthread.h>

#include <new>

namespace torch_monitor::detail {
namespace {

void blockPlainly(std::recursive_mutex& mutex) {
  mutex.lock();
}

std::atomic<BlockingWait> gWait{&blockPlainly};

std::atomic<uint64_t> gForkGeneration{0};

// Serialises renewals: two threads of a child may both find the same mutex
// stale. Itself a plain global, reset in the child before anyone can use it.
std::mutex gRenewMutex;

void afterForkInChild() {
  new (&gRenewMutex) std::mutex();
  gForkGeneration.fetch_add(1, std::memory_order_relaxed);
}

// Registered once, when the library is loaded.
const bool gAtForkRegistered = [] {
  return pthread_atfork(nullptr, nullptr, &afterForkInChild) == 0;
}();

} // namespace

void setBlockingWait(BlockingWait wait) noexcept {
  gWait.store(wait != nullptr ? wait : &blockPlainly, std::memory_order_release);
}

BlockingWait blockingWait() noexcept {
  return gWait.load(std::memory_order_acquire);
}

uint64_t forkGeneration() noexcept {
  return gForkGeneration.load(std::memory_order_relaxed);
}

void ForkSafeMutex::renew() noexcept {
  std::lock_guard<std::mutex> guard(gRenewMutex);
  const uint64_t now = forkGeneration();
  if (generation_.load(std::memory_order_relaxed) != now) {
    // The old mutex may be locked by a thread that does not exist in this
    // process; nobody else can be using it yet (we are the first here).
    new (&mutex_) std::recursive_mutex();
    generation_.store(now, std::memory_order_release);
  }
}

} // namespace torch_monitor::detail
