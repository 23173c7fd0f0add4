#pragma once

#include <cstdint>
#include <vector>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>

namespace torch_monitor::detail {

// What the window timer closes: a Stat built with WindowClose::ON_TIME
// (LiveStat) or a watch with close_on_time (watch::Recorder).
// Thread safety: the timer calls it on its thread, under its own mutex.
class TORCH_MONITOR_API TimedWindows {
 public:
  // Closes the open window if it has ended and holds something, returning
  // the events to log (the timer logs them after releasing its mutex), and
  // sets `openEndMs` to the end of the window then open (0: none open).
  virtual std::vector<Event> closeEndedWindow(int64_t& openEndMs) = 0;
  // Whether a forked child keeps it (a Stat on the stack of a thread the
  // child does not have is dropped).
  virtual bool keptByForkedChild() const {
    return true;
  }

 protected:
  TimedWindows() = default;
  ~TimedWindows() = default;
};

// The window timer: one background thread per process that closes the
// windows of the Stats built with WindowClose::ON_TIME (and of the watches
// with close_on_time) once they end, so a window with samples is logged
// even when no later add() or step comes. Handlers of those events run on
// the timer's thread.
//
// Only those join it (a list the timer owns; others pay nothing), and it
// never touches Stat::add(): it closes a window through the same roll-over
// a late add() would use (TimedWindows::closeEndedWindow).
//
// Delay: the thread sleeps until the earliest end of an open window among its
// Stats, but at most kWindowTimerPollMs, since a window opened by an add()
// meanwhile is not announced to it. So a window is closed at most
// kWindowTimerPollMs after its end, plus the time handlers of other windows
// closed in the same pass take, plus scheduling latency.
//
// Exit: the thread is stopped (it finishes the pass and the handlers it is
// running, waiting at most kWindowTimerExitWaitMs) before closeAllStats()
// runs at exit; Python stops it in its atexit hook, before the interpreter
// finalises. Windows still open are then logged by closeAllStats() as for
// any Stat. Fork: the child gets a new timer thread when it has timed Stats
// (their inherited windows start empty, see Stat).
// Thread safety: every function may be called from any thread, concurrently.
inline constexpr int64_t kWindowTimerPollMs = 50;
inline constexpr int64_t kWindowTimerExitWaitMs = 10'000;

// Adds `windows` to the timer's list, starting the thread on first use.
// Never throws: if the thread cannot start, a warning says so and the
// windows close lazily. Called once `windows` is fully constructed (a Stat:
// and tracked).
void joinWindowTimer(TimedWindows* windows) noexcept;
// Removes `windows`; on return the timer no longer calls it (a pass under
// way finishes first). Called first thing when it is destroyed.
void leaveWindowTimer(TimedWindows* windows) noexcept;

} // namespace torch_monitor::detail

namespace torch_monitor {
// Stops the window timer for good, waiting (bounded) for the handlers it is
// running. Called at exit; later timed Stats close their windows lazily.
TORCH_MONITOR_API void stopWindowTimer() noexcept;
} // namespace torch_monitor
