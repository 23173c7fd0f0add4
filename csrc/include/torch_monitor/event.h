#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>

#include <torch_monitor/export.h>

namespace torch_monitor {

// The value types an event can carry; the same alternatives, in the same
// order, as torch::monitor::data_value_t.
using data_value_t = std::variant<std::string, double, int64_t, bool>;

// A named, timestamped record handed to every registered EventHandler.
// Thread safety: a plain value type; concurrent reads are safe, writes need
// external synchronisation.
struct Event {
  std::string name;
  std::chrono::time_point<std::chrono::system_clock> timestamp;
  std::unordered_map<std::string, data_value_t> data;
  // The training step the event belongs to (see step.h), or nothing. A
  // Stat's event carries the step current when its window closed; sinks
  // write points at it.
  std::optional<int64_t> step;

  // Equal fields; a NaN in the data equals a NaN (an event equals its own
  // copy, a logged loss that went NaN included).
  friend bool operator==(const Event& a, const Event& b) {
    return a.name == b.name && a.timestamp == b.timestamp &&
        a.step == b.step && sameData(a.data, b.data);
  }
  friend bool operator!=(const Event& a, const Event& b) {
    return !(a == b);
  }

 private:
  static bool sameData(
      const std::unordered_map<std::string, data_value_t>& a,
      const std::unordered_map<std::string, data_value_t>& b) {
    if (a.size() != b.size()) {
      return false;
    }
    for (const auto& [key, value] : a) {
      const auto it = b.find(key);
      if (it == b.end()) {
        return false;
      }
      const auto* x = std::get_if<double>(&value);
      const auto* y = std::get_if<double>(&it->second);
      const bool bothNaN = x != nullptr && y != nullptr && *x != *x && *y != *y;
      if (!bothNaN && !(value == it->second)) {
        return false;
      }
    }
    return true;
  }
};

// Timestamps as whole microseconds since the Unix epoch, the precision every
// face of the project (Python datetime, pickled state, sinks) keeps.
inline int64_t toEpochMicros(
    std::chrono::time_point<std::chrono::system_clock> t) noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             t.time_since_epoch())
      .count();
}

// The instants a system_clock time_point can hold (nanoseconds in an int64:
// 1677-09-21 00:12:43.145225 to 2262-04-11 23:47:16.854775 UTC), in
// microseconds since the epoch.
inline constexpr int64_t kMinEpochMicros =
    std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::system_clock::duration::min())
        .count();
inline constexpr int64_t kMaxEpochMicros =
    std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::system_clock::duration::max())
        .count();

// Throws c10::ValueError for a value outside [kMinEpochMicros,
// kMaxEpochMicros], which would otherwise wrap to an unrelated date.
TORCH_MONITOR_API std::chrono::time_point<std::chrono::system_clock>
fromEpochMicros(int64_t micros);

// Name of the events emitted when a Stat window closes (kept identical to
// torch.monitor so handlers written for it keep matching). Other producers
// of statistics register theirs (statistics_events.h).
inline constexpr const char* kStatEventName = "torch.monitor.Stat";

} // namespace torch_monitor
