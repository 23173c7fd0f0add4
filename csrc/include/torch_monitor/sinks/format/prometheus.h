#pragma once

// The Prometheus text exposition format, version 0.0.4, for the Prometheus
// sinks: metric names, label escaping, sample values, and the snapshot of
// Stat windows that a scrape or a .prom file shows.
// https://prometheus.io/docs/instrumenting/exposition_formats/

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <torch_monitor/event.h>
#include <torch_monitor/detail/fork_safe_locks.h>
#include <torch_monitor/export.h>

namespace torch_monitor::sinks::prometheus {

// Label (name, value) pairs, in the order written.
using Labels = std::vector<std::pair<std::string, std::string>>;

// "torch_monitor_" + the Stat name with every character outside
// [a-zA-Z0-9_:] replaced by '_'
// ("loss/train.x" -> "torch_monitor_loss_train_x").
TORCH_MONITOR_API std::string metricName(std::string_view statName);

// Appends a label value's text between its quotes: invalid UTF-8 repaired
// (U+FFFD), then '\' , '"' and newline escaped as the format requires.
TORCH_MONITOR_API void appendLabelValue(
    std::string& out,
    std::string_view value);

// Appends a HELP line's text: invalid UTF-8 repaired, '\' and newline escaped.
TORCH_MONITOR_API void appendHelpText(std::string& out, std::string_view text);

// Appends a sample value as Prometheus reads it: "NaN", "+Inf", "-Inf", or
// the shortest decimal that reads back to the same double.
TORCH_MONITOR_API void appendSampleValue(std::string& out, double value);

// The user's constant labels, checked: each name matches
// [a-zA-Z_][a-zA-Z0-9_]*, does not start with "__" (reserved by Prometheus)
// and is not "aggregation" (the sinks' own label); values are valid UTF-8.
// Adds label "rank" when this process has one (process_rank.h) and `labels`
// has none. Returns them sorted by name; throws c10::ValueError naming the
// bad label.
TORCH_MONITOR_API Labels checkedLabels(
    const std::map<std::string, std::string>& labels);

// Whether `event` is a closed window the Prometheus sinks show: an event of
// statistics (statistics_events.h), a Stat's ("torch.monitor.Stat") or any
// other registered one (a watch's, whose keys "<path>.<kind>.<statistic>"
// read as stat "<path>.<kind>" and aggregation "<statistic>").
TORCH_MONITOR_API bool isWindowEvent(const Event& event);

// The last closed window of every Stat seen in window events (above), and
// each Stat's count summed over all its windows. A Stat's event carries
// "<stat name>.<aggregation>" keys; other events and keys are ignored.
// Thread safety: no concurrent call to any API of this type causes a data
// race; update() and render() may run on different threads.
class TORCH_MONITOR_API Snapshot {
 public:
  // Takes the values of one Stat event (any other event is ignored).
  void update(const Event& event);

  // The exposition text: per Stat, a gauge family `torch_monitor_<name>`
  // with one sample per aggregation (label aggregation="mean", ...), and
  // for a Stat with COUNT a counter `torch_monitor_<name>_count_total`.
  // `labels` come first on every sample. Two Stats whose names give the
  // same family name cannot both be shown: the one sorted later is left
  // out and its name added to `clashes` (when given).
  std::string render(
      const Labels& labels,
      std::vector<std::string>* clashes = nullptr) const;

  // Stats seen so far.
  size_t size() const;

 private:
  // One Stat's last window. Immutable once published, so that render()
  // holds the lock only to copy pointers, never while formatting: a scrape
  // cannot delay the window close that calls update().
  struct Window {
    std::string stat;
    // aggregation name -> value (double or int64_t), sorted by name
    std::map<std::string, std::variant<double, int64_t>> values;
    bool hasCount = false;
    // COUNT summed over all windows, in double as Prometheus keeps it: an
    // int64 sum overflows (and a double count converts to int64 only in
    // range). Only finite counts >= 0 are added: a counter never goes down.
    double countTotal = 0;
    // The event that carried it: "torch.monitor.Stat", or another producer's
    // (its HELP line names it).
    std::string source;
  };
  mutable std::mutex mutex_;
  // By Stat name, so that the output is sorted.
  std::map<std::string, std::shared_ptr<const Window>> stats_;
  // Held across fork(): a forked child finds the map whole and unlocked.
  torch_monitor::detail::ForkSafeLocks forkLocks_{
      torch_monitor::detail::ForkLockMode::kInner, {&mutex_}};
};

} // namespace torch_monitor::sinks::prometheus
