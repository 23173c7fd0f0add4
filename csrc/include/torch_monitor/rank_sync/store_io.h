#pragma once

// The rank sync's keys on a group's c10d Store: how they are named, what
// they hold, and the Store calls that read, write and delete them. Who
// writes what, and when, is the protocol's (rank_sync/protocol.h); what an
// entry's payload means is its owner's (rank_sync/stat_share.h,
// watch/payload.h).
//
// A rank other than the root posts everything it closed in one pass of its
// sync thread as one bundle (first byte 'B') under
// "torch_monitor/posts/<rank>/<seq>" (seq counts its bundles from 1). Which
// bundles the root claimed, and which their ranks took back, is one key
// for the whole group, "torch_monitor/claims" (two numbers per rank), changed
// only by compareSet: the root claims every bundle it found in one call, and
// a rank takes a bundle back only while the root has not claimed it. The
// root deletes a bundle once it decided every entry, or replaces it by its
// verdict on the entries it did not merge (first byte 'V').

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch_monitor/export.h>

namespace c10d {
class Store;
} // namespace c10d

namespace torch_monitor::detail {

using StoreBytes = std::vector<uint8_t>;

// Never a key's value: what peekKey() answers for a key that does not exist.
inline const StoreBytes kAbsentKey{'?'};

// Why the root did not merge an entry it claimed (a verdict's reasons): it
// came after the root merged its window without it; its object's shape
// differs from the root's; the root never had that window to merge it into.
enum class Verdict : uint8_t { kLate = 'L', kRefused = 'R', kOrphan = 'O' };

// One closed window of one owner, as a bundle carries it.
// Thread safety: a plain value type.
struct BundleEntry {
  std::string stream; // the owner's name, unique in its group
  int64_t window = 0;
  std::string shape; // what must match the root's (WindowShape::describe())
  StoreBytes payload;
};

// One entry the root did not merge: its index in the bundle, and why.
// Thread safety: a plain value type.
struct EntryVerdict {
  uint32_t entry = 0;
  Verdict reason = Verdict::kLate;
};

// "torch_monitor/posts/<rank>/<seq>".
TORCH_MONITOR_API std::string postKey(int64_t rank, int64_t seq);

// Per rank of a group: the newest bundle the root claimed, and the newest
// its rank took back (0: none). A rank takes bundles back oldest first, so
// the root reads past every bundle up to givenUp.
// Thread safety: a plain value type.
struct Claims {
  std::vector<int64_t> claimed;
  std::vector<int64_t> givenUp;
};
// "torch_monitor/claims".
TORCH_MONITOR_API const std::string& claimsKey();
TORCH_MONITOR_API StoreBytes encodeClaims(const Claims& claims);
// The claims of a group of `worldSize` ranks in `bytes`; none claimed for
// bytes of another size (the key is new, kAbsentKey, or not ours).
TORCH_MONITOR_API Claims decodeClaims(const StoreBytes& bytes, int64_t worldSize);

TORCH_MONITOR_API StoreBytes encodeBundle(
    const std::vector<BundleEntry>& entries);
// Nothing for bytes that are not a bundle (a mark, a verdict, foreign data).
TORCH_MONITOR_API std::optional<std::vector<BundleEntry>> decodeBundle(
    const StoreBytes& bytes);
// A verdict lists at least one entry.
TORCH_MONITOR_API StoreBytes encodeVerdicts(
    const std::vector<EntryVerdict>& verdicts);
TORCH_MONITOR_API std::optional<std::vector<EntryVerdict>> decodeVerdicts(
    const StoreBytes& bytes);

// The Store calls (c10d's errors propagate: the caller decides what a
// failed Store means). Thread safety: as the Store's own calls.

TORCH_MONITOR_API void writeKey(
    c10d::Store& store,
    const std::string& key,
    const StoreBytes& bytes);
// Whether every one of `keys` exists: one round trip.
TORCH_MONITOR_API bool keysExist(
    c10d::Store& store,
    const std::vector<std::string>& keys);
// Which of `keys` exist, found with one check for all of them when all do
// (one round trip), and by halving the list otherwise (about two checks per
// missing key and halving).
TORCH_MONITOR_API std::vector<bool> keysPresent(
    c10d::Store& store,
    const std::vector<std::string>& keys);
// The values of `keys`, which must exist: a multiGet (which waits for a key
// that is not there) per 32 keys.
TORCH_MONITOR_API std::vector<StoreBytes> readKeys(
    c10d::Store& store,
    const std::vector<std::string>& keys);
// The value of `key`, kAbsentKey when there is none. Never waits (unlike
// Store::get and multiGet).
TORCH_MONITOR_API StoreBytes peekKey(c10d::Store& store, const std::string& key);
// Sets `key` to `desired` if it holds `expected`, atomically (compareSet).
// Returns `desired` when it swapped, the value it found when that was
// another, and `expected` when the key does not exist (c10d's rule: so a
// key the root decided and deleted answers as if still untouched).
TORCH_MONITOR_API StoreBytes swapKey(
    c10d::Store& store,
    const std::string& key,
    const StoreBytes& expected,
    const StoreBytes& desired);
TORCH_MONITOR_API void deleteKey(c10d::Store& store, const std::string& key);

} // namespace torch_monitor::detail
