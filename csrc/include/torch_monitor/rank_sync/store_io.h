#pragma once

// The rank sync's keys on a group's c10d Store: how they are named, what
// they hold, and the Store calls that read, write and delete them. Who
// writes what, and when, is the protocol's (rank_sync/protocol.h); what a
// payload means is its owner's (rank_sync/stat_share.h, watch/payload.h).
//
// A window's key is "torch_monitor/<owner>/<window>/<rank>". It holds
// either a post (the poster's shape text, then its payload; at least five
// bytes) or one of the one-byte marks below, which say how the post was
// decided. So a mark is never misread as a post, nor a post as a mark.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch_monitor/export.h>

namespace c10d {
class Store;
} // namespace c10d

namespace torch_monitor::detail {

using StoreBytes = std::vector<uint8_t>;

// What a post's key holds once it is decided: the root took it into a
// merge; the root refused it (the ranks' objects differ); it came after the
// root gave up waiting for it; its rank took it back (the root did not take
// it in time) and logs it itself.
inline const StoreBytes kTakenMark{'T'};
inline const StoreBytes kRefusedMark{'R'};
inline const StoreBytes kLateMark{'L'};
inline const StoreBytes kGivenUpMark{'G'};
// Never a key's value: what peekKey() answers for a key that does not exist.
inline const StoreBytes kAbsentKey{'?'};

// "torch_monitor/<owner>/": the prefix of an owner's windows, which rank 0
// merges in order.
TORCH_MONITOR_API std::string streamPrefix(const std::string& owner);
// "<stream>/<window>/": the prefix of a window's keys.
TORCH_MONITOR_API std::string windowPrefix(
    const std::string& stream,
    int64_t window);
// A rank's key of a window.
TORCH_MONITOR_API std::string keyOf(const std::string& prefix, int64_t rank);
// The window index in a window prefix, for messages.
TORCH_MONITOR_API std::string windowOf(const std::string& prefix);

// A post: the poster's shape (the text that must match rank 0's), then its
// payload.
// Thread safety: a plain value type.
struct Post {
  std::string shape;
  StoreBytes payload;
};
TORCH_MONITOR_API StoreBytes wrapPost(
    const std::string& shape,
    const StoreBytes& payload);
// Nothing for a mark, or bytes that are not a post.
TORCH_MONITOR_API std::optional<Post> unwrapPost(const StoreBytes& bytes);

// The Store calls, one each (c10d's errors propagate: the caller decides
// what a failed Store means). Thread safety: as the Store's own calls.

// Writes `bytes` under `key`.
TORCH_MONITOR_API void writeKey(
    c10d::Store& store,
    const std::string& key,
    const StoreBytes& bytes);
// Whether every one of `keys` exists: one round trip for a whole window.
TORCH_MONITOR_API bool keysExist(
    c10d::Store& store,
    const std::vector<std::string>& keys);
// The value of `key`, kAbsentKey when there is none. Never waits (unlike
// Store::get and multiGet, which wait for a key that is not there).
TORCH_MONITOR_API StoreBytes peekKey(c10d::Store& store, const std::string& key);
// Sets `key` to `desired` if it holds `expected`, atomically (compareSet).
// Returns `desired` when it swapped, the value it found when that was
// another, and `expected` when the key does not exist (c10d's rule: so a
// key the root took and deleted answers as if still untouched).
TORCH_MONITOR_API StoreBytes swapKey(
    c10d::Store& store,
    const std::string& key,
    const StoreBytes& expected,
    const StoreBytes& desired);
TORCH_MONITOR_API void deleteKey(c10d::Store& store, const std::string& key);

} // namespace torch_monitor::detail
