#include <torch_monitor/detail/blocking_lock.h>

#include <atomic>

namespace torch_monitor::detail {
namespace {

void blockPlainly(std::recursive_mutex& mutex) {
  mutex.lock();
}

std::atomic<BlockingWait> gWait{&blockPlainly};

} // namespace

void setBlockingWait(BlockingWait wait) noexcept {
  gWait.store(wait != nullptr ? wait : &blockPlainly, std::memory_order_release);
}

BlockingWait blockingWait() noexcept {
  return gWait.load(std::memory_order_acquire);
}

} // namespace torch_monitor::detail
