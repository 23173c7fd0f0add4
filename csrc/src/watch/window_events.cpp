#include <torch_monitor/watch/window_events.h>

#include <chrono>

#include <torch_monitor/watch/statistics.h>

namespace torch_monitor::watch {

using column::kColumns;

std::vector<Event> windowEvents(
    const std::vector<Key>& keys,
    const double* rows,
    std::optional<int64_t> step,
    const std::vector<std::pair<std::string, int64_t>>& memory,
    std::optional<int64_t> ranks) {
  Event watch;
  watch.name = kEventName;
  watch.timestamp = std::chrono::system_clock::now();
  watch.step = step;
  Event nonFinite = watch;
  nonFinite.name = kNonFiniteEventName;
  watch.data.reserve(keys.size() * 9 + memory.size() + 1);
  for (size_t k = 0; k < keys.size(); ++k) {
    const double* row = rows + k * kColumns;
    const std::string name = keys[k].name();
    appendStatistics(watch.data, name, row, keys[k].kind == Kind::Update);
    if (row[column::kNonFinite] > 0.0) {
      nonFinite.data.emplace(
          name, static_cast<int64_t>(-row[column::kNegFirstNonFinite]));
    }
  }
  std::vector<Event> events;
  if (watch.data.empty()) {
    return events;
  }
  for (const auto& [name, value] : memory) {
    watch.data.emplace(name, value);
  }
  if (ranks) {
    // Keyed like the statistics: one TensorBoard tag of its own.
    watch.data.emplace("watch.ranks", *ranks);
  }
  events.push_back(std::move(watch));
  if (!nonFinite.data.empty()) {
    events.push_back(std::move(nonFinite));
  }
  return events;
}

} // namespace torch_monitor::watch
