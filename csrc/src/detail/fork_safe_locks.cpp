#include <torch_monitor/detail/fork_safe_locks.h>

#include <algorithm>
#include <new>

namespace torch_monitor::detail {
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

// Serialises ForkSafeMutex renewals: two threads of a child may both find
// the same mutex stale. Itself a plain global, reset in the child before
// anyone can use it.
std::mutex renewMutex;

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

void inParent() {
  Enrolled& e = enrolled();
  releaseTaken(e);
  e.mutex.unlock();
}

void inChild() {
  new (&renewMutex) std::mutex();
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

constexpr ForkHooks kHooks{&prepare, &inParent, &inChild};

// When the library loads: the renewal mutex needs its child hook from the
// start, and the enrolment list is then never first built by a library
// thread (see docs/design.md, "The library's own threads").
const bool kRegisteredAtLoad = [] {
  enrolled();
  onFork(ForkStage::kForkSafeLocks, kHooks);
  return true;
}();

} // namespace

ForkSafeLocks::ForkSafeLocks(
    ForkLockMode mode,
    std::initializer_list<std::mutex*> locks)
    : mode_(mode), locks_(locks) {
  Enrolled& e = enrolled();
  std::lock_guard<std::mutex> guard(e.mutex);
  e.sets.push_back(this);
}

ForkSafeLocks::~ForkSafeLocks() {
  Enrolled& e = enrolled();
  std::lock_guard<std::mutex> guard(e.mutex);
  e.sets.erase(std::remove(e.sets.begin(), e.sets.end(), this), e.sets.end());
}

void ForkSafeMutex::renew() noexcept {
  std::lock_guard<std::mutex> guard(renewMutex);
  const uint64_t now = forkGeneration();
  if (generation_.load(std::memory_order_relaxed) != now) {
    // The old mutex may be locked by a thread that does not exist in this
    // process; nobody else can be using it yet (we are the first here).
    new (&mutex_) std::recursive_mutex();
    generation_.store(now, std::memory_order_release);
  }
}

} // namespace torch_monitor::detail
