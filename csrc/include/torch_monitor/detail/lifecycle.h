#pragma once

#include <cstdint>

#include <torch_monitor/export.h>

// The one place where the library meets fork() and process exit.
//
// Every part of the library with process-wide state registers its hooks here
// under a stage, and the stage alone decides when the hooks run relative to
// the other parts' (not the order in which the parts were first used). One
// pthread_atfork() call runs the fork hooks; one std::atexit() call and,
// for the last stage, one static object run the exit hooks.
//
// A part registers when it builds its state (often lazily, on first use) and
// may rely on its hooks running only from then on. Each stage is registered
// once; hooks must never throw.
//
// Thread safety: registration may race with itself and with fork() and exit
// on any thread; a hook registered while a fork() is under way runs from the
// next fork() on.
namespace torch_monitor::detail {

// fork(): prepare hooks run in stage order, so a stage's locks are taken
// before those of the stages after it (a part may take a later stage's lock
// while holding its own, never an earlier one's); parent and child hooks run
// in the reverse order, so a child hook finds every later stage usable. In
// the child, forkGeneration() is bumped before any hook runs.
enum class ForkStage : uint8_t {
  // The window timer's mutex (held while it takes a Stat's). Its child hook
  // starts the timer thread again, so it runs when everything else is reset.
  kWindowTimer,
  // The language binding's own state (Python: the queued background
  // warnings); child only.
  kBinding,
  // The rank sync thread's state: child only (the parent's Store
  // connections and queue are not the child's).
  kRankSync,
  // The captures of PyTorch's counters (pytorch_counters.h): the child
  // forgets the parent's readers; child only.
  kPytorchCounters,
  // The locks enrolled with ForkSafeLocks (fork_safe_locks.h: the sinks',
  // the Python binding's warning queue) and ForkSafeMutex's renewal lock.
  kForkSafeLocks,
  // The live-stat registry's mutex, then every Stat's.
  kLiveStats,
  // membarrier(2) is registered anew in the child.
  kAsymmetricBarrier,
  // The thread-slot table's mutex (taken while a Stat's is held).
  kThreadSlots,
  // The handler registry's mutex (held while no other lock is taken).
  kEventHandlers,
  kCount,
};

// What a part does around fork(): `prepare` in the forking thread just
// before, `inParent` and `inChild` just after (each may be nullptr).
// Thread safety: a plain value, constant once registered.
struct ForkHooks {
  void (*prepare)();
  void (*inParent)();
  void (*inChild)();
};

// Registers `hooks` (kept by address: give it static storage) for `stage`.
TORCH_MONITOR_API void onFork(ForkStage stage, const ForkHooks& hooks) noexcept;

// How many fork() calls this process descends from since the library was
// loaded (0 in the process that loaded it): a lock or a writer that
// remembers the generation it was made in knows whether it was inherited.
TORCH_MONITOR_API uint64_t forkGeneration() noexcept;

// exit(): the hooks run in stage order, each at most once. All stages but
// the last run from one std::atexit() hook, installed by the first onExit()
// call for one of them: after the library's static objects were built, so
// before they are destroyed.
enum class ExitStage : uint8_t {
  // Stops the window timer, so no window closes on its thread any more.
  kWindowTimer,
  // Closes the open windows, merges them across ranks, stops the thread.
  kRankSync,
  // Closes and logs every Stat's open window (closeAllStats()).
  kLiveStats,
  // Stops the Prometheus exporters' server threads.
  kPrometheusExporters,
  // Flushes and closes every file writer. Runs when the library's static
  // objects are destroyed: at exit after the atexit hooks and static
  // objects of everything loaded or built after the library (so after the
  // stages above and a program's own static Stats, whose last windows it
  // writes), or at dlclose; before the libraries it depends on go.
  kFileWriters,
  kCount,
};

// Registers `hook` for `stage`.
TORCH_MONITOR_API void onExit(ExitStage stage, void (*hook)()) noexcept;

} // namespace torch_monitor::detail
