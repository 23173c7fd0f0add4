#include <torch_monitor/sinks/detail/write_without_sigpipe.h>

#include <cerrno>
#include <csignal>
#include <ctime>

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

namespace torch_monitor::sinks::detail {

ssize_t writeWithoutSigpipe(int fd, const void* data, size_t size) noexcept {
  sigset_t pipeOnly;
  sigemptyset(&pipeOnly);
  sigaddset(&pipeOnly, SIGPIPE);
  sigset_t previous;
  pthread_sigmask(SIG_BLOCK, &pipeOnly, &previous);
  sigset_t pendingBefore;
  sigpending(&pendingBefore);
  const bool wasPending = sigismember(&pendingBefore, SIGPIPE) == 1;

  const ssize_t n = ::write(fd, data, size);
  const int error = errno;
  if (n < 0 && error == EPIPE && !wasPending) {
    // The kernel queued a SIGPIPE for this thread; take it back (and only
    // it: standard signals do not queue, so at most one is pending).
    const struct timespec zero {};
    while (sigtimedwait(&pipeOnly, nullptr, &zero) == -1 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  errno = error;
  return n;
}

int truncateLastWrite(int fd, size_t bytes) noexcept {
  const off_t end = ::lseek(fd, 0, SEEK_CUR);
  if (end < 0) {
    return errno;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return errno;
  }
  if (st.st_size != end || static_cast<size_t>(end) < bytes) {
    return EAGAIN; // someone wrote after us: cutting would lose their data
  }
  const off_t start = end - static_cast<off_t>(bytes);
  while (::ftruncate(fd, start) != 0) {
    if (errno != EINTR) {
      return errno;
    }
  }
  if (::lseek(fd, start, SEEK_SET) != start) {
    return errno;
  }
  return 0;
}

} // namespace torch_monitor::sinks::detail
