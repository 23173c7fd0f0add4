#include <torch_monitor/sinks/rank_files.h>

#include <sys/stat.h>

#include <c10/util/Exception.h>

#include <torch_monitor/process_rank.h>

namespace torch_monitor::sinks {
namespace {

// A pipe, FIFO or device: one stream that the path names, which a rank
// folder would not reach.
bool isSpecialFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) &&
      !S_ISDIR(st.st_mode);
}

} // namespace

RankFiles rankFilesFromName(std::string_view name, std::string_view what) {
  if (name == "separate") {
    return RankFiles::Separate;
  }
  if (name == "zero") {
    return RankFiles::Zero;
  }
  TORCH_CHECK_VALUE(
      false,
      what,
      " must be \"separate\" (each rank writes under a rank<r> folder) or "
      "\"zero\" (only rank 0 writes), got \"",
      name,
      "\"");
}

const char* rankFilesName(RankFiles mode) noexcept {
  return mode == RankFiles::Zero ? "zero" : "separate";
}

std::optional<std::string> rankPath(
    const std::string& path,
    RankFiles mode,
    bool isDirectory) {
  const std::optional<ProcessRank> rank = distributedRank();
  if (!rank) {
    return path;
  }
  if (mode == RankFiles::Zero) {
    return rank->rank == 0 ? std::optional<std::string>(path) : std::nullopt;
  }
  const std::string folder = "rank" + std::to_string(rank->rank);
  if (isDirectory) {
    return path + "/" + folder;
  }
  if (isSpecialFile(path)) {
    return path;
  }
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    return folder + "/" + path;
  }
  return path.substr(0, slash + 1) + folder + path.substr(slash);
}

} // namespace torch_monitor::sinks
