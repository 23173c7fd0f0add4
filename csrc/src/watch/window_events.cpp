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
  watch.data.reserve(keys.size() * 9 + memory.size() + 1);
  for (size_t k = 0; k < keys.size(); ++k) {
    const double* row = rows + k * kColumns;
    appendStatistics(watch.data, keys[k].name(), row, keys[k].kind == Kind::Update);
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
  return events;
}

} // namespace torch_monitor::watch
