#pragma once

// Plain values in and out of the byte strings the ranks post to the Store
// (a watch's window, gauges): native byte order, as every rank of a job
// runs on one architecture. Not part of the stable API.
// Thread safety: functions of their arguments only.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace torch_monitor::detail {

template <typename T>
void putBytes(std::vector<uint8_t>& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  const size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}

// Reads a T at `at` and moves past it; false (nothing read) when too few
// bytes are left.
template <typename T>
bool takeBytes(const std::vector<uint8_t>& in, size_t& at, T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (at > in.size() || in.size() - at < sizeof v) {
    return false;
  }
  std::memcpy(&v, in.data() + at, sizeof v);
  at += sizeof v;
  return true;
}

} // namespace torch_monitor::detail
