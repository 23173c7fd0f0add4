#pragma once

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

// What an exception says, for a warning: a c10::Error's message without its
// C++ backtrace (which what() appends, dozens of frames that tell a user
// nothing), else what().
// Thread safety: a pure function.
TORCH_MONITOR_API std::string errorMessage(const std::exception& e);

} // namespace torch_monitor::detail
