#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch_monitor/engine/accumulator.h>
#include <torch_monitor/event.h>
#include <torch_monitor/export.h>

namespace torch_monitor {
struct RankGroup;
} // namespace torch_monitor

namespace torch_monitor::detail {

// What a synced Stat's windows are on one rank: ranks whose Stats of one
// name differ (a Stat here, an IntStat there; windows of 10 steps here, of
// 20 there) must never be merged, so every share carries it.
// Thread safety: a plain value type.
struct WindowShape {
  bool integer = false; // Stat<int64_t> (IntStat), else Stat<double>
  bool steps = false; // windows of training steps, else of milliseconds
  int64_t length = 0; // steps or milliseconds

  bool operator==(const WindowShape& other) const noexcept {
    return integer == other.integer && steps == other.steps &&
        length == other.length;
  }
  bool operator!=(const WindowShape& other) const noexcept {
    return !(*this == other);
  }
  // "a IntStat with window_steps=20", for messages.
  std::string describe() const {
    return std::string(integer ? "a IntStat" : "a Stat") +
        (steps ? " with window_steps=" + std::to_string(length)
               : " with window_size=" + std::to_string(length) + " ms");
  }
};

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
  WindowShape shape;

  template <typename T>
  static RankShare of(
      const Accumulator<T>& window,
      std::optional<int64_t> s,
      WindowShape shape) {
    RankShare share;
    share.count = window.count;
    share.sum = bitsOf(window.sum);
    share.min = bitsOf(window.min);
    share.max = bitsOf(window.max);
    share.value = bitsOf(window.value);
    share.step = s.value_or(-1);
    share.shape = shape;
    return share;
  }
  // The "empty" marker of a window this rank had no samples in.
  RankShare emptyMarker() const {
    RankShare marker;
    marker.shape = shape;
    return marker;
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
// sync thread, so it must not refer to the Stat (which may be gone). A
// window that cannot be merged is logged on its own rank as a merge of that
// rank's share alone.
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
// thread stopped at exit): the caller then logs it locally. A window posted
// that the root does not merge (the root is gone or stalled, the Store
// fails, the window came too late or the ranks' Stats differ) is logged
// locally by the rank sync thread, with a warning.
TORCH_MONITOR_API bool postRankWindow(
    const void* stat,
    const std::string& name,
    int64_t index,
    const RankShare& share,
    MergedEventBuilder build);

// postRankWindow for any owner of windows (a watch posts all its keys'
// rows as one payload): `payload` is this rank's window in the owner's own
// format (at least two bytes: one-byte values are the thread's markers),
// `emptyMarker` what is posted for the windows it skipped. `what` names the
// owner in warnings ("Stat 'loss'"); `shape` says what must be the same on
// every rank for their windows to merge (WindowShape::describe()): rank 0
// refuses a window of another shape, and its rank logs it itself. The
// builder merges (on rank 0) or, for a window rank 0 does not take, logs
// this rank's payload alone. `owner` must have been enabled with
// enableRankSync, and `name` be unique among the group's synced owners.
// Rank 0 merges each owner's windows in order: a window is logged only
// after every earlier window of the same owner was (merged or given up at
// its deadline), so the merged points of one stream reach the sinks in step
// order.
TORCH_MONITOR_API bool postRankPayload(
    const void* owner,
    const std::string& name,
    const std::string& what,
    int64_t index,
    std::vector<uint8_t> payload,
    std::vector<uint8_t> emptyMarker,
    std::string shape,
    MergedPayloadBuilder build);

// The process default group (rank_sync.h's setDefaultRankGroup() and
// defaultRankGroup(), which check it first).
TORCH_MONITOR_API void storeDefaultRankGroup(
    std::shared_ptr<const RankGroup> group);
TORCH_MONITOR_API std::shared_ptr<const RankGroup> loadDefaultRankGroup();
// rank_sync.h's flushRankSync().
TORCH_MONITOR_API void waitForRankSync() noexcept;
// rank_sync.h's stopRankSync().
TORCH_MONITOR_API void stopRankSyncThread() noexcept;

} // namespace torch_monitor::detail
