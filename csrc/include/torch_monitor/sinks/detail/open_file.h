#pragma once

// open(2) for the file sinks. Not part of the stable API.

#include <sys/types.h>

#include <torch_monitor/export.h>

namespace torch_monitor::sinks::detail {

// open(path, flags, mode), but never as descriptor 0, 1 or 2. A program
// that closed its standard output (`prog >&-`, a daemon) would otherwise
// have the first file we open take its number, and whatever then writes to
// "stdout" (a ConsoleHandler, print()) would write into our event file and
// corrupt it. Returns the descriptor, or -1 with errno set (EINTR
// included: the caller retries).
// Thread safety: safe to call from any thread.
TORCH_MONITOR_API int openFile(const char* path, int flags, mode_t mode) noexcept;

} // namespace torch_monitor::sinks::detail
