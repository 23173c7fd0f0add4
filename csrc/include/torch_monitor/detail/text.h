#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>

#include <torch_monitor/export.h>

namespace torch_monitor::detail {

// Every string that enters the library (stat and event names, event data keys
// and text values) must be valid UTF-8 without NUL: handlers hand it to
// Python (which cannot decode anything else), to JSON and to C APIs (where a
// NUL silently truncates). Throws c10::ValueError naming `what` (e.g. "Stat
// name") and the offending byte's index otherwise.
// Thread safety: a pure function.
TORCH_MONITOR_API void checkText(std::string_view text, std::string_view what);
// The same test without the exception (no allocation).
TORCH_MONITOR_API bool isValidText(std::string_view text) noexcept;
// How many bytes of `text` are valid text before the first that is not (a
// NUL, or a byte that does not start a whole UTF-8 sequence): its size when
// all are.
TORCH_MONITOR_API size_t validTextPrefix(std::string_view text) noexcept;

// What an exception says, for a warning: a c10::Error's message without its
// C++ backtrace (which what() appends, dozens of frames that tell a user
// nothing), else what().
// Thread safety: a pure function.
TORCH_MONITOR_API std::string errorMessage(const std::exception& e);
// Whether none of the 8 bytes of `word` is NUL or non-ASCII (SWAR: the
// usual zero-byte test, plus the high bits).
inline bool plainAsciiWord(uint64_t word) noexcept {
  constexpr uint64_t kOnes = 0x0101010101010101ULL;
  constexpr uint64_t kHighs = 0x8080808080808080ULL;
  return ((word & kHighs) | ((word - kOnes) & ~word & kHighs)) == 0;
}

// The same for the 8 bytes at `p`.
inline bool plainAscii8(const char* p) noexcept {
  uint64_t word;
  std::memcpy(&word, p, sizeof(word));
  return plainAsciiWord(word);
}

} // namespace torch_monitor::detail
