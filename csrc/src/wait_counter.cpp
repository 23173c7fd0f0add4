#include <torch_monitor/wait_counter.h>

#include <exception>
#include <map>
#include <mutex>
#include <tuple>

#include <c10/util/Exception.h>

#include <torch_monitor/detail/fork_safe_locks.h>
#include <torch_monitor/detail/text.h>

namespace torch_monitor {

void WaitCounter::Guard::stop() {
  if (counter_ == nullptr) {
    return;
  }
  WaitCounter* counter = counter_;
  counter_ = nullptr; // recorded once, even if a handler throws
  counter->record(std::chrono::steady_clock::now() - start_);
}

WaitCounter::Guard::~Guard() {
  // A destructor must not throw (it may run while an exception unwinds the
  // timed work); the unit is recorded either way.
  try {
    stop();
  } catch (const std::exception& e) {
    TORCH_WARN(
        "torch_monitor: an event handler failed while a WaitCounter guard "
        "recorded its unit of work: ",
        detail::errorMessage(e));
  } catch (...) {
    TORCH_WARN(
        "torch_monitor: an event handler failed while a WaitCounter guard "
        "recorded its unit of work");
  }
}

namespace {

// The shared counters by key, window and close. Never destroyed (a counter
// may be used during static destruction), nor are its counters: their last
// windows are logged at exit with every live Stat's.
struct SharedCounters {
  using Key = std::tuple<std::string, int64_t, WindowClose>;
  std::mutex mutex;
  // Held only for a lookup or an insertion (a counter is built outside it:
  // a Stat's constructor takes locks that fork() takes before this one).
  detail::ForkSafeLocks forkLocks{detail::ForkLockMode::kInner, {&mutex}};
  std::map<Key, std::shared_ptr<WaitCounter>> byKey;

  static SharedCounters& get() {
    static auto* counters = new SharedCounters();
    return *counters;
  }
};

} // namespace

std::shared_ptr<WaitCounter> sharedWaitCounter(
    const std::string& key,
    std::chrono::milliseconds window,
    WindowClose windowClose) {
  SharedCounters& shared = SharedCounters::get();
  SharedCounters::Key id{key, window.count(), windowClose};
  {
    std::lock_guard<std::mutex> guard(shared.mutex);
    const auto it = shared.byKey.find(id);
    if (it != shared.byKey.end()) {
      return it->second;
    }
  }
  auto made = std::make_shared<WaitCounter>(key, window, windowClose);
  std::lock_guard<std::mutex> guard(shared.mutex);
  // Another thread may have made it meanwhile: the first one stays (the
  // one made here has no sample, so its destruction logs nothing).
  return shared.byKey.emplace(std::move(id), std::move(made)).first->second;
}

} // namespace torch_monitor
