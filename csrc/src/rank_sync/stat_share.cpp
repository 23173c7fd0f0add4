#include <torch_monitor/rank_sync/stat_share.h>

#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <torch_monitor/aggregation.h>
#include <torch_monitor/rank_sync/protocol.h>

namespace torch_monitor::detail {
namespace {

using Bytes = std::vector<uint8_t>;

constexpr size_t kShareFields = 9;
constexpr size_t kShareBytes = kShareFields * sizeof(uint64_t);

} // namespace

Bytes encodeShare(const RankShare& share) {
  const uint64_t fields[kShareFields] = {
      uint64_t(share.count),
      share.sum,
      share.min,
      share.max,
      share.value,
      uint64_t(share.step),
      uint64_t(share.shape.integer) | (uint64_t(share.shape.steps) << 1) |
          (uint64_t(share.shape.aggregations) << 8),
      uint64_t(share.shape.length),
      uint64_t(share.shape.maxSamples)};
  Bytes bytes(kShareBytes);
  std::memcpy(bytes.data(), fields, kShareBytes);
  return bytes;
}

namespace {

std::optional<RankShare> decode(const Bytes& bytes) {
  if (bytes.size() != kShareBytes) {
    return std::nullopt; // a marker, or not ours: never misread as a share
  }
  uint64_t fields[kShareFields];
  std::memcpy(fields, bytes.data(), kShareBytes);
  RankShare share;
  share.count = int64_t(fields[0]);
  share.sum = fields[1];
  share.min = fields[2];
  share.max = fields[3];
  share.value = fields[4];
  share.step = int64_t(fields[5]);
  share.shape.integer = (fields[6] & 1) != 0;
  share.shape.steps = (fields[6] & 2) != 0;
  share.shape.aggregations = uint8_t(fields[6] >> 8);
  share.shape.length = int64_t(fields[7]);
  share.shape.maxSamples = int64_t(fields[8]);
  return share;
}

} // namespace

std::string WindowShape::describe() const {
  std::string out = std::string(integer ? "a IntStat" : "a Stat") +
      (steps ? " with window_steps=" + std::to_string(length)
             : " with window_size=" + std::to_string(length) + " ms") +
      ", aggregations=[";
  // In the enum's order: the order given and duplicates change nothing.
  const char* separator = "";
  for (int a = 1; a < NUM_AGGREGATIONS; ++a) {
    if ((aggregations >> a) & 1) {
      out += separator;
      out += aggregationName(static_cast<Aggregation>(a));
      separator = ", ";
    }
  }
  out += "]";
  if (maxSamples != kUncapped) {
    out += ", max_samples=" + std::to_string(maxSamples);
  }
  return out;
}

bool postRankWindow(
    const void* stat,
    const std::string& name,
    int64_t index,
    const RankShare& share,
    MergedEventBuilder build) {
  // The shares that decode (all of them but foreign bytes), merged.
  MergedPayloadBuilder merge = [build = std::move(build)](
                                   const std::vector<Bytes>& values) {
    std::vector<RankShare> shares;
    for (const Bytes& bytes : values) {
      if (auto decoded = decode(bytes)) {
        shares.push_back(*decoded);
      }
    }
    std::vector<Event> events;
    if (!shares.empty()) {
      if (auto event = build(shares)) {
        events.push_back(std::move(*event));
      }
    }
    return events;
  };
  return postRankPayload(
      stat,
      "Stat '" + name + "'",
      index,
      encodeShare(share),
      encodeShare(share.emptyMarker()),
      share.shape.describe(),
      std::move(merge));
}

} // namespace torch_monitor::detail
