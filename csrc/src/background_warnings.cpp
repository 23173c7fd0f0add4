#include <torch_monitor/background_warnings.h>

#include <atomic>

namespace torch_monitor {
namespace {

std::atomic<BackgroundWarningSink> installedSink{nullptr};

// The thread-local c10 handler of the library's threads: hands each warning
// to the installed sink, else to c10's default (stderr).
class BackgroundWarningHandler : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    if (BackgroundWarningSink sink =
            installedSink.load(std::memory_order_acquire)) {
      sink(warning);
    } else {
      c10::WarningHandler::process(warning);
    }
  }
};

} // namespace

void setBackgroundWarningSink(BackgroundWarningSink sink) {
  installedSink.store(sink, std::memory_order_release);
}

namespace detail {

namespace {

// Stateless and never destroyed: threads outliving static destruction may
// still warn. Built when the library loads, not by the first library thread
// that starts: a fork() while the parent's new window timer was still inside
// a lazy initialisation here left the child's timer waiting forever on the
// initialisation guard (seen as WindowTimerFork.ChildClosesItsTimedWindowsOnTime
// failing at its first fork, about 1 run in 100 under load).
c10::WarningHandler* const handlerBuiltAtLoad = new BackgroundWarningHandler();

} // namespace

c10::WarningHandler* backgroundWarningHandler() {
  return handlerBuiltAtLoad;
}

bool hasBackgroundWarningSink() noexcept {
  return installedSink.load(std::memory_order_acquire) != nullptr;
}

void routeThreadWarningsToBackgroundSink() {
  c10::WarningUtils::set_warning_handler(backgroundWarningHandler());
}

} // namespace detail
} // namespace torch_monitor
