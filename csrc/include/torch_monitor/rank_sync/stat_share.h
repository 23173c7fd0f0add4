#pragma once

// A synced Stat's window as the ranks exchange it: its shape (what must be
// the same on every rank for windows to merge), one rank's share of the
// window, its bytes on the Store, and the merge of every rank's shares into
// one window (docs/distributed.md, "What the merged window holds").

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <torch_monitor/engine/accumulator.h>
#include <torch_monitor/event.h>
#include <torch_monitor/export.h>

namespace torch_monitor::detail {

// What a synced Stat's windows are on one rank: ranks whose Stats of one
// name differ in any of it must never be merged, so every share carries it
// (and rank 0 compares describe()). Each field changes what a window's
// numbers mean: the type of its samples, which samples it spans (the
// window), which aggregates it reports (the merged event carries rank 0's
// only, so another rank's choice would be dropped without a word) and which
// samples it keeps (a capped window holds its first maxSamples only, so a
// merge of ranks with other caps would weigh each rank by its cap, not by
// its samples).
// Thread safety: a plain value type.
struct WindowShape {
  static constexpr int64_t kUncapped = std::numeric_limits<int64_t>::max();

  bool integer = false; // Stat<int64_t> (IntStat), else Stat<double>
  bool steps = false; // windows of training steps, else of milliseconds
  int64_t length = 0; // steps or milliseconds
  uint8_t aggregations = 0; // bit a set: Aggregation a is reported
  int64_t maxSamples = kUncapped;

  bool operator==(const WindowShape& other) const noexcept {
    return integer == other.integer && steps == other.steps &&
        length == other.length && aggregations == other.aggregations &&
        maxSamples == other.maxSamples;
  }
  bool operator!=(const WindowShape& other) const noexcept {
    return !(*this == other);
  }
  // "a IntStat with window_steps=20, aggregations=[mean, max]" (and
  // ", max_samples=N" when capped), for messages.
  TORCH_MONITOR_API std::string describe() const;
};

// One rank's summary of one window, as posted to the group's Store (a few
// bytes, see encode/decode in stat_share.cpp). Aggregates are kept as their
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

// A share's bytes on the Store (72: nine 64-bit fields, the shape's
// included), as postRankWindow posts them.
TORCH_MONITOR_API std::vector<uint8_t> encodeShare(const RankShare& share);

// The shares of one window merged: what one process fed every rank's
// samples of the window holds.
// Thread safety: a plain value type.
template <typename T>
struct MergedShares {
  Accumulator<T> values;
  // The earliest step at which a rank with samples closed the window (a
  // rank closes it lazily, at its next add); nothing when none says.
  std::optional<int64_t> step;
  // The ranks the window covers, ranks without samples included.
  int64_t ranks = 0;
};

// Merges the shares that arrived (ascending rank order). The ranks merge
// from the highest to the lowest with equal times, so VALUE is the lowest
// rank's that has samples (Accumulator::merge keeps the later share's value
// on a tie).
template <typename T>
MergedShares<T> mergeShares(const std::vector<RankShare>& shares) {
  MergedShares<T> merged;
  for (auto it = shares.rbegin(); it != shares.rend(); ++it) {
    merged.values.merge(it->template accumulator<T>());
    if (it->count > 0 && it->step >= 0) {
      merged.step = std::min(merged.step.value_or(it->step), it->step);
    }
  }
  merged.ranks = int64_t(shares.size());
  return merged;
}

// Builds the merged event from the shares that arrived (ascending rank
// order, at least one); nothing when none holds samples. Runs on the rank
// sync thread, so it must not refer to the Stat (which may be gone). A
// window that cannot be merged is logged on its own rank as a merge of that
// rank's share alone.
using MergedEventBuilder =
    std::function<std::optional<Event>(const std::vector<RankShare>&)>;

// Queues `stat`'s closed window `index` for posting (and, on the root,
// merging): postRankPayload (rank_sync/protocol.h) with the share's bytes,
// its shape's describe() and a builder that decodes the shares and calls
// `build`. Returns false when the window cannot be synced (the caller then
// logs it locally).
// Thread safety: as postRankPayload, any thread.
TORCH_MONITOR_API bool postRankWindow(
    const void* stat,
    const std::string& name,
    int64_t index,
    const RankShare& share,
    MergedEventBuilder build);

} // namespace torch_monitor::detail
