#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch_monitor/engine/window_timer.h>
#include <torch_monitor/event.h>
#include <torch_monitor/export.h>

namespace torch_monitor::detail {

// What the process-wide registry of live stats needs from a Stat. The
// registry exists for two moments a Stat cannot handle alone:
//  - process exit: a Stat that is never destroyed (owned by a leaked or
//    module-level object) would lose its last window, so
//    closeAllLiveStats() logs every open window;
//  - fork(): the child must not inherit a Stat lock held by a thread that does
//    not exist there, nor shards stuck mid-update.
// A Stat joins the registry when fully constructed and leaves it first thing
// in its destructor; that is the only cost (never per add). The registry is
// an intrusive list, so joining allocates nothing.
// Thread safety: track()/untrack() may race with each other and with the
// registry's walks; the registry calls the virtual methods under its lock.
class TORCH_MONITOR_API LiveStat : public TimedWindows {
 public:
  LiveStat(const LiveStat&) = delete;
  LiveStat& operator=(const LiveStat&) = delete;

  // Closes the open window now if it holds samples and returns its event; the
  // registry logs it after releasing its own lock.
  virtual std::optional<Event> closeOpenWindow() = 0;
  // For setStep() going back (stepWentBack below): closes the open window of
  // a Stat with step windows if `step` lies before it, stamping its event
  // with `stamp` (the step the run had reached), and returns the event; the
  // next add() opens the window `step` is in.
  virtual std::optional<Event> closeWindowLeftBehind(
      int64_t step,
      std::optional<int64_t> stamp) = 0;
  // The Stat's name, for liveStatNames(); nullptr when it is no Stat (a
  // capture's gauges).
  virtual const std::string* statName() const noexcept {
    return nullptr;
  }
  // pthread_atfork hooks: take the Stat's lock before fork() and release it
  // after; the child also forgets the window it inherited (see Stat).
  virtual void lockBeforeFork() = 0;
  virtual void unlockAfterForkInParent() = 0;
  virtual void resetAfterForkInChild() = 0;

  // Whether this Stat is in the registry: false once a forked child dropped
  // it (it lives on the stack of a thread the child did not inherit).
  bool isTracked() const;
  bool keptByForkedChild() const override {
    return isTracked();
  }

 protected:
  LiveStat() = default;
  ~LiveStat() = default;
  // Called by the derived class once fully constructed, and at the start of
  // its destructor.
  void track();
  void untrack();

 private:
  friend struct LiveStatRegistry;
  LiveStat* prev_ = nullptr;
  LiveStat* next_ = nullptr;
  // (The few Stats that live on a thread's stack are listed apart, with
  // their thread: a forked child drops those of threads it did not
  // inherit. A field here would cost every Stat 8 bytes.)
};

// Closes the open window of every live Stat and logs those that hold
// samples; a failing handler is reported as a warning. closeAllStats()
// (stat.h) is this, for users; the registry also runs it at exit.
// Thread safety: callable from any thread, concurrently with every Stat API.
TORCH_MONITOR_API void closeAllLiveStats() noexcept;
// The names of the live Stats, sorted (a name twice for two Stats of one
// name): liveStatNames() (stat.h).
// Thread safety: callable from any thread, concurrently with every Stat API.
TORCH_MONITOR_API std::vector<std::string> liveStatNames();
// Run when the step goes back (through the step listener, step.h, that
// the registry adds when it is made), as after a run
// restarted from a checkpoint or a loop that restarts its step count: every
// Stat with step windows whose open window lies after `step` logs it now,
// at the step the run had reached (`previous`), so that steps before and
// after the jump never share a window. Rethrows the first handler
// exception once every window is logged.
// Thread safety: callable from any thread.
void stepWentBack(int64_t step, std::optional<int64_t> previous);

} // namespace torch_monitor::detail
