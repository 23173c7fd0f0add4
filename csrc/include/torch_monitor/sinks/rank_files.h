#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <torch_monitor/export.h>

namespace torch_monitor::sinks {

// How a file sink (TensorBoardWriter, JsonLinesWriter) made in a
// distributed job (distributedRank() set, see process_rank.h) keeps the
// ranks apart. Outside a distributed job both write the path as given.
enum class RankFiles : uint8_t {
  // Each rank writes under a "rank<r>" folder of its own: TensorBoard shows
  // one run per rank, and no two ranks are ever folded into one step.
  Separate,
  // Only rank 0 writes, to the path as given; on other ranks the sink
  // accepts every call and writes nothing (no file is made).
  Zero,
};

// "separate" or "zero"; anything else throws c10::ValueError naming `what`.
TORCH_MONITOR_API RankFiles rankFilesFromName(
    std::string_view name,
    std::string_view what);
TORCH_MONITOR_API const char* rankFilesName(RankFiles mode) noexcept;

// Where a sink configured with `path` writes in this process, or nothing
// when it writes nothing here (RankFiles::Zero on a rank other than 0).
// Separate puts "rank<r>" after the directory `path` (`isDirectory`) or
// before the last component of the file `path` ("runs/a.jsonl" ->
// "runs/rank1/a.jsonl"); a path that exists and is not a regular file or
// directory (a FIFO, /dev/stdout) is kept as is. Reads distributedRank()
// now: a sink decides its path when it is made.
TORCH_MONITOR_API std::optional<std::string> rankPath(
    const std::string& path,
    RankFiles mode,
    bool isDirectory);

} // namespace torch_monitor::sinks
