#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include <c10/util/intrusive_ptr.h>

#include <torch_monitor/export.h>

namespace c10d {
class Store;
} // namespace c10d

namespace torch_monitor {

// The ranks a synced Stat's windows are merged across (Stat::syncRanks):
// a c10d Store every rank of the group reaches (the process group's own,
// e.g. the TCPStore or FileStore it was initialised with), this process'
// rank in the group and the group's size. Merging goes through the Store
// only (a few small keys per window), never through a collective, so it
// cannot desynchronise the group's collectives.
//
// `deadline`: how long the root (rank 0) waits, after it closed a window,
// for the other ranks' summaries of it; a window is then merged from the
// ranks that arrived (its event's "<name>.ranks" says how many).
// Thread safety: an immutable value once shared; safe to read from any
// thread.
struct TORCH_MONITOR_API RankGroup {
  static constexpr std::chrono::milliseconds kDefaultDeadline{5000};

  c10::intrusive_ptr<c10d::Store> store;
  int64_t rank = 0;
  int64_t worldSize = 1;
  std::chrono::milliseconds deadline = kDefaultDeadline;
};

// The process default group, used by Stats synced without a group of their
// own (Stat::syncRanks(nullptr), TorchScript's sync_ranks=True). Python sets
// it when it resolves torch.distributed's default group; a C++ program sets
// it after creating its Store. Throws c10::ValueError for a group without a
// store, a negative rank, a rank not below worldSize or a deadline under
// 1 ms. nullptr unsets it.
// Thread safety: both functions may be called from any thread.
TORCH_MONITOR_API void setDefaultRankGroup(
    std::shared_ptr<const RankGroup> group);
TORCH_MONITOR_API std::shared_ptr<const RankGroup> defaultRankGroup();

// Waits (at most the longest deadline of the groups in use, plus 5 s for the
// handlers and the Store's round trips) until every window closed so far
// has been posted and, on the root, merged and logged; on the other ranks,
// taken by the root (or logged here, see postRankPayload in
// rank_sync/protocol.h).
// Thread safety: callable from any thread.
TORCH_MONITOR_API void flushRankSync() noexcept;

// Flushes as flushRankSync() does, except that a rank other than the root
// waits at most its group's deadline for the root to take its windows and
// logs the rest itself; then stops the rank sync thread for good (later
// windows are logged locally). Runs at exit, after closeAllStats(): by
// itself (std::atexit) and from Python's exit sequence, before Python's
// handlers go. Idempotent.
// Thread safety: callable from any thread.
TORCH_MONITOR_API void stopRankSync() noexcept;

} // namespace torch_monitor
