#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>
#include <torch_monitor/sinks/sink.h>

namespace torch_monitor::sinks {

enum class ConsoleStream { Stdout, Stderr };

// Prints one human-readable line per event to stdout or stderr:
//   2024-05-01T12:34:56.123456Z torch.monitor.Stat loss.count=10 loss.mean=0.25
// (UTC time, name, data sorted by key; control characters and invalid UTF-8
// escaped so an event never spans two lines). Each line is one write(2) on
// the file descriptor, unbuffered and not interleaved with other events'
// lines; C++ iostreams and Python's sys.stdout buffer separately. A failing
// stream (a full disk, /dev/full) is warned about once per errno and the
// line dropped and counted; when the stream is a regular file, the part of
// the line that reached it is cut off again, so the file never ends inside
// a line. A closed pipe (`| head`
// has exited) never raises SIGPIPE: it is warned about once and every later
// line is dropped and counted. The stream is the process' own fd 1 or 2 and
// stays blocking: a reader that stalls stalls this handler as it stalls
// print() or std::cout.
// Thread safety: no concurrent call to any API of this type causes a data
// race; handle() may run on many threads at once.
class TORCH_MONITOR_API ConsoleHandler final : public Sink {
 public:
  explicit ConsoleHandler(
      ConsoleStream stream = ConsoleStream::Stderr,
      std::vector<std::string> eventNames = {});
  ~ConsoleHandler() override;

  void handle(const Event& event) override;
  int64_t dropped() const override;

  ConsoleStream stream() const noexcept {
    return stream_;
  }
  const std::vector<std::string>& eventNames() const noexcept {
    return filter_.names();
  }

 private:
  const ConsoleStream stream_;
  const EventNameFilter filter_;
  std::mutex mutex_; // one line at a time
  std::atomic<int64_t> dropped_{0};
  std::atomic<bool> readerGone_{false};
  // mutex_ may be held across a write to a stalled stream and guards no
  // data: fork() does not wait for it, the child gets it unlocked.
  torch_monitor::detail::ForkSafeLocks forkLocks_{
      torch_monitor::detail::ForkLockMode::kResetInChild, {&mutex_}};
};

// "stdout" / "stderr" <-> ConsoleStream; an unknown name is a
// c10::ValueError.
TORCH_MONITOR_API ConsoleStream consoleStreamFromName(const std::string& name);
TORCH_MONITOR_API const char* consoleStreamName(ConsoleStream stream) noexcept;

} // namespace torch_monitor::sinks
