// Warnings raised on the library's own threads reach Python's `warnings`
// module (filters, `-W error`, pytest.warns) while Python runs.
//
// A background thread must not take the GIL: at exit or under a blocked main
// thread that could hang it. Instead it queues the message and asks the
// interpreter, with Py_AddPendingCall (callable without the GIL), to run
// deliverQueued() on the main thread at its next bytecode boundary, where the
// warnings are issued as RuntimeWarnings like the sinks' other warnings. At
// exit (torch_monitor's atexit hook) the queue is delivered once more and
// later warnings go to c10's default handler (stderr): Py_AddPendingCall must
// not be called once the interpreter is finalised.

#include "py_common.h"

#include <mutex>
#include <string>
#include <vector>

#include <torch_monitor/background_warnings.h>
#include <torch_monitor/detail/fork_safe_locks.h>
#include <torch_monitor/detail/lifecycle.h>

namespace torch_monitor::python {
namespace {

struct QueuedWarnings {
  std::mutex mutex; // a leaf lock: nothing else is taken while it is held
  std::vector<std::string> messages;
  bool toPython = false; // Python runs and takes them
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

// Runs on the main thread with the GIL held. Returns -1 with the exception
// set when a filter turned a warning into an error (it is raised there);
// the warnings after it stay queued for the next call.
int deliverQueued(void*) {
  QueuedWarnings& q = queued();
  std::vector<std::string> messages;
  {
    std::lock_guard<std::mutex> guard(q.mutex);
    q.scheduled = false;
    messages.swap(q.messages);
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (PyErr_WarnEx(PyExc_RuntimeWarning, messages[i].c_str(), 1) != 0) {
      std::lock_guard<std::mutex> guard(q.mutex);
      q.messages.insert(
          q.messages.begin(), messages.begin() + i + 1, messages.end());
      if (!q.messages.empty() && q.toPython && !q.scheduled) {
        q.scheduled = Py_AddPendingCall(&deliverQueued, nullptr) == 0;
      }
      return -1;
    }
  }
  return 0;
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
  q.messages.push_back(warning.msg());
  // A full pending-call queue is retried by the next warning.
  if (!q.scheduled) {
    q.scheduled = Py_AddPendingCall(&deliverQueued, nullptr) == 0;
  }
}

// The parent's queued warnings are not repeated in a forked child (its
// binding stage runs after the lock was made anew).
void clearInForkedChild() {
  QueuedWarnings& q = queued();
  q.messages.clear();
  q.scheduled = false;
}
constexpr torch_monitor::detail::ForkHooks kForkHooks{
    nullptr, nullptr, &clearInForkedChild};

} // namespace

void initBackgroundWarnings(py::module_& m) {
  {
    QueuedWarnings& q = queued();
    std::lock_guard<std::mutex> guard(q.mutex);
    q.toPython = true;
  }
  torch_monitor::detail::onFork(
      torch_monitor::detail::ForkStage::kBinding, kForkHooks);
  setBackgroundWarningSink(&queueForPython);
  m.def(
      "_stop_background_warnings",
      [] {
        {
          QueuedWarnings& q = queued();
          std::lock_guard<std::mutex> guard(q.mutex);
          q.toPython = false;
        }
        if (deliverQueued(nullptr) != 0) {
          throw py::error_already_set();
        }
      },
      "Issues the queued background-thread warnings now; later ones go to "
      "stderr (called at exit, before the interpreter is finalised).");
}

} // namespace torch_monitor::python
