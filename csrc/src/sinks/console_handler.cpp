#include <torch_monitor/sinks/console_handler.h>

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <torch_monitor/process_rank.h>
#include <torch_monitor/sinks/detail/write_without_sigpipe.h>
#include <torch_monitor/sinks/format/text.h>

namespace torch_monitor::sinks {
namespace {

// Whether `fd`, a pipe that does not block, lacks room for `size` more
// bytes now: such a write would take part of the line and leave the rest
// to a next write that finds the pipe full, tearing the line. Checked, the
// line is dropped whole instead. (A line larger than the whole pipe is
// written in parts: it can never fit at once.)
bool noRoomInNonBlockingPipe(int fd, size_t size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
    return false;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || !(flags & O_NONBLOCK)) {
    return false;
  }
  const int capacity = ::fcntl(fd, F_GETPIPE_SZ);
  int queued = 0;
  if (capacity <= 0 || ::ioctl(fd, FIONREAD, &queued) != 0) {
    return false;
  }
  return size <= size_t(capacity) && size > size_t(capacity - queued);
}

// The whole line, in as many write(2)s as it takes; 0 or the errno. Each
// write holds SIGPIPE back: a console handler must not kill a C++ training
// program because `| head` closed the pipe.
// A line the stream took only part of (a full disk) is cut off again when
// the stream is a regular file, so that it never ends inside a line; on a
// pipe that does not block, the rest waits for room (at most a second),
// since a pipe cannot be cut.
int writeLine(int fd, const std::string& line) {
  if (noRoomInNonBlockingPipe(fd, line.size())) {
    return EAGAIN;
  }
  size_t done = 0;
  int waitedMs = 0;
  while (done < line.size()) {
    const ssize_t n = detail::writeWithoutSigpipe(
        fd, line.data() + done, line.size() - done);
    if (n < 0) {
      const int error = errno;
      if (error == EINTR) {
        continue;
      }
      if (error == EAGAIN && done > 0 && waitedMs < 1000) {
        pollfd room{fd, POLLOUT, 0};
        ::poll(&room, 1, 10);
        waitedMs += 10;
        continue;
      }
      struct stat st {};
      if (done > 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        detail::truncateLastWrite(fd, done); // not at the end: left alone
      }
      return error;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

} // namespace

ConsoleStream consoleStreamFromName(const std::string& name) {
  if (name == "stdout") {
    return ConsoleStream::Stdout;
  }
  TORCH_CHECK_VALUE(
      name == "stderr",
      "ConsoleHandler: stream must be \"stdout\" or \"stderr\", got \"",
      name,
      "\"");
  return ConsoleStream::Stderr;
}

const char* consoleStreamName(ConsoleStream stream) noexcept {
  return stream == ConsoleStream::Stdout ? "stdout" : "stderr";
}

ConsoleHandler::ConsoleHandler(
    ConsoleStream stream,
    std::vector<std::string> eventNames)
    : Sink(std::string("ConsoleHandler(") + consoleStreamName(stream) + ")"),
      stream_(stream),
      filter_(std::move(eventNames)) {}

ConsoleHandler::~ConsoleHandler() {
  close();
}

void ConsoleHandler::handle(const Event& event) {
  if (closed() || !filter_.accepts(event.name)) {
    return;
  }
  if (readerGone_.load(std::memory_order_relaxed)) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  thread_local std::string line;
  line.clear();
  text::appendConsoleLine(line, event, distributedRank());
  const int fd = stream_ == ConsoleStream::Stdout ? STDOUT_FILENO : STDERR_FILENO;
  int error;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    error = writeLine(fd, line);
  }
  if (error == 0) {
    return;
  }
  dropped_.fetch_add(1, std::memory_order_relaxed);
  // Reported through the background sink: this runs on whichever thread
  // logged, and Python's log_event does not turn c10 warnings into its own.
  if (error == EPIPE) {
    // `| head` has read its fill: nothing will read this stream again.
    readerGone_.store(true, std::memory_order_relaxed);
    problemLog().report(
        "reader gone",
        std::string("the reader of ") + consoleStreamName(stream_) +
            " went away (EPIPE: nothing reads the pipe any more); further "
            "lines are dropped (dropped() counts them)",
        ProblemLog::WarnVia::kBackgroundSink);
  } else {
    problemLog().report(
        "write " + std::to_string(error),
        std::string("cannot write to ") + consoleStreamName(stream_) + ": " +
            std::strerror(error) + " (errno " + std::to_string(error) +
            "); lines are dropped while it fails",
        ProblemLog::WarnVia::kBackgroundSink);
  }
}

int64_t ConsoleHandler::dropped() const {
  return dropped_.load(std::memory_order_relaxed);
}

} // namespace torch_monitor::sinks
