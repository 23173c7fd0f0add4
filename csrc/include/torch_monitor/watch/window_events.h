#pragma once

// The events a watch's closed window logs, from its rows: the same for a
// window of this process (Recorder) and for one merged across ranks
// (watch/payload.h).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>
#include <torch_monitor/watch/recorder.h>

namespace torch_monitor::watch {

// The events of one window: a "torch_monitor.Watch" event with the
// statistics of every key that saw an observation (plus the memory
// counters); nothing when no key saw anything. (Non-finite values are
// reported by the recorder that saw them, as soon as it can: a rank's
// alarm, not merged.) `rows` holds keys.size() rows of column::kColumns numbers;
// `ranks`, for a window merged across ranks, how many it covers
// ("watch.ranks").
// Thread safety: reads its arguments only; any thread.
TORCH_MONITOR_API std::vector<Event> windowEvents(
    const std::vector<Key>& keys,
    const double* rows,
    std::optional<int64_t> step,
    const std::vector<std::pair<std::string, int64_t>>& memory,
    std::optional<int64_t> ranks);

} // namespace torch_monitor::watch
