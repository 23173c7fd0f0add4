// Warnings raised on the library's own threads reach Python's `warnings`
// module (filters, `-W error`, pytest.warns) while Python runs.
//
// A background thread must not take the GIL: at exit or under a blocked main
// thread that could hang it. Instead it queues the message and asks the
// interpreter, with Py_AddPendingCall (callable without the GIL), to run
// deliverQueued() on the main thread at its next bytecode boundary, where the
// warnings are issued as RuntimeWarnings like the sinks' other warnings.
//
// The queue is bounded: a main thread blocked in C (a join, Event.wait) while
// a sink fails on every event would otherwise let it grow without end. What
// does not fit is counted and said in one warning after the queued ones.
//
// At exit (py_exit.cpp) the queue is held: warnings are still queued but no
// longer delivered at a bytecode boundary, where a filter that turns them
// into errors would abort the exit sequence. When the sequence is done they
// are issued once more, and later ones go to c10's default handler (stderr):
// Py_AddPendingCall must not be called once the interpreter is finalised.

#include "py_common.h"

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <torch_monitor/background_warnings.h>
#include <torch_monitor/detail/fork_safe_locks.h>
#include <torch_monitor/detail/lifecycle.h>

namespace torch_monitor::python {
namespace {

// Warnings kept for the main thread at most; a human reads them, and the
// filters show each distinct one once anyway.
constexpr size_t kMaxQueuedWarnings = 1000;

struct QueuedWarnings {
  std::mutex mutex; // a leaf lock: nothing else is taken while it is held
  std::vector<std::string> messages;
  uint64_t dropped = 0; // beyond kMaxQueuedWarnings since the last delivery
  bool toPython = false; // Python runs and takes them
  bool held = false; // the exit sequence runs: queue, but do not deliver
  bool scheduled = false; // a call of deliverQueued() is pending
  // The forked child has one thread: a lock held by a vanished thread of
  // the parent is made anew.
  torch_monitor::detail::ForkSafeLocks forkLocks{
      torch_monitor::detail::ForkLockMode::kResetInChild, {&mutex}};
};

// Never destroyed: background threads may warn during static destruction.
QueuedWarnings& queued() {
  static auto* q = new QueuedWarnings();
  return *q;
}

// Callers hold the mutex. Takes the queued messages, followed by the count
// of those dropped, if any.
std::vector<std::string> takeLocked(QueuedWarnings& q) {
  std::vector<std::string> messages;
  messages.swap(q.messages);
  if (q.dropped != 0) {
    messages.push_back(
        "torch_monitor: " + std::to_string(q.dropped) +
        " more warnings of the library's background threads were dropped: " +
        std::to_string(kMaxQueuedWarnings) +
        " were already waiting for the main thread, which ran no Python "
        "code meanwhile");
    q.dropped = 0;
  }
  return messages;
}

// Issues `messages` as RuntimeWarnings with the GIL held. Returns the index
// of the first one a filter turned into an error (its exception set), or
// messages.size().
size_t warnInPython(const std::vector<std::string>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (PyErr_WarnEx(PyExc_RuntimeWarning, messages[i].c_str(), 1) != 0) {
      return i;
    }
  }
  return messages.size();
}

// Runs on the main thread with the GIL held. Returns -1 with the exception
// set when a filter turned a warning into an error (it is raised there);
// the warnings after it stay queued for the next call.
int deliverQueued(void*) {
  QueuedWarnings& q = queued();
  std::vector<std::string> messages;
  {
    std::lock_guard<std::mutex> guard(q.mutex);
    q.scheduled = false;
    if (q.held) {
      return 0; // the exit sequence issues them when it is done
    }
    messages = takeLocked(q);
  }
  const size_t failed = warnInPython(messages);
  if (failed == messages.size()) {
    return 0;
  }
  std::lock_guard<std::mutex> guard(q.mutex);
  q.messages.insert(
      q.messages.begin(), messages.begin() + failed + 1, messages.end());
  if (!q.messages.empty() && q.toPython && !q.held && !q.scheduled) {
    q.scheduled = Py_AddPendingCall(&deliverQueued, nullptr) == 0;
  }
  return -1;
}

// The background warning sink, on the warning thread.
void queueForPython(const c10::Warning& warning) {
  QueuedWarnings& q = queued();
  std::unique_lock<std::mutex> lock(q.mutex);
  if (!q.toPython) {
    lock.unlock();
    c10::WarningHandler().process(warning); // c10's default: stderr
    return;
  }
  if (q.messages.size() >= kMaxQueuedWarnings) {
    ++q.dropped;
    return;
  }
  q.messages.push_back(warning.msg());
  // A full pending-call queue is retried by the next warning.
  if (!q.scheduled && !q.held) {
    q.scheduled = Py_AddPendingCall(&deliverQueued, nullptr) == 0;
  }
}

// The parent's queued warnings are not repeated in a forked child (its
// binding stage runs after the lock was made anew).
void clearInForkedChild() {
  QueuedWarnings& q = queued();
  q.messages.clear();
  q.dropped = 0;
  q.scheduled = false;
}
constexpr torch_monitor::detail::ForkHooks kForkHooks{
    nullptr, nullptr, &clearInForkedChild};

} // namespace

void holdBackgroundWarnings() {
  QueuedWarnings& q = queued();
  std::lock_guard<std::mutex> guard(q.mutex);
  q.held = true;
}

void issueHeldBackgroundWarnings() {
  QueuedWarnings& q = queued();
  std::vector<std::string> messages;
  {
    std::lock_guard<std::mutex> guard(q.mutex);
    q.toPython = false;
    messages = takeLocked(q);
  }
  const size_t failed = warnInPython(messages);
  if (failed == messages.size()) {
    return;
  }
  // A filter made one an error: it is raised once the others are out, on
  // stderr as later warnings go (one exception can be raised, not several).
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  for (size_t i = failed + 1; i < messages.size(); ++i) {
    c10::WarningHandler().process(c10::Warning(
        c10::UserWarning(), c10::SourceLocation{__func__, __FILE__, __LINE__},
        messages[i], false));
  }
  PyErr_Restore(type, value, traceback);
  throw py::error_already_set();
}

void initBackgroundWarnings() {
  {
    QueuedWarnings& q = queued();
    std::lock_guard<std::mutex> guard(q.mutex);
    q.toPython = true;
  }
  torch_monitor::detail::onFork(
      torch_monitor::detail::ForkStage::kBinding, kForkHooks);
  setBackgroundWarningSink(&queueForPython);
}

} // namespace torch_monitor::python
