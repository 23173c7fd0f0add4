#include <torch_monitor/sinks/detail/open_file.h>

#include <cerrno>

#include <fcntl.h>
#include <unistd.h>

namespace torch_monitor::sinks::detail {

int openFile(const char* path, int flags, mode_t mode) noexcept {
  const int fd = ::open(path, flags, mode);
  if (fd < 0 || fd > 2) {
    return fd;
  }
  // A standard stream's number: moved to the lowest free one above them.
  const int moved =
      ::fcntl(fd, (flags & O_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD, 3);
  const int error = errno;
  ::close(fd);
  errno = error;
  return moved;
}

} // namespace torch_monitor::sinks::detail
