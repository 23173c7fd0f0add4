#pragma once

// write(2) that can never raise SIGPIPE, for the sinks that write to pipes,
// FIFOs or sockets, and the undoing of a write that stopped part-way in a
// regular file. Not part of the stable API.

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

// Takes the last `bytes` written through `fd` back out of its regular file
// (ftruncate, and the file offset moved back too, so that the next write of
// a file not opened with O_APPEND leaves no hole): a record that a full disk
// cut short is not left at the end of the file. Only when those bytes are
// still the end of the file (the offset is the file's size), so data that
// another writer appended after them is never cut. Returns 0, or the errno
// (EAGAIN when the bytes are no longer at the end of the file).
TORCH_MONITOR_API int truncateLastWrite(int fd, size_t bytes) noexcept;

} // namespace torch_monitor::sinks::detail
