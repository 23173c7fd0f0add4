#include <torch_monitor/engine/window_timer.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>

#include <torch_monitor/background_warnings.h>
#include <torch_monitor/clock.h>
#include <torch_monitor/detail/lifecycle.h>
#include <torch_monitor/detail/text.h>
#include <torch_monitor/engine/live_stats.h>
#include <torch_monitor/event_handler.h>

namespace torch_monitor {
namespace detail {
namespace {

// True on the timer's thread (also in a child it forked from a handler).
thread_local bool onTimerThread = false;

void dispatchLogged(const Event& event) noexcept {
  try {
    dispatchEvent(event);
  } catch (const std::exception& e) {
    TORCH_WARN(
        "torch_monitor: an event handler failed on the window timer's "
        "thread: ",
        errorMessage(e));
  } catch (...) {
    TORCH_WARN(
        "torch_monitor: an event handler failed on the window timer's thread");
  }
}

// Lock order: the timer's mutex, then a Stat's (inside closeEndedWindow).
// Handlers run with neither held, so they may take the GIL and create or
// destroy timed Stats. Its fork stage comes first (lifecycle.h): the prepare
// hook takes this mutex before the registry takes the Stats' locks, and the
// child hook runs last, after the registry dropped the Stats of vanished
// threads and every other part is usable again for the new thread.
struct WindowTimer {
  std::mutex mutex;
  std::condition_variable wake; // the thread waits: new Stat, stop, poll
  std::condition_variable stopped; // stopWindowTimer waits for the thread
  std::vector<TimedWindows*> stats;
  // Owned; in a forked child it names a thread that does not exist there,
  // so it is dropped without being joined.
  std::thread* thread = nullptr;
  bool running = false; // the thread is in run()
  bool stopping = false;
  bool shutDown = false; // stopped at exit: never started again

  static std::atomic<WindowTimer*> instance;

  // Never destroyed: Stats may be destroyed during static destruction.
  static WindowTimer& get() {
    static WindowTimer* timer = [] {
      auto* t = new WindowTimer();
      static constexpr ForkHooks kHooks{
          &prepareFork, &afterForkInParent, &afterForkInChild};
      onFork(ForkStage::kWindowTimer, kHooks);
      // Stopped before closeAllStats() runs at exit.
      onExit(ExitStage::kWindowTimer, &stopWindowTimer);
      instance.store(t, std::memory_order_release);
      return t;
    }();
    return *timer;
  }

  // Callers hold the mutex. Throws if the thread cannot start.
  void startLocked() {
    if (running || shutDown) {
      return;
    }
    stopping = false;
    thread = new std::thread([this] { run(); });
    running = true;
  }

  void run() {
    onTimerThread = true;
    routeThreadWarningsToBackgroundSink();
    std::vector<Event> events;
    std::unique_lock<std::mutex> lock(mutex);
    while (!stopping) {
      int64_t earliestEnd = 0;
      for (TimedWindows* stat : stats) {
        int64_t openEnd = 0;
        try {
          for (Event& event : stat->closeEndedWindow(openEnd)) {
            events.push_back(std::move(event));
          }
        } catch (const std::exception& e) {
          TORCH_WARN(
              "torch_monitor: the window timer could not close a window: ",
              errorMessage(e));
        }
        if (openEnd != 0 && (earliestEnd == 0 || openEnd < earliestEnd)) {
          earliestEnd = openEnd;
        }
      }
      if (!events.empty()) {
        // Closed windows are always logged, even when a stop came meanwhile.
        lock.unlock();
        for (const Event& event : events) {
          dispatchLogged(event);
        }
        events.clear();
        lock.lock();
        continue; // the handlers took time: look again before sleeping
      }
      if (stats.empty()) {
        wake.wait(lock);
        continue;
      }
      int64_t sleepMs = kWindowTimerPollMs;
      if (earliestEnd != 0) {
        const int64_t untilEnd =
            earliestEnd - readClock(ClockSource::PRECISE);
        sleepMs = std::clamp<int64_t>(untilEnd, 1, kWindowTimerPollMs);
      }
      wake.wait_for(lock, std::chrono::milliseconds(sleepMs));
    }
    running = false;
    stopped.notify_all();
  }

  static void prepareFork() {
    get().mutex.lock();
  }
  static void afterForkInParent() {
    get().mutex.unlock();
  }
  // Only the forking thread exists now. The condition variables may record
  // waiters that are gone, so they start afresh; the Stats the registry
  // dropped (on vanished threads' stacks) leave the list; a new thread
  // takes over when timed Stats remain.
  static void afterForkInChild() {
    WindowTimer& t = get();
    new (&t.wake) std::condition_variable();
    new (&t.stopped) std::condition_variable();
    if (!onTimerThread) {
      t.thread = nullptr;
      t.running = false;
    }
    t.stats.erase(
        std::remove_if(
            t.stats.begin(),
            t.stats.end(),
            [](TimedWindows* s) { return !s->keptByForkedChild(); }),
        t.stats.end());
    if (!t.stats.empty()) {
      try {
        t.startLocked();
      } catch (const std::exception& e) {
        TORCH_WARN(
            "torch_monitor: the forked child could not start the window "
            "timer; its close_on_time Stats close windows lazily: ",
            errorMessage(e));
      }
    }
    t.mutex.unlock();
  }
};

std::atomic<WindowTimer*> WindowTimer::instance{nullptr};

} // namespace

void joinWindowTimer(TimedWindows* stat) noexcept {
  try {
    WindowTimer& t = WindowTimer::get();
    std::lock_guard<std::mutex> guard(t.mutex);
    if (t.shutDown) {
      return; // after the exit hook: closes lazily, then by closeAllStats()
    }
    t.stats.push_back(stat);
    t.startLocked();
    t.wake.notify_all();
  } catch (const std::exception& e) {
    TORCH_WARN(
        "torch_monitor: could not start the window timer; close_on_time "
        "Stats close their windows lazily (at the next add): ",
        errorMessage(e));
  }
}

void leaveWindowTimer(TimedWindows* stat) noexcept {
  WindowTimer* t = WindowTimer::instance.load(std::memory_order_acquire);
  if (t == nullptr) {
    return;
  }
  std::lock_guard<std::mutex> guard(t->mutex);
  t->stats.erase(
      std::remove(t->stats.begin(), t->stats.end(), stat), t->stats.end());
}

} // namespace detail

void stopWindowTimer() noexcept {
  // Never creates the timer: a process that has none has nothing to stop.
  auto* t = detail::WindowTimer::instance.load(std::memory_order_acquire);
  if (t == nullptr) {
    return;
  }
  std::unique_lock<std::mutex> lock(t->mutex);
  t->shutDown = true;
  t->stopping = true;
  t->wake.notify_all();
  if (detail::onTimerThread) {
    return; // exit() from a handler on the timer's thread
  }
  if (!t->stopped.wait_for(
          lock,
          std::chrono::milliseconds(detail::kWindowTimerExitWaitMs),
          [t] { return !t->running; })) {
    TORCH_WARN(
        "torch_monitor: an event handler on the window timer's thread did "
        "not return within ",
        detail::kWindowTimerExitWaitMs,
        " ms at exit; exiting without waiting for it");
    return;
  }
  std::thread* thread = t->thread;
  t->thread = nullptr;
  lock.unlock();
  if (thread != nullptr) {
    thread->join();
    delete thread;
  }
}

} // namespace torch_monitor
