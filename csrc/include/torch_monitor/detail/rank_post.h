#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch_monitor/detail/accumulator.h>
#include <torch_monitor/event.h>
#include <torch_monitor/export.h>

namespace torch_monitor {
struct RankGroup;
} // namespace torch_monitor

namespace torch_monitor::detail {

// One rank's summary of one window, as posted to the group's Store (a few
// bytes, see encode/decode in rank_sync.cpp). Aggregates are kept as their
// bit patterns so one layout serves Stat<double> and Stat<int64_t>.
// Thread safety: a plain value type.
struct RankShare {
  int64_t count = 0; // 0: an "empty" marker, the rank had no samples
  uint64_t sum = 0;
  uint64_t min = 0;
  uint64_t max = 0;
  uint64_t value = 0;
  int64_t step = -1; // the rank's step when it closed the window; -1: none

  template <typename T>
  static RankShare of(const Accumulator<T>& window, std::optional<int64_t> s) {
    RankShare share;
    share.count = window.count;
    share.sum = bitsOf(window.sum);
    share.min = bitsOf(window.min);
    share.max = bitsOf(window.max);
    share.value = bitsOf(window.value);
    share.step = s.value_or(-1);
    return share;
  }
  template <typename T>
  Accumulator<T> accumulator() const {
    Accumulator<T> window;
    window.count = count;
    window.sum = fromBits<T>(sum);
    window.min = fromBits<T>(min);
    window.max = fromBits<T>(max);
    window.value = fromBits<T>(value);
    return window;
  }

 private:
  template <typename T>
  static uint64_t bitsOf(T v) noexcept {
    static_assert(sizeof(T) == sizeof(uint64_t));
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return bits;
  }
  template <typename T>
  static T fromBits(uint64_t bits) noexcept {
    T v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
};

// Builds the merged event from the shares that arrived (ascending rank
// order, at least one); nothing when none holds samples. Runs on the rank
// sync thread, so it must not refer to the Stat (which may be gone).
using MergedEventBuilder =
    std::function<std::optional<Event>(const std::vector<RankShare>&)>;

// The same for a window posted as bytes of the poster's own format
// (postRankPayload): the values of the ranks that arrived, ascending rank
// order, an empty marker as posted; the events to log (any number).
using MergedPayloadBuilder = std::function<std::vector<Event>(
    const std::vector<std::vector<uint8_t>>&)>;

// The rank sync thread: posts windows of synced Stats to their group's
// Store and, on the root, merges and logs them (see rank_sync.h and
// docs/distributed.md). Thread safety: every function may be called from
// any thread, concurrently.

// Records `stat`'s group (nullptr: the process default group).
TORCH_MONITOR_API void enableRankSync(
    const void* stat,
    std::shared_ptr<const RankGroup> group);
// Forgets `stat`; windows it already posted are still merged.
TORCH_MONITOR_API void disableRankSync(const void* stat) noexcept;
// Queues `stat`'s closed window `index` for posting (and, on the root,
// merging), with empty markers for the windows it skipped since its last
// post. Never blocks on the network. Returns false when the window cannot
// be synced (no default group, a forked child, an index already posted, the
// thread stopped at exit): the caller then logs it locally.
TORCH_MONITOR_API bool postRankWindow(
    const void* stat,
    const std::string& name,
    int64_t index,
    const RankShare& share,
    MergedEventBuilder build);

// postRankWindow for any owner of windows (a watch posts all its keys'
// rows as one payload): `payload` is this rank's window, `emptyMarker` what
// is posted for the windows it skipped. `owner` must have been enabled with
// enableRankSync, and `name` be unique among the group's synced owners. The
// root merges each owner's windows in order: a window is logged only after
// every earlier window of the same owner was (merged or given up at its
// deadline), so the merged points of one stream reach the sinks in step
// order.
TORCH_MONITOR_API bool postRankPayload(
    const void* owner,
    const std::string& name,
    int64_t index,
    std::vector<uint8_t> payload,
    std::vector<uint8_t> emptyMarker,
    MergedPayloadBuilder build);

} // namespace torch_monitor::detail
