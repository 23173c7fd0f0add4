#pragma once

#include <cstdint>
#include <optional>

#include <torch_monitor/export.h>

namespace torch_monitor {

// The rank of this process in a distributed job (torch.distributed's global
// rank and world size), which the file sinks use to keep ranks apart: with a
// world of more than one process each rank writes its own run folder and
// JSON Lines lines carry "rank" and "world_size" (see docs/sinks.md,
// "Rank-aware sinks").
//
// Nothing set means "not distributed". At load, the library takes the
// RANK and WORLD_SIZE environment variables when both are set and valid
// (torchrun and torch.distributed's env:// launchers set them), so a C++
// program started by torchrun needs no call. Python sets it from
// torch.distributed once that is initialised (when a file sink is made).
// Other C++ programs call setProcessRank(pg->getRank(), pg->getSize()).
//
// Thread safety: every function may be called from any thread; a reader
// sees one whole value that was set (rank and world size together).
struct ProcessRank {
  int64_t rank = 0;
  int64_t worldSize = 1;

  friend bool operator==(const ProcessRank& a, const ProcessRank& b) {
    return a.rank == b.rank && a.worldSize == b.worldSize;
  }
  friend bool operator!=(const ProcessRank& a, const ProcessRank& b) {
    return !(a == b);
  }
};

// Throws c10::ValueError unless 1 <= worldSize <= 2^31 - 1 and
// 0 <= rank < worldSize.
TORCH_MONITOR_API void setProcessRank(int64_t rank, int64_t worldSize);

// This process is not part of a distributed job (any more).
TORCH_MONITOR_API void clearProcessRank() noexcept;

// The rank last set (or read from the environment at load), or nothing.
// One relaxed atomic load.
TORCH_MONITOR_API std::optional<ProcessRank> processRank() noexcept;

// processRank() when the world has more than one process, else nothing: the
// only case in which sinks change what they write.
TORCH_MONITOR_API std::optional<ProcessRank> distributedRank() noexcept;

} // namespace torch_monitor
