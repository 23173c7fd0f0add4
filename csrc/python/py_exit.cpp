// The exit sequence: what Python's exit needs from the library, in one
// ordered call, registered with `atexit` by torch_monitor/__init__.py.
//
// It is one C++ function rather than a Python one: a background warning
// that a filter turns into an error (`-W error`, pytest's
// `filterwarnings = error`) is raised at the next bytecode boundary, and the
// first line of a Python exit hook was such a boundary: none of the cleanup
// ran, and the window timer later called a Python handler during
// Py_FinalizeEx, which ends a thread by unwinding it (SIGABRT through our
// noexcept frames). Here the background warnings are held while the steps
// run and issued after them, whatever the filters make of them.

#include "py_common.h"

#include <c10/util/Exception.h>

#include <torch_monitor/background_warnings.h>
#include <torch_monitor/engine/window_timer.h>
#include <torch_monitor/rank_sync.h>
#include <torch_monitor/sinks/detail/buffered_file_writer.h>
#include <torch_monitor/stat.h>
#include <torch_monitor/watch/recorder.h>

namespace torch_monitor::python {

void initExit(py::module_& m) {
  m.def(
      "_at_exit",
      [] {
        holdBackgroundWarnings();
        {
          // This thread's warnings join the held ones, so that the filters
          // see them too (c10's default would print them).
          c10::WarningUtils::WarningHandlerGuard route(
              torch_monitor::detail::backgroundWarningHandler());
          // The library's threads may be waiting for the GIL to run a
          // Python handler: they must finish for the steps to.
          py::gil_scoped_release noGil;
          // 1. No handler runs on the timer's thread from now on (those
          //    running return first, bounded).
          stopWindowTimer();
          // 2. The last windows of every Stat and every watch, even one
          //    still referenced (a module global, a handler handle, a
          //    scripted module), reach Python handlers and sinks alike.
          closeAllStats();
          watch::Recorder::closeAll();
          // 3. Synced Stats' windows are merged (rank 0) or taken by rank 0
          //    (other ranks), bounded by the deadline; the rank sync thread
          //    then stops, and later windows are logged locally.
          stopRankSync();
          // 4. What the file sinks buffered is written now, while failures
          //    can still become Python warnings (they are closed at process
          //    exit, after the interpreter).
          sinks::detail::BufferedFileWriter::flushAll();
          // 5. Python handlers go before the interpreter does.
          closePythonHandlers();
        }
        // 6. Held warnings are issued; later ones go to stderr.
        issueHeldBackgroundWarnings();
      },
      "Runs torch_monitor's exit sequence (registered with atexit): stops "
      "the window timer, closes every Stat's and watch's open window, flushes rank sync "
      "and the file sinks, unregisters Python handlers, then issues the "
      "background warnings held meanwhile");
}

} // namespace torch_monitor::python
