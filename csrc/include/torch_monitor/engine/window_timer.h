#pragma once

#include <cstdint>

#include <torch_monitor/export.h>

namespace torch_monitor::detail {

class LiveStat;

// The window timer: one background thread per process that closes the
// windows of the Stats built with WindowClose::ON_TIME once they end, so a
// window with samples is logged even when no later add() comes. Handlers of
// those events run on the timer's thread.
//
// Only those Stats join it (a list the timer owns; other Stats pay nothing),
// and it never touches Stat::add(): it closes a window through the same
// roll-over a late add() would use (LiveStat::closeEndedWindow).
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

// Adds `stat` to the timer's Stats, starting the thread on first use. Never
// throws: if the thread cannot start, a warning says so and the Stat's
// windows close lazily. Called once `stat` is fully constructed and
// tracked.
void joinWindowTimer(LiveStat* stat) noexcept;
// Removes `stat`; on return the timer no longer calls it (a pass under way
// finishes first). Called first thing when a timed Stat is destroyed.
void leaveWindowTimer(LiveStat* stat) noexcept;

} // namespace torch_monitor::detail

namespace torch_monitor {
// Stops the window timer for good, waiting (bounded) for the handlers it is
// running. Called at exit; later timed Stats close their windows lazily.
TORCH_MONITOR_API void stopWindowTimer() noexcept;
} // namespace torch_monitor
