#pragma once

// One rank's client of a c10d Store, counting the calls that rank makes and
// the bytes of keys and values they carry each way (a multiGet or multiSet
// is one call, as on a TCPStore). Used by the rank sync's tests and its scale benchmark.
// Thread safety: as the wrapped Store; the counters are atomic.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace torch_monitor::test {

class CountingStore final : public c10d::Store {
 public:
  explicit CountingStore(c10::intrusive_ptr<c10d::Store> inner)
      : inner_(std::move(inner)) {}
  int64_t calls() const {
    return calls_.load();
  }
  int64_t bytes() const {
    return bytes_.load();
  }

  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<CountingStore>(inner_);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    count(key.size() + value.size());
    inner_->set(key, value);
  }
  std::vector<uint8_t> compareSet(
      const std::string& key,
      const std::vector<uint8_t>& expected,
      const std::vector<uint8_t>& desired) override {
    auto found = inner_->compareSet(key, expected, desired);
    count(key.size() + expected.size() + desired.size() + found.size());
    return found;
  }
  std::vector<uint8_t> get(const std::string& key) override {
    auto value = inner_->get(key);
    count(key.size() + value.size());
    return value;
  }
  int64_t add(const std::string& key, int64_t value) override {
    count(key.size() + 2 * sizeof value);
    return inner_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    count(key.size());
    return inner_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    count(sizeOf(keys));
    return inner_->check(keys);
  }
  int64_t getNumKeys() override {
    count(0);
    return inner_->getNumKeys();
  }
  void wait(const std::vector<std::string>& keys) override {
    count(sizeOf(keys));
    inner_->wait(keys);
  }
  void wait(
      const std::vector<std::string>& keys,
      const std::chrono::milliseconds& timeout) override {
    count(sizeOf(keys));
    inner_->wait(keys, timeout);
  }
  void multiSet(
      const std::vector<std::string>& keys,
      const std::vector<std::vector<uint8_t>>& values) override {
    size_t n = sizeOf(keys);
    for (const auto& v : values) {
      n += v.size();
    }
    count(n);
    inner_->multiSet(keys, values);
  }
  std::vector<std::vector<uint8_t>> multiGet(
      const std::vector<std::string>& keys) override {
    auto values = inner_->multiGet(keys);
    size_t n = sizeOf(keys);
    for (const auto& v : values) {
      n += v.size();
    }
    count(n);
    return values;
  }

 private:
  static size_t sizeOf(const std::vector<std::string>& keys) {
    size_t n = 0;
    for (const auto& key : keys) {
      n += key.size();
    }
    return n;
  }
  void count(size_t bytes) {
    ++calls_;
    bytes_ += int64_t(bytes);
  }

  c10::intrusive_ptr<c10d::Store> inner_;
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> bytes_{0};
};

} // namespace torch_monitor::test
