#pragma once

// A watch's window as the ranks exchange it (sync_ranks): the shape that
// must be the same on every rank, the payload a rank posts (its bytes on
// the group's Store) and the merge of every rank's payloads into the
// window's events. The recorder (watch/recorder.h) closes the windows and
// posts them; the rank sync thread (rank_sync/protocol.h) carries them.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch_monitor/export.h>
#include <torch_monitor/rank_sync/protocol.h>
#include <torch_monitor/watch/recorder.h>

namespace torch_monitor::watch {

// One rank's window: a header, then the memory counters, then every key's
// row. An empty marker (a window this rank skipped or observed nothing in)
// is the magic alone.
// Thread safety: a plain value type.
struct Payload {
  static constexpr size_t kMemoryStats = 5; // deviceMemoryStatNames()

  uint64_t layoutHash = 0; // layoutHashOf(keys)
  int64_t step = -1; // the step at which this rank closed the window
  bool hasMemory = false;
  int64_t memory[kMemoryStats] = {};
  std::vector<double> rows; // keys x column::kColumns
};

// Thread safety of the functions below: pure functions of their arguments;
// any thread.

TORCH_MONITOR_API std::vector<uint8_t> encodePayload(const Payload& payload);
// The empty marker.
TORCH_MONITOR_API std::vector<uint8_t> emptyPayload();
// Nothing for an empty marker or bytes that are not a payload.
TORCH_MONITOR_API std::optional<Payload> decodePayload(
    const std::vector<uint8_t>& bytes);

// A hash of the keys' names in slot order: ranks merge equal layouts only.
TORCH_MONITOR_API uint64_t layoutHashOf(const std::vector<Key>& keys);

// Everything that changes what a window's rows mean, or what the merged
// event holds (the keys, the window, the cadence, the memory counters, the
// row layout), as rank 0's warning about a refused rank says it: ranks
// whose watches differ in any of it are never merged.
TORCH_MONITOR_API std::string shapeOf(
    const std::vector<Key>& keys,
    const RecorderOptions& options,
    uint64_t layoutHash);

// Merges the ranks' payloads of one window (rank 0), or logs this rank's
// own alone (a window rank 0 did not take), into the window's events with
// "watch.ranks". Rows merge as within a window (mergeRow); of the memory
// counters, sizes take the largest rank's (the one nearest to running out)
// and counts of retries and OOMs add up. Holds copies of what it needs: it
// runs on the rank sync thread, when the recorder may be gone.
TORCH_MONITOR_API detail::MergedPayloadBuilder payloadMerger(
    std::vector<Key> keys,
    uint64_t layoutHash);

} // namespace torch_monitor::watch
