#include <torch_monitor/engine/live_stats.h>

#include <algorithm>

#include <cstdint>
#include <exception>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <pthread.h>

#include <c10/util/Exception.h>

#include <torch_monitor/detail/call_each.h>
#include <torch_monitor/detail/lifecycle.h>
#include <torch_monitor/detail/text.h>
#include <torch_monitor/event_handler.h>
#include <torch_monitor/step.h>

namespace torch_monitor {
namespace detail {
namespace {

// Its address identifies the calling thread, also in a forked child (which
// keeps the forking thread's thread-local storage where it was).
thread_local char threadMarker;

// Whether `p` lies on the calling thread's stack (bounds looked up once per
// thread, at its first Stat).
bool onCallingThreadStack(const void* p) {
  thread_local uintptr_t low = 0;
  thread_local uintptr_t high = 0;
  if (high == 0) {
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* base = nullptr;
      size_t size = 0;
      if (pthread_attr_getstack(&attr, &base, &size) == 0) {
        low = reinterpret_cast<uintptr_t>(base);
        high = low + size;
      }
      pthread_attr_destroy(&attr);
    }
    if (high == 0) {
      high = 1; // unknown: count nothing as on the stack
    }
  }
  const auto address = reinterpret_cast<uintptr_t>(p);
  return address >= low && address < high;
}

} // namespace

// Lock order: the registry's mutex, then a Stat's. A Stat never takes the
// registry's mutex while holding its own, and logs only after releasing both.
struct LiveStatRegistry {
  std::mutex mutex;
  LiveStat* first = nullptr;
  // The Stats that live on a thread's stack, with that thread's marker
  // (threadMarker's address): a forked child drops the Stats of threads it
  // did not inherit, whose stack memory its new threads reuse. Few (Stats
  // are long-lived), and looked up only at join, leave and fork.
  std::unordered_map<const LiveStat*, const void*> onStacks;

  // Never destroyed: Stats may be destroyed during static destruction.
  static LiveStatRegistry& get() {
    static LiveStatRegistry* instance = [] {
      auto* r = new LiveStatRegistry();
      static constexpr ForkHooks kHooks{
          &prepareFork, &afterForkInParent, &afterForkInChild};
      onFork(ForkStage::kLiveStats, kHooks);
      // Before the file writers' final flush: the last windows reach them.
      onExit(ExitStage::kLiveStats, &closeAllLiveStats);
      // Step windows the step went back from are closed at once.
      struct WentBack final : StepListener {
        void onStepWentBack(int64_t step, int64_t reached) override {
          stepWentBack(step, reached);
        }
      };
      addStepListener(std::make_shared<WentBack>());
      return r;
    }();
    return *instance;
  }

  template <typename F>
  void forEach(F f) {
    for (LiveStat* s = first; s != nullptr; s = s->next_) {
      f(*s);
    }
  }

  // Held from prepare to the parent/child hook, so no Stat joins or leaves
  // while fork() copies the process.
  static void prepareFork() {
    LiveStatRegistry& r = get();
    r.mutex.lock();
    r.forEach([](LiveStat& s) { s.lockBeforeFork(); });
  }
  static void afterForkInParent() {
    LiveStatRegistry& r = get();
    r.forEach([](LiveStat& s) { s.unlockAfterForkInParent(); });
    r.mutex.unlock();
  }
  // Only the forking thread exists now, and no other thread has started
  // yet: a Stat on another thread's stack is still intact here but belongs
  // to a thread that is gone, and its memory is reused as soon as the child
  // starts a thread. It is dropped (never to be used or destroyed in the
  // child); every other Stat is reset for the child.
  static void afterForkInChild() {
    LiveStatRegistry& r = get();
    std::vector<LiveStat*> gone;
    for (const auto& [stat, thread] : r.onStacks) {
      if (thread != &threadMarker) {
        gone.push_back(const_cast<LiveStat*>(stat));
      }
    }
    for (LiveStat* s : gone) {
      r.unlink(*s);
    }
    r.forEach([](LiveStat& s) { s.resetAfterForkInChild(); });
    r.mutex.unlock();
  }

  // Callers hold the mutex. A Stat a forked child dropped is in no list.
  void unlink(LiveStat& s) {
    if (s.prev_ == nullptr && first != &s) {
      return;
    }
    if (!onStacks.empty()) {
      onStacks.erase(&s);
    }
    (s.prev_ != nullptr ? s.prev_->next_ : first) = s.next_;
    if (s.next_ != nullptr) {
      s.next_->prev_ = s.prev_;
    }
    s.prev_ = s.next_ = nullptr;
  }
};

void LiveStat::track() {
  const bool onStack = onCallingThreadStack(this);
  LiveStatRegistry& r = LiveStatRegistry::get();
  std::lock_guard<std::mutex> guard(r.mutex);
  if (onStack) {
    r.onStacks.emplace(this, &threadMarker);
  }
  next_ = r.first;
  if (next_ != nullptr) {
    next_->prev_ = this;
  }
  r.first = this;
}

bool LiveStat::isTracked() const {
  LiveStatRegistry& r = LiveStatRegistry::get();
  std::lock_guard<std::mutex> guard(r.mutex);
  return prev_ != nullptr || r.first == this;
}

void LiveStat::untrack() {
  LiveStatRegistry& r = LiveStatRegistry::get();
  std::lock_guard<std::mutex> guard(r.mutex);
  r.unlink(*this);
}

void stepWentBack(int64_t step, std::optional<int64_t> previous) {
  std::vector<Event> events;
  {
    auto& r = LiveStatRegistry::get();
    std::lock_guard<std::mutex> guard(r.mutex);
    r.forEach([&](LiveStat& s) {
      if (auto event = s.closeWindowLeftBehind(step, previous)) {
        events.push_back(std::move(*event));
      }
    });
  }
  callEach(events, [](const Event& event) { dispatchEvent(event); });
}

std::vector<std::string> liveStatNames() {
  std::vector<std::string> names;
  {
    auto& r = LiveStatRegistry::get();
    std::lock_guard<std::mutex> guard(r.mutex);
    r.forEach([&](const LiveStat& s) {
      if (const std::string* name = s.statName()) {
        names.push_back(*name);
      }
    });
  }
  std::sort(names.begin(), names.end());
  return names;
}

void closeAllLiveStats() noexcept {
  std::vector<Event> events;
  {
    auto& r = LiveStatRegistry::get();
    std::lock_guard<std::mutex> guard(r.mutex);
    r.forEach([&](LiveStat& s) {
      if (auto event = s.closeOpenWindow()) {
        events.push_back(std::move(*event));
      }
    });
  }
  // Called at exit, where an exception would terminate the process: a
  // failing handler is reported, as when a Stat is destroyed.
  for (const Event& event : events) {
    try {
      dispatchEvent(event);
    } catch (const std::exception& e) {
      TORCH_WARN(
          "torch_monitor: an event handler failed while closing the open "
          "Stat windows: ",
          detail::errorMessage(e));
    } catch (...) {
      TORCH_WARN(
          "torch_monitor: an event handler failed while closing the open "
          "Stat windows");
    }
  }
}

} // namespace detail
} // namespace torch_monitor
