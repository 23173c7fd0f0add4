#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <torch_monitor/event_handler.h>
#include <torch_monitor/detail/fork_safe_locks.h>
#include <torch_monitor/export.h>

namespace torch_monitor::sinks {

// A sink's trouble (unwritable directory, full disk, dropped events): each
// distinct problem is reported once with TORCH_WARN and kept, so that a
// failing disk produces one warning rather than one per event, and tests and
// dashboards can still ask what went wrong.
// Thread safety: no concurrent call to any API of this type causes a data race.
class TORCH_MONITOR_API ProblemLog {
 public:
  // `owner` prefixes every message, e.g. "TensorBoardWriter('runs/exp1')".
  explicit ProblemLog(std::string owner);

  // Where a report's warning goes.
  enum class WarnVia {
    kCaller, // the calling thread's c10 handler (TORCH_WARN)
    // The background warning sink when one is installed (in Python: a
    // RuntimeWarning on the main thread), else the caller's handler: for
    // trouble met while handling an event, which any thread may log (in
    // Python, log_event does not turn c10 warnings into Python ones).
    kBackgroundSink,
  };

  // Warns with "<owner>: <message>" unless `key` was reported before;
  // returns whether it warned. Never called with a lock held by the caller
  // that a warning handler could need.
  bool report(
      const std::string& key,
      const std::string& message,
      WarnVia via = WarnVia::kCaller);

  // The messages warned so far, oldest first.
  std::vector<std::string> messages() const;

  const std::string& owner() const noexcept {
    return owner_;
  }

 private:
  const std::string owner_;
  mutable std::mutex mutex_;
  std::unordered_set<std::string> keys_;
  std::vector<std::string> messages_;
  // A forked child may report too: the set must be whole there.
  torch_monitor::detail::ForkSafeLocks forkLocks_{
      torch_monitor::detail::ForkLockMode::kInner, {&mutex_}};
};

// The event names a sink accepts: a fixed list, or every name when empty.
// Thread safety: immutable after construction.
class TORCH_MONITOR_API EventNameFilter {
 public:
  explicit EventNameFilter(std::vector<std::string> names = {})
      : names_(std::move(names)) {}
  bool accepts(const std::string& name) const noexcept {
    if (names_.empty()) {
      return true;
    }
    for (const std::string& n : names_) {
      if (n == name) {
        return true;
      }
    }
    return false;
  }
  const std::vector<std::string>& names() const noexcept {
    return names_;
  }

 private:
  std::vector<std::string> names_;
};

// Base of the sinks shipped with torch_monitor: an EventHandler that can
// register itself, be flushed and closed, and that reports its problems
// instead of throwing them into the code that logs (a sink never stops
// training). Create sinks with std::make_shared: registerSelf needs it.
// Thread safety: no concurrent call to any API of this type causes a data
// race; handle() may run on several threads at once.
class TORCH_MONITOR_API Sink : public EventHandler,
                               public std::enable_shared_from_this<Sink> {
 public:
  ~Sink() override;
  Sink(const Sink&) = delete;
  Sink& operator=(const Sink&) = delete;

  // Registers this sink in the global registry once; calling it again while
  // registered is a no-op (so scripted code may call it every step).
  void registerSelf();
  // Undoes registerSelf(); a no-op when not registered that way. A
  // registration made with registerEventHandler() is not touched.
  void unregisterSelf();
  bool registeredSelf() const;

  // Writes what is buffered so far (no-op for unbuffered sinks).
  virtual void flush() {}
  // unregisterSelf(), then flushes and releases the output; later events
  // are ignored. Idempotent; also done by the destructor.
  void close();
  bool closed() const noexcept;

  // Distinct problems reported so far (each was warned once).
  std::vector<std::string> problems() const {
    return problems_.messages();
  }
  // Events or values lost: buffer full, unwritable output, ring overwrite.
  virtual int64_t dropped() const {
    return 0;
  }

  // e.g. "TensorBoardWriter('runs/exp1')".
  const std::string& description() const noexcept {
    return problems_.owner();
  }

 protected:
  explicit Sink(std::string description);
  // Releases the output; called once by close().
  virtual void closeOutput() {}
  ProblemLog& problemLog() noexcept {
    return problems_;
  }

 private:
  ProblemLog problems_;
  mutable std::mutex registrationMutex_;
  bool registeredSelf_ = false;
  // Set by close() before it unregisters: a registerSelf() racing with
  // close() then cannot leave a closed sink registered.
  bool registrationClosed_ = false;
  std::mutex closeMutex_; // a second close() waits for the first to finish
  std::atomic<bool> closed_{false};
  // Both are held across calls that take other locks (the handler registry,
  // a writer's join) and guard no data a forked child needs beyond a bool:
  // fork() does not wait for them, the child gets them unlocked.
  torch_monitor::detail::ForkSafeLocks forkLocks_{
      torch_monitor::detail::ForkLockMode::kResetInChild,
      {&registrationMutex_, &closeMutex_}};
};

// Rejects a path argument that a file name cannot carry faithfully: a NUL
// byte (the C library would cut the name there) or bytes that are not valid
// UTF-8 (every string of the project is UTF-8). `what` names the argument
// in the c10::ValueError, e.g. "JsonLinesWriter: path".
TORCH_MONITOR_API void checkPathText(const std::string& path, const char* what);

// A flush interval given in seconds (as Python and TorchScript do):
// positive and finite, at least 1 ms; else a c10::ValueError.
TORCH_MONITOR_API std::chrono::milliseconds flushIntervalFromSeconds(
    double seconds);

} // namespace torch_monitor::sinks
