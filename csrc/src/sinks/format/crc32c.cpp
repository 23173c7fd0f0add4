#include <torch_monitor/sinks/format/crc32c.h>

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define TORCH_MONITOR_X86_CRC 1
#endif

namespace torch_monitor::sinks::detail {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u; // reflected Castagnoli

// kTables[k][b]: the CRC of byte b followed by k zero bytes; slicing-by-8
// folds eight input bytes per step with eight look-ups.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables makeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) {
      c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    }
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (size_t k = 1; k < 8; ++k) {
      t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    }
  }
  return t;
}

constexpr Tables kTables = makeTables();

uint64_t loadLittleEndian64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

using CrcFunction = uint32_t (*)(const void*, size_t, uint32_t) noexcept;

CrcFunction chooseImplementation() noexcept {
  return hardwareCrc32cAvailable() ? &crc32cHardware : &crc32cPortable;
}

} // namespace

uint32_t crc32cPortable(const void* data, size_t size, uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    const uint64_t v = loadLittleEndian64(p) ^ c;
    c = kTables[7][v & 0xff] ^ kTables[6][(v >> 8) & 0xff] ^
        kTables[5][(v >> 16) & 0xff] ^ kTables[4][(v >> 24) & 0xff] ^
        kTables[3][(v >> 32) & 0xff] ^ kTables[2][(v >> 40) & 0xff] ^
        kTables[1][(v >> 48) & 0xff] ^ kTables[0][v >> 56];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) {
    c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xff];
  }
  return ~c;
}

#ifdef TORCH_MONITOR_X86_CRC

__attribute__((target("sse4.2"))) uint32_t
crc32cHardware(const void* data, size_t size, uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
#if defined(__x86_64__)
  while (size >= 8) {
    uint64_t v;
    std::memcpy(&v, p, sizeof(v));
    c = _mm_crc32_u64(c, v);
    p += 8;
    size -= 8;
  }
#endif
  uint32_t c32 = static_cast<uint32_t>(c);
  while (size >= 4) {
    uint32_t v;
    std::memcpy(&v, p, sizeof(v));
    c32 = _mm_crc32_u32(c32, v);
    p += 4;
    size -= 4;
  }
  while (size-- > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
  }
  return ~c32;
}

bool hardwareCrc32cAvailable() noexcept {
  // Needed when called before the compiler runtime's own initialiser ran
  // (e.g. from another library's static constructor).
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}

#else

uint32_t crc32cHardware(const void* data, size_t size, uint32_t crc) noexcept {
  return crc32cPortable(data, size, crc);
}

bool hardwareCrc32cAvailable() noexcept {
  return false;
}

#endif

} // namespace torch_monitor::sinks::detail

namespace torch_monitor::sinks {

uint32_t crc32c(const void* data, size_t size, uint32_t crc) noexcept {
  // Chosen once; a function-local static costs one predictable branch.
  static const detail::CrcFunction impl = detail::chooseImplementation();
  return impl(data, size, crc);
}

} // namespace torch_monitor::sinks
