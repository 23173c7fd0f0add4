#include <torch_monitor/sinks/console_handler.h>

#include <cerrno>
#include <cstring>

#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <torch_monitor/sinks/detail/write_without_sigpipe.h>
#include <torch_monitor/sinks/format/text.h>

namespace torch_monitor::sinks {
namespace {

// The whole line, in as many write(2)s as it takes; 0 or the errno. Each
// write holds SIGPIPE back: a console handler must not kill a C++ training
// program because `| head` closed the pipe.
// A line the stream took only part of (a full disk) is cut off again when
// the stream is a regular file, so that it never ends inside a line.
int writeLine(int fd, const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = detail::writeWithoutSigpipe(
        fd, line.data() + done, line.size() - done);
    if (n < 0) {
      const int error = errno;
      if (error == EINTR) {
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
  text::appendConsoleLine(line, event);
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
