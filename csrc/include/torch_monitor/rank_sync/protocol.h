#pragma once

// The rank sync thread and its protocol: how a rank gathers the windows
// it closed into one bundle per pass and posts it to the group's c10d
// Store, how rank 0 claims the bundles, merges each window or refuses,
// marks late or hands back an entry, the deadlines, and who logs a window
// no merge took (docs/distributed.md, "How it merges" to "Scale"). The
// keys, bundles, claims and Store calls are rank_sync/store_io.h's; what a
// payload holds and how payloads merge is its owner's (a Stat:
// rank_sync/stat_share.h; a watch: watch/payload.h).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>

namespace torch_monitor {
struct RankGroup;
} // namespace torch_monitor

namespace torch_monitor::detail {

// Builds the events of a window posted as bytes of the poster's own format
// (postRankPayload): the values of the ranks that arrived, ascending rank
// order, an empty marker as posted; the events to log (any number).
using MergedPayloadBuilder = std::function<std::vector<Event>(
    const std::vector<std::vector<uint8_t>>&)>;

// Thread safety: every function below may be called from any thread,
// concurrently.

// Records `owner`'s group (nullptr: the process default group) and the
// name its windows merge under across the group's ranks. Live owners of one
// group that share a name (two Stats named "loss", or a Stat made while the
// one it replaces still lives) are told apart by the order they were
// enabled in: the second merges as "loss#2" with every other rank's second,
// since the same program makes them in the same order on every rank. A
// name freed by an owner that is gone is taken by the next owner of it.
TORCH_MONITOR_API void enableRankSync(
    const void* owner,
    std::shared_ptr<const RankGroup> group,
    const std::string& name);
// Forgets `owner`; windows it already posted are still merged.
TORCH_MONITOR_API void disableRankSync(const void* owner) noexcept;

// Queues `owner`'s closed window `index` for posting (and, on the root,
// merging), with empty markers for the windows it skipped since its last
// post (up to 64). Never blocks on the network. Returns false when the
// window cannot be synced (no default group, a forked child, an index
// already posted, the queue full, the thread stopped at exit): the caller
// then logs it locally. A window posted that the root does not merge (the
// root is gone or stalled, the Store fails, the window came too late or the
// ranks' owners differ) is logged locally by the rank sync thread, with a
// warning.
//
// `payload` is this rank's window in the owner's own format (at least two
// bytes: one-byte values are the Store's marks), `emptyMarker` what is
// posted for the windows it skipped. `what` names the owner in warnings
// ("Stat 'loss'"); `shape` says what must be the same on every rank for
// their windows to merge (WindowShape::describe(), Recorder::shape()):
// rank 0 refuses a window of another shape, and its rank logs it itself.
// The builder merges (on rank 0) or, for a window rank 0 does not take,
// logs this rank's payload alone. `owner` must have been enabled with
// enableRankSync.
// Rank 0 merges each owner's windows in order: a window is logged only
// after every earlier window of the same owner was (merged or given up at
// its deadline), so the merged points of one stream reach the sinks in step
// order.
TORCH_MONITOR_API bool postRankPayload(
    const void* owner,
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
