#include <torch_monitor/sinks/sink.h>

#include <torch_monitor/detail/text.h>

#include <cmath>

#include <c10/util/Exception.h>

#include <torch_monitor/background_warnings.h>

#include <torch_monitor/sinks/format/text.h>

namespace torch_monitor::sinks {

ProblemLog::ProblemLog(std::string owner) : owner_(std::move(owner)) {}

bool ProblemLog::report(
    const std::string& key,
    const std::string& message,
    WarnVia via) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (!keys_.insert(key).second) {
      return false;
    }
    messages_.push_back(owner_ + ": " + message);
  }
  // Outside the lock: a warning handler (Python's, say) may run anything.
  if (via == WarnVia::kBackgroundSink) {
    torch_monitor::detail::warnThroughBackgroundSink(owner_ + ": " + message);
  } else {
    TORCH_WARN(owner_, ": ", message);
  }
  return true;
}

std::vector<std::string> ProblemLog::messages() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return messages_;
}

Sink::Sink(std::string description) : problems_(std::move(description)) {}

Sink::~Sink() = default;

void Sink::registerSelf() {
  std::shared_ptr<Sink> self = weak_from_this().lock();
  TORCH_CHECK_VALUE(
      self != nullptr,
      description(),
      ": registerSelf() needs the sink to be owned by a std::shared_ptr; "
      "create it with std::make_shared");
  std::lock_guard<std::mutex> guard(registrationMutex_);
  TORCH_CHECK_VALUE(
      !registrationClosed_, description(), ": cannot register a closed sink");
  if (!registeredSelf_) {
    registerEventHandler(std::move(self));
    registeredSelf_ = true;
  }
}

void Sink::unregisterSelf() {
  std::shared_ptr<Sink> self = weak_from_this().lock();
  std::lock_guard<std::mutex> guard(registrationMutex_);
  if (registeredSelf_ && self != nullptr) {
    unregisterEventHandler(self);
    registeredSelf_ = false;
  }
}

bool Sink::registeredSelf() const {
  std::lock_guard<std::mutex> guard(registrationMutex_);
  return registeredSelf_;
}

void Sink::close() {
  // A registered-by-itself sink is owned by the registry, so the destructor
  // never gets here while registered: unregistering is for explicit close().
  // Registration is refused first, so a registerSelf() racing with this
  // either fails or lands before the unregistering below.
  {
    std::lock_guard<std::mutex> guard(registrationMutex_);
    registrationClosed_ = true;
  }
  unregisterSelf();
  std::lock_guard<std::mutex> guard(closeMutex_);
  if (closed_.load(std::memory_order_acquire)) {
    return;
  }
  closed_.store(true, std::memory_order_release);
  closeOutput();
}

bool Sink::closed() const noexcept {
  return closed_.load(std::memory_order_acquire);
}

std::chrono::milliseconds flushIntervalFromSeconds(double seconds) {
  TORCH_CHECK_VALUE(
      std::isfinite(seconds) && seconds >= 0.001,
      "flush_interval must be a number of seconds >= 0.001, got ",
      seconds);
  TORCH_CHECK_VALUE(
      seconds <= 86400.0 * 365,
      "flush_interval must be at most a year of seconds, got ",
      seconds);
  return std::chrono::milliseconds(std::llround(seconds * 1000.0));
}

void checkPathText(const std::string& path, const char* what) {
  // A NUL would cut the path short in open(2); other invalid text could not
  // be shown back to the user.
  torch_monitor::detail::checkText(path, what);
}

} // namespace torch_monitor::sinks
