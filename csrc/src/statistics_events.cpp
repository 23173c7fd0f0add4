#include <torch_monitor/statistics_events.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include <torch_monitor/event.h>

namespace torch_monitor {
namespace {

using Entries = std::vector<std::pair<std::string, StatisticSuffix>>;

// Copy on write: a registration publishes a new list, readers load the
// pointer. Every list ever published (one per registration, a handful per
// process) is kept in `published`, so a reader never holds a freed one (and
// a leak checker sees them owned).
struct Registry {
  Registry() {
    published.emplace_back(
        new Entries{{kStatEventName, StatisticSuffix::kAggregation}});
    entries.store(published.back().get(), std::memory_order_release);
  }
  std::mutex writing;
  std::vector<std::unique_ptr<const Entries>> published; // guarded by writing
  std::atomic<const Entries*> entries{nullptr};
};

Registry& registry() {
  static Registry* r = new Registry(); // never destroyed: sinks ask at exit
  return *r;
}

} // namespace

void registerStatisticsEvent(
    const std::string& name,
    StatisticSuffix suffix) {
  Registry& r = registry();
  std::lock_guard<std::mutex> guard(r.writing);
  const Entries* current = r.entries.load(std::memory_order_acquire);
  for (const auto& [known, knownSuffix] : *current) {
    if (known == name) {
      TORCH_CHECK_VALUE(
          knownSuffix == suffix,
          "event '",
          name,
          "' is registered already as statistics whose keys end otherwise");
      return;
    }
  }
  auto next = std::make_unique<Entries>(*current);
  next->emplace_back(name, suffix);
  r.published.push_back(std::move(next));
  r.entries.store(r.published.back().get(), std::memory_order_release);
}

std::optional<StatisticSuffix> statisticsEvent(
    const std::string& name) noexcept {
  for (const auto& [known, suffix] :
       *registry().entries.load(std::memory_order_acquire)) {
    if (known == name) {
      return suffix;
    }
  }
  return std::nullopt;
}

std::vector<std::string> statisticsEventNames() {
  std::vector<std::string> names;
  for (const auto& entry : *registry().entries.load(std::memory_order_acquire)) {
    names.push_back(entry.first);
  }
  return names;
}

} // namespace torch_monitor
