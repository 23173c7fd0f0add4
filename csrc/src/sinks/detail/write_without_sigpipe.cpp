#include <torch_monitor/sinks/detail/write_without_sigpipe.h>

#include <cerrno>
#include <csignal>
#include <ctime>

#include <pthread.h>
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

} // namespace torch_monitor::sinks::detail
