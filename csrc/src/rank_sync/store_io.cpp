#include <torch_monitor/rank_sync/store_io.h>

#include <cstring>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace torch_monitor::detail {

std::string streamPrefix(const std::string& owner) {
  return "torch_monitor/" + owner + "/";
}

std::string windowPrefix(const std::string& stream, int64_t window) {
  return stream + std::to_string(window) + "/";
}

std::string keyOf(const std::string& prefix, int64_t rank) {
  return prefix + std::to_string(rank);
}

std::string windowOf(const std::string& prefix) {
  const size_t end = prefix.size() - 1;
  const size_t begin = prefix.rfind('/', end - 1) + 1;
  return prefix.substr(begin, end - begin);
}

StoreBytes wrapPost(const std::string& shape, const StoreBytes& payload) {
  const uint32_t length = uint32_t(shape.size());
  StoreBytes bytes(sizeof length + shape.size() + payload.size());
  std::memcpy(bytes.data(), &length, sizeof length);
  std::memcpy(bytes.data() + sizeof length, shape.data(), shape.size());
  std::memcpy(
      bytes.data() + sizeof length + shape.size(),
      payload.data(),
      payload.size());
  return bytes;
}

std::optional<Post> unwrapPost(const StoreBytes& bytes) {
  uint32_t length = 0;
  if (bytes.size() < sizeof length + 1) {
    return std::nullopt;
  }
  std::memcpy(&length, bytes.data(), sizeof length);
  if (bytes.size() - sizeof length < length) {
    return std::nullopt;
  }
  const auto* begin = bytes.data() + sizeof length;
  return Post{
      std::string(reinterpret_cast<const char*>(begin), length),
      StoreBytes(begin + length, bytes.data() + bytes.size())};
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
