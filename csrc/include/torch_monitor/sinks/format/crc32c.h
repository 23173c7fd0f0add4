#pragma once

#include <cstddef>
#include <cstdint>

#include <torch_monitor/export.h>

namespace torch_monitor::sinks {

// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, init and xor-out
// 0xFFFFFFFF), the checksum of TFRecord framing in TensorBoard event files.
// `crc` continues a previous result, so crc32c(b, crc32c(a)) == crc32c(a+b).
// Uses the SSE4.2 crc32 instruction when the CPU has it (checked once at run
// time), else a slicing-by-8 table.
// Thread safety: a pure function.
TORCH_MONITOR_API uint32_t
crc32c(const void* data, size_t size, uint32_t crc = 0) noexcept;

// TFRecord's masked CRC: rotate right by 15 and add a constant, so that a
// CRC computed over data that itself contains CRCs stays well distributed.
constexpr uint32_t maskCrc32c(uint32_t crc) noexcept {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace detail {
// The two implementations behind crc32c(), for tests and benchmarks.
// crc32cHardware must only be called when hardwareCrc32cAvailable().
TORCH_MONITOR_API uint32_t
crc32cPortable(const void* data, size_t size, uint32_t crc) noexcept;
TORCH_MONITOR_API uint32_t
crc32cHardware(const void* data, size_t size, uint32_t crc) noexcept;
TORCH_MONITOR_API bool hardwareCrc32cAvailable() noexcept;
} // namespace detail

} // namespace torch_monitor::sinks
