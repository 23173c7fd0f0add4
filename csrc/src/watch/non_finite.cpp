#include <torch_monitor/watch/non_finite.h>

#include <atomic>
#include <iterator>

#include <c10/util/Exception.h>

namespace torch_monitor::watch {
namespace {

constexpr std::string_view kNames[] = {"log", "warn", "raise"};
std::atomic<void (*)(const std::string&)> raiser{nullptr};

} // namespace

std::string_view onNonFiniteName(OnNonFinite action) noexcept {
  return kNames[static_cast<int>(action)];
}

OnNonFinite onNonFiniteFromName(std::string_view name) {
  for (size_t i = 0; i < std::size(kNames); ++i) {
    if (name == kNames[i]) {
      return static_cast<OnNonFinite>(i);
    }
  }
  TORCH_CHECK_VALUE(
      false,
      "torch_monitor.watch: on_nonfinite must be \"log\", \"warn\" or "
      "\"raise\" (Python: also None or a callable), got '",
      name,
      "'");
}

void raiseNonFinite(const std::string& message) {
  if (auto* raise = raiser.load(std::memory_order_acquire)) {
    raise(message);
  }
  TORCH_CHECK(false, message);
}

void setNonFiniteRaiser(void (*raise)(const std::string&)) {
  raiser.store(raise, std::memory_order_release);
}

} // namespace torch_monitor::watch
