#include <torch_monitor/process_rank.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include <c10/util/Exception.h>

namespace torch_monitor {
namespace {

constexpr int64_t kMaxWorld = std::numeric_limits<int32_t>::max();

// Rank and world size packed into one word so that a reader never sees the
// rank of one setting with the world size of another; 0 means nothing set
// (a set world size is at least 1).
uint64_t pack(int64_t rank, int64_t worldSize) {
  return (static_cast<uint64_t>(worldSize) << 32) |
      static_cast<uint64_t>(rank);
}

std::optional<int64_t> envInteger(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    return std::nullopt;
  }
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0') {
    return std::nullopt;
  }
  return value;
}

// What torchrun (and env:// initialisation) tells every worker; ignored
// when either is missing or they do not describe a valid rank.
uint64_t fromEnvironment() {
  const auto rank = envInteger("RANK");
  const auto world = envInteger("WORLD_SIZE");
  if (!rank || !world || *world < 1 || *world > kMaxWorld || *rank < 0 ||
      *rank >= *world) {
    return 0;
  }
  return pack(*rank, *world);
}

std::atomic<uint64_t> gProcessRank{fromEnvironment()};

} // namespace

void setProcessRank(int64_t rank, int64_t worldSize) {
  TORCH_CHECK_VALUE(
      worldSize >= 1 && worldSize <= kMaxWorld,
      "setProcessRank: world size must be between 1 and ",
      kMaxWorld,
      ", got ",
      worldSize);
  TORCH_CHECK_VALUE(
      rank >= 0 && rank < worldSize,
      "setProcessRank: rank must be between 0 and world size - 1 (",
      worldSize - 1,
      "), got ",
      rank);
  gProcessRank.store(pack(rank, worldSize), std::memory_order_relaxed);
}

void clearProcessRank() noexcept {
  gProcessRank.store(0, std::memory_order_relaxed);
}

std::optional<ProcessRank> processRank() noexcept {
  const uint64_t packed = gProcessRank.load(std::memory_order_relaxed);
  if (packed == 0) {
    return std::nullopt;
  }
  return ProcessRank{
      static_cast<int64_t>(packed & 0xffffffffu),
      static_cast<int64_t>(packed >> 32)};
}

std::optional<ProcessRank> distributedRank() noexcept {
  auto rank = processRank();
  if (rank && rank->worldSize > 1) {
    return rank;
  }
  return std::nullopt;
}

} // namespace torch_monitor
