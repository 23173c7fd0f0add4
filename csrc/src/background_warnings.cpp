#include <torch_monitor/background_warnings.h>

#include <atomic>
#include <optional>

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

c10::WarningHandler* backgroundWarningHandler() {
  // Stateless and never destroyed: threads outliving static destruction may
  // still warn.
  static auto* handler = new BackgroundWarningHandler();
  return handler;
}

namespace {

// Built when the library loads, not by the first library thread that warns:
// a fork() while the new window timer was inside this lazy initialisation
// left the child's timer blocked forever on its guard (docs/design.md, "The
// library's own threads").
const bool kHandlerBuiltAtLoad = (backgroundWarningHandler(), true);

} // namespace

bool hasBackgroundWarningSink() noexcept {
  return installedSink.load(std::memory_order_acquire) != nullptr;
}

void warnThroughBackgroundSink(const std::string& message) {
  std::optional<c10::WarningUtils::WarningHandlerGuard> route;
  if (hasBackgroundWarningSink()) {
    route.emplace(backgroundWarningHandler());
  }
  TORCH_WARN(message);
}

__thread bool libraryThread __attribute__((tls_model("initial-exec"))) =
    false;

void routeThreadWarningsToBackgroundSink() {
  libraryThread = true;
  c10::WarningUtils::set_warning_handler(backgroundWarningHandler());
}

} // namespace detail
} // namespace torch_monitor
