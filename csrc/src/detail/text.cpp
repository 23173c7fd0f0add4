#include <torch_monitor/detail/text.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <c10/util/Exception.h>

namespace torch_monitor::detail {
namespace {

// Length of the well-formed UTF-8 sequence starting at text[i] (Unicode's
// table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF), or 0.
size_t sequenceLength(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) {
    return static_cast<unsigned char>(text[i + k]);
  };
  const unsigned char lead = byte(0);
  size_t length = 0;
  unsigned char low = 0x80; // range of the second byte
  unsigned char high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    low = lead == 0xE0 ? 0xA0 : 0x80; // overlong below U+0800
    high = lead == 0xED ? 0x9F : 0xBF; // surrogates U+D800..U+DFFF
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    low = lead == 0xF0 ? 0x90 : 0x80; // overlong below U+10000
    high = lead == 0xF4 ? 0x8F : 0xBF; // above U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size() || byte(1) < low || byte(1) > high) {
    return 0;
  }
  for (size_t k = 2; k < length; ++k) {
    if ((byte(k) & 0xC0) != 0x80) {
      return 0;
    }
  }
  return length;
}

size_t firstInvalidByte(std::string_view text) noexcept {
  size_t i = 0;
  // Names and keys are mostly ASCII: 8 bytes a step until the first byte
  // that needs a closer look.
  while (i + 8 <= text.size() && plainAscii8(text.data() + i)) {
    i += 8;
  }
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x01 && c <= 0x7F) {
      ++i;
      continue;
    }
    const size_t length = c == 0 ? 0 : sequenceLength(text, i);
    if (length == 0) {
      return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

} // namespace

bool isValidText(std::string_view text) noexcept {
  return firstInvalidByte(text) == std::string_view::npos;
}

size_t validTextPrefix(std::string_view text) noexcept {
  return std::min(firstInvalidByte(text), text.size());
}

void checkText(std::string_view text, std::string_view what) {
  const size_t i = firstInvalidByte(text);
  if (i == std::string_view::npos) {
    return;
  }
  TORCH_CHECK_VALUE(
      text[i] != '\0',
      what,
      " contains a NUL byte at index ",
      i,
      "; names and text values must not contain NUL");
  char hex[8];
  std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<unsigned char>(text[i]));
  TORCH_CHECK_VALUE(
      false,
      what,
      " is not valid UTF-8: byte ",
      hex,
      " at index ",
      i,
      " does not start a complete UTF-8 sequence (pass text, e.g. "
      "bytes.decode(), and do not cut strings inside a character)");
}

std::string errorMessage(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return error->what_without_backtrace();
  }
  return e.what();
}

} // namespace torch_monitor::detail
