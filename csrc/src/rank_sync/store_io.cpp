#include <torch_monitor/rank_sync/store_io.h>

#include <algorithm>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <torch_monitor/detail/bytes.h>

namespace torch_monitor::detail {

namespace {

constexpr uint8_t kBundleTag = 'B';
constexpr uint8_t kVerdictTag = 'V';

void putText(StoreBytes& out, const std::string& text) {
  putBytes(out, uint32_t(text.size()));
  out.insert(out.end(), text.begin(), text.end());
}

template <typename Container>
bool takeRun(const StoreBytes& in, size_t& at, Container& out) {
  uint32_t length = 0;
  if (!takeBytes(in, at, length) || in.size() - at < length) {
    return false;
  }
  out.assign(in.begin() + at, in.begin() + at + length);
  at += length;
  return true;
}

// Appends to `present` whether each of keys[begin, end) exists.
void findPresent(
    c10d::Store& store,
    const std::vector<std::string>& keys,
    size_t begin,
    size_t end,
    std::vector<bool>& present) {
  const std::vector<std::string> slice(keys.begin() + begin, keys.begin() + end);
  if (store.check(slice)) {
    for (size_t i = begin; i < end; ++i) {
      present[i] = true;
    }
    return;
  }
  if (end - begin == 1) {
    return;
  }
  const size_t middle = begin + (end - begin) / 2;
  findPresent(store, keys, begin, middle, present);
  findPresent(store, keys, middle, end, present);
}

} // namespace

std::string postKey(int64_t rank, int64_t seq) {
  return "torch_monitor/posts/" + std::to_string(rank) + "/" +
      std::to_string(seq);
}

const std::string& claimsKey() {
  static const std::string key = "torch_monitor/claims";
  return key;
}

StoreBytes encodeClaims(const Claims& claims) {
  StoreBytes out;
  for (size_t r = 0; r < claims.claimed.size(); ++r) {
    putBytes(out, claims.claimed[r]);
    putBytes(out, claims.givenUp[r]);
  }
  return out;
}

Claims decodeClaims(const StoreBytes& bytes, int64_t worldSize) {
  Claims claims{
      std::vector<int64_t>(size_t(worldSize), 0),
      std::vector<int64_t>(size_t(worldSize), 0)};
  if (bytes.size() != size_t(worldSize) * 2 * sizeof(int64_t)) {
    return claims;
  }
  size_t at = 0;
  for (int64_t r = 0; r < worldSize; ++r) {
    takeBytes(bytes, at, claims.claimed[size_t(r)]);
    takeBytes(bytes, at, claims.givenUp[size_t(r)]);
  }
  return claims;
}

StoreBytes encodeBundle(const std::vector<BundleEntry>& entries) {
  StoreBytes out{kBundleTag};
  putBytes(out, uint32_t(entries.size()));
  for (const BundleEntry& entry : entries) {
    putText(out, entry.stream);
    putBytes(out, entry.window);
    putText(out, entry.shape);
    putBytes(out, uint32_t(entry.payload.size()));
    out.insert(out.end(), entry.payload.begin(), entry.payload.end());
  }
  return out;
}

std::optional<std::vector<BundleEntry>> decodeBundle(const StoreBytes& bytes) {
  size_t at = 1;
  uint32_t count = 0;
  if (bytes.empty() || bytes[0] != kBundleTag || !takeBytes(bytes, at, count)) {
    return std::nullopt;
  }
  std::vector<BundleEntry> entries(count);
  for (BundleEntry& entry : entries) {
    if (!takeRun(bytes, at, entry.stream) ||
        !takeBytes(bytes, at, entry.window) ||
        !takeRun(bytes, at, entry.shape) ||
        !takeRun(bytes, at, entry.payload)) {
      return std::nullopt;
    }
  }
  return at == bytes.size() ? std::make_optional(std::move(entries))
                            : std::nullopt;
}

StoreBytes encodeVerdicts(const std::vector<EntryVerdict>& verdicts) {
  StoreBytes out{kVerdictTag};
  for (const EntryVerdict& v : verdicts) {
    putBytes(out, v.entry);
    putBytes(out, static_cast<uint8_t>(v.reason));
  }
  return out;
}

std::optional<std::vector<EntryVerdict>> decodeVerdicts(
    const StoreBytes& bytes) {
  if (bytes.size() < 2 || bytes[0] != kVerdictTag) {
    return std::nullopt;
  }
  std::vector<EntryVerdict> verdicts;
  size_t at = 1;
  while (at < bytes.size()) {
    EntryVerdict v;
    uint8_t reason = 0;
    if (!takeBytes(bytes, at, v.entry) || !takeBytes(bytes, at, reason)) {
      return std::nullopt;
    }
    v.reason = static_cast<Verdict>(reason);
    verdicts.push_back(v);
  }
  return verdicts;
}

void writeKey(
    c10d::Store& store,
    const std::string& key,
    const StoreBytes& bytes) {
  store.set(key, bytes);
}

bool keysExist(c10d::Store& store, const std::vector<std::string>& keys) {
  return store.check(keys);
}

std::vector<bool> keysPresent(
    c10d::Store& store,
    const std::vector<std::string>& keys) {
  std::vector<bool> present(keys.size(), false);
  if (!keys.empty()) {
    findPresent(store, keys, 0, keys.size(), present);
  }
  return present;
}

std::vector<StoreBytes> readKeys(
    c10d::Store& store,
    const std::vector<std::string>& keys) {
  // A TCPStore's reply of a few MB takes seconds (2,048 values of 15 KB:
  // 4.2 s), while replies of about 32 values reach 1 GB/s.
  constexpr size_t kKeysPerCall = 32;
  std::vector<StoreBytes> values;
  values.reserve(keys.size());
  for (size_t at = 0; at < keys.size(); at += kKeysPerCall) {
    const size_t end = std::min(keys.size(), at + kKeysPerCall);
    auto part = store.multiGet(
        std::vector<std::string>(keys.begin() + at, keys.begin() + end));
    for (auto& value : part) {
      values.push_back(std::move(value));
    }
  }
  return values;
}

StoreBytes peekKey(c10d::Store& store, const std::string& key) {
  // kAbsentKey is never a value, so the swap never happens: a read.
  return store.compareSet(key, kAbsentKey, kAbsentKey);
}

StoreBytes swapKey(
    c10d::Store& store,
    const std::string& key,
    const StoreBytes& expected,
    const StoreBytes& desired) {
  return store.compareSet(key, expected, desired);
}

void deleteKey(c10d::Store& store, const std::string& key) {
  store.deleteKey(key);
}

} // namespace torch_monitor::detail
