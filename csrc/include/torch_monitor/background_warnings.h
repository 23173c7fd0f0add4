#pragma once

// Warnings raised on the library's own threads (the window timer, the sinks'
// writer threads, the Prometheus exporter) have no caller to return to. They
// all go to one process-wide function: c10's default handler (stderr) unless
// a program installs another, as the Python binding does to reach Python's
// `warnings` module.

#include <string>

#include <c10/util/Exception.h>

#include <torch_monitor/export.h>

namespace torch_monitor {

// Receives one warning raised on a background thread, on that thread. It must
// not block for long and must not throw.
using BackgroundWarningSink = void (*)(const c10::Warning& warning);

// Sets the function background threads' warnings go to; nullptr restores
// c10's default handler. Thread-safe (an atomic store): a warning being
// delivered while it is replaced may still reach the previous function, so
// that one must stay callable for the life of the process.
TORCH_MONITOR_API void setBackgroundWarningSink(BackgroundWarningSink sink);

namespace detail {

// Called first thing by every thread the library starts: its TORCH_WARNs go
// to the background warning sink. Thread-safe (sets a thread-local).
TORCH_MONITOR_API void routeThreadWarningsToBackgroundSink();
// Whether the calling thread is one the library started (it called
// routeThreadWarningsToBackgroundSink()). Thread-safe (a thread-local).
// Inline, and initial-exec as the thread slots' (detail/thread_slots.h):
// c10's wait-counter backend asks at every unit it times, and a call
// through the PLT or __tls_get_addr would cost it each time.
TORCH_MONITOR_API extern __thread bool libraryThread
    __attribute__((tls_model("initial-exec")));
inline bool onLibraryThread() noexcept {
  return libraryThread;
}

// The c10 handler that hands warnings to the background warning sink (c10's
// default without one), for a WarningHandlerGuard around a warning that has
// no caller to see it even on a caller's thread. Never destroyed.
// Thread safety: stateless, usable from any thread.
TORCH_MONITOR_API c10::WarningHandler* backgroundWarningHandler();

// Whether a background warning sink is installed (the Python binding
// installs one). Thread-safe (an atomic load).
TORCH_MONITOR_API bool hasBackgroundWarningSink() noexcept;

// TORCH_WARN(message) through the background warning sink when one is
// installed (in Python: a RuntimeWarning on the main thread), else through
// the caller's handler: for a warning raised inside an op, where Python's
// torch.ops calls do not turn c10 warnings into Python ones. Thread-safe.
TORCH_MONITOR_API void warnThroughBackgroundSink(const std::string& message);

} // namespace detail
} // namespace torch_monitor
