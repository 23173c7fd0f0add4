#pragma once

// Events of windowed statistics: their data maps "<series>.<statistic>" to
// a number. A Stat's window ("torch.monitor.Stat") is one; other producers
// register their own (a watch does, watch/recorder.h). The sinks that plot
// or expose statistics take every event registered here: TensorBoardWriter
// by default, and the Prometheus sinks, which read the series and the
// statistic from each key. They learn of a producer by its registration,
// never by its name.

#include <optional>
#include <string>
#include <vector>

#include <torch_monitor/export.h>

namespace torch_monitor {

// Where a key's statistic starts.
enum class StatisticSuffix {
  // After the last dot that starts an aggregation name ("loss.mean":
  // series "loss", statistic "mean"; a Stat's keys).
  kAggregation,
  // After the last dot ("fc1.weight.grad.rms": series "fc1.weight.grad").
  kLastPart,
};

// Registers `name` as an event of windowed statistics whose keys end as
// `suffix` says. Idempotent for the same pair; a name registered with
// another suffix throws c10::ValueError.
// Thread safety: every function here may be called from any thread.
TORCH_MONITOR_API void registerStatisticsEvent(
    const std::string& name,
    StatisticSuffix suffix);

// How the keys of event `name` end, or nullopt when it is not registered.
// Lock-free: sinks ask for every event they get.
TORCH_MONITOR_API std::optional<StatisticSuffix> statisticsEvent(
    const std::string& name) noexcept;

// Every registered name, in registration order (the Stat's first).
TORCH_MONITOR_API std::vector<std::string> statisticsEventNames();

} // namespace torch_monitor
