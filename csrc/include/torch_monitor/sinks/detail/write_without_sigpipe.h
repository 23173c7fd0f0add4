#pragma once

// write(2) that can never raise SIGPIPE, for the sinks that write to pipes,
// FIFOs or sockets. Not part of the stable API.

#include <cstddef>

#include <sys/types.h>

#include <torch_monitor/export.h>

namespace torch_monitor::sinks::detail {

// One write(2) of `data` to `fd` with SIGPIPE blocked on the calling thread;
// a SIGPIPE this write raised (its reader went away) is consumed before the
// mask is restored, so the process' disposition and mask stay as they were
// and the caller sees only EPIPE. A SIGPIPE already pending from elsewhere
// is left alone. Returns what write(2) returns, errno set on failure
// (EINTR included: the caller retries).
// Costs four extra system calls: use it for the writes that can meet a
// closed pipe, not for regular files.
// Thread safety: safe to call from any thread (the mask is per thread).
TORCH_MONITOR_API ssize_t
writeWithoutSigpipe(int fd, const void* data, size_t size) noexcept;

} // namespace torch_monitor::sinks::detail
