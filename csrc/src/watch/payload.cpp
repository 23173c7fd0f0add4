#include <torch_monitor/watch/payload.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string_view>
#include <utility>

#include <torch_monitor/detail/bytes.h>
#include <torch_monitor/watch/memory.h>
#include <torch_monitor/watch/statistics.h>
#include <torch_monitor/watch/window_events.h>

namespace torch_monitor::watch {

using column::kColumns;

namespace {

constexpr uint64_t kPayloadMagic = 0x31484354'41574d54; // "TMWATCH1"
constexpr size_t kMemoryStats = Payload::kMemoryStats;

uint64_t fnv1a(uint64_t hash, std::string_view text) {
  for (unsigned char c : text) {
    hash = (hash ^ c) * 0x100000001b3ULL;
  }
  return hash;
}

} // namespace

std::vector<uint8_t> encodePayload(const Payload& p) {
  std::vector<uint8_t> out;
  out.reserve(8 * (6 + kMemoryStats) + sizeof(double) * p.rows.size());
  detail::putBytes(out, kPayloadMagic);
  detail::putBytes(out, p.layoutHash);
  detail::putBytes(out, p.step);
  detail::putBytes(out, uint64_t(p.hasMemory));
  for (int64_t m : p.memory) {
    detail::putBytes(out, m);
  }
  detail::putBytes(out, uint64_t(p.rows.size()));
  const size_t at = out.size();
  out.resize(at + sizeof(double) * p.rows.size());
  std::memcpy(out.data() + at, p.rows.data(), sizeof(double) * p.rows.size());
  return out;
}

std::vector<uint8_t> emptyPayload() {
  std::vector<uint8_t> out;
  detail::putBytes(out, kPayloadMagic);
  return out;
}

std::optional<Payload> decodePayload(const std::vector<uint8_t>& in) {
  size_t at = 0;
  uint64_t magic = 0;
  Payload p;
  uint64_t hasMemory = 0;
  uint64_t n = 0;
  if (!detail::takeBytes(in, at, magic) || magic != kPayloadMagic ||
      !detail::takeBytes(in, at, p.layoutHash) ||
      !detail::takeBytes(in, at, p.step) ||
      !detail::takeBytes(in, at, hasMemory)) {
    return std::nullopt;
  }
  for (int64_t& m : p.memory) {
    if (!detail::takeBytes(in, at, m)) {
      return std::nullopt;
    }
  }
  if (!detail::takeBytes(in, at, n) || in.size() - at != n * sizeof(double)) {
    return std::nullopt;
  }
  p.hasMemory = hasMemory != 0;
  p.rows.resize(n);
  std::memcpy(p.rows.data(), in.data() + at, n * sizeof(double));
  return p;
}

uint64_t layoutHashOf(const std::vector<Key>& keys) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const Key& key : keys) {
    hash = fnv1a(fnv1a(hash, key.name()), "\n");
  }
  return hash;
}

std::string shapeOf(
    const std::vector<Key>& keys,
    const RecorderOptions& options,
    uint64_t layoutHash) {
  std::ostringstream shape;
  shape << "a watch of " << keys.size() << " keys (" << keys.front().name();
  if (keys.size() > 1) {
    shape << " ... " << keys.back().name();
  }
  shape << ", layout " << std::hex << layoutHash << std::dec << ", "
        << kColumns << " columns) with ";
  if (options.windowSteps > 0) {
    shape << "window_steps=" << options.windowSteps;
  } else {
    shape << "window_size=" << options.windowSize.count() << " ms";
  }
  shape << ", every=" << options.every
        << ", memory=" << (options.memory ? "True" : "False");
  return shape.str();
}

detail::MergedPayloadBuilder payloadMerger(
    std::vector<Key> keys,
    uint64_t layoutHash) {
  return [keys = std::move(keys), hash = layoutHash](
             const std::vector<std::vector<uint8_t>>& values) {
    std::vector<double> merged(keys.size() * kColumns);
    for (size_t k = 0; k < keys.size(); ++k) {
      fillIdentity(merged.data() + k * kColumns);
    }
    std::optional<int64_t> step;
    std::vector<std::pair<std::string, int64_t>> memory;
    for (const auto& bytes : values) {
      const auto share = decodePayload(bytes);
      if (!share) {
        continue; // an empty marker: the rank observed nothing
      }
      // Rank 0 refused the posts of other layouts (their shape differs):
      // what reaches here has this one, bar foreign bytes.
      if (share->layoutHash != hash || share->rows.size() != merged.size()) {
        continue;
      }
      for (size_t k = 0; k < keys.size(); ++k) {
        mergeRow(
            merged.data() + k * kColumns, share->rows.data() + k * kColumns);
      }
      if (share->step >= 0) {
        step = std::min(step.value_or(share->step), share->step);
      }
      if (share->hasMemory) {
        const auto& names = deviceMemoryStatNames();
        if (memory.empty()) {
          for (size_t i = 0; i < kMemoryStats; ++i) {
            memory.emplace_back(names[i], share->memory[i]);
          }
        } else {
          // Sizes: the largest rank's (the one nearest to running out);
          // counts of retries and OOMs: all ranks'.
          for (size_t i = 0; i < kMemoryStats; ++i) {
            memory[i].second = i < 3
                ? std::max(memory[i].second, share->memory[i])
                : memory[i].second + share->memory[i];
          }
        }
      }
    }
    return windowEvents(
        keys, merged.data(), step, memory, int64_t(values.size()));
  };
}

} // namespace torch_monitor::watch
