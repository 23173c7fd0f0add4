#include <torch_monitor/sinks/detail/fork_safe_locks.h>

#include <algorithm>
#include <new>

#include <pthread.h>

namespace torch_monitor::sinks::detail {
namespace {

// Every enrolled set, in enrolment order. Leaked: fork() may run during
// static destruction.
struct Enrolled {
  std::mutex mutex;
  std::vector<const ForkSafeLocks*> sets;
};
Enrolled& enrolled() {
  static auto* instance = new Enrolled();
  return *instance;
}

bool taken(ForkLockMode mode) {
  return mode != ForkLockMode::kResetInChild;
}

void prepare() {
  Enrolled& e = enrolled();
  e.mutex.lock(); // no set comes or goes until after fork()
  for (const ForkLockMode mode : {ForkLockMode::kOuter, ForkLockMode::kInner}) {
    for (const ForkSafeLocks* set : e.sets) {
      if (set->mode() == mode) {
        for (std::mutex* lock : set->locks()) {
          lock->lock();
        }
      }
    }
  }
}

// The sets are those prepare() saw: e.mutex was held across fork().
void releaseTaken(Enrolled& e) {
  for (const ForkSafeLocks* set : e.sets) {
    if (taken(set->mode())) {
      for (std::mutex* lock : set->locks()) {
        lock->unlock();
      }
    }
  }
}

void afterForkInParent() {
  Enrolled& e = enrolled();
  releaseTaken(e);
  e.mutex.unlock();
}

void afterForkInChild() {
  Enrolled& e = enrolled();
  releaseTaken(e);
  for (const ForkSafeLocks* set : e.sets) {
    if (!taken(set->mode())) {
      for (std::mutex* lock : set->locks()) {
        // The thread that may hold it does not exist here. std::mutex has
        // no resources to release (a trivial destructor in libstdc++), so
        // a fresh one is built over it.
        new (lock) std::mutex();
      }
    }
  }
  e.mutex.unlock();
}

} // namespace

ForkSafeLocks::ForkSafeLocks(
    ForkLockMode mode,
    std::initializer_list<std::mutex*> locks)
    : mode_(mode), locks_(locks) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    pthread_atfork(&prepare, &afterForkInParent, &afterForkInChild);
  });
  Enrolled& e = enrolled();
  std::lock_guard<std::mutex> guard(e.mutex);
  e.sets.push_back(this);
}

ForkSafeLocks::~ForkSafeLocks() {
  Enrolled& e = enrolled();
  std::lock_guard<std::mutex> guard(e.mutex);
  e.sets.erase(std::remove(e.sets.begin(), e.sets.end(), this), e.sets.end());
}

} // namespace torch_monitor::sinks::detail
