#include <torch_monitor/sinks/console_handler.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>

#include <pthread.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <torch_monitor/sinks/text_format.h>

namespace torch_monitor::sinks {
namespace {

// write(2) of the whole line with SIGPIPE held back: a console handler must
// not kill a C++ training program because `| head` closed the pipe. Returns
// 0 or the errno.
int writeWithoutSigpipe(int fd, const std::string& line) {
  sigset_t pipeOnly;
  sigset_t previous;
  sigemptyset(&pipeOnly);
  sigaddset(&pipeOnly, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipeOnly, &previous);
  sigset_t pendingBefore;
  sigpending(&pendingBefore);
  const bool wasPending = sigismember(&pendingBefore, SIGPIPE) == 1;

  int error = 0;
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      error = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (error == EPIPE && !wasPending) {
    // Consume the SIGPIPE this write raised, and only that one.
    const struct timespec zero {};
    while (sigtimedwait(&pipeOnly, nullptr, &zero) == -1 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return error;
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
  thread_local std::string line;
  line.clear();
  text::appendConsoleLine(line, event);
  const int fd = stream_ == ConsoleStream::Stdout ? STDOUT_FILENO : STDERR_FILENO;
  int error;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    error = writeWithoutSigpipe(fd, line);
  }
  if (error != 0) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    problemLog().report(
        "write " + std::to_string(error),
        std::string("cannot write to ") + consoleStreamName(stream_) + ": " +
            std::strerror(error) + " (errno " + std::to_string(error) +
            "); lines are dropped while it fails");
  }
}

int64_t ConsoleHandler::dropped() const {
  return dropped_.load(std::memory_order_relaxed);
}

} // namespace torch_monitor::sinks
