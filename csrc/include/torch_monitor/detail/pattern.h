#pragma once

// The one reading of a user's regular expression (a watch's or a capture's
// include/exclude), so that every caller accepts the same syntax and refuses
// a bad pattern with the same words. Not part of the stable API.

#include <optional>
#include <regex>
#include <string>
#include <string_view>

#include <torch_monitor/export.h>

namespace torch_monitor::detail {

// `pattern` compiled as std::regex reads ECMAScript (nullopt for none).
// Throws c10::ValueError "<prefix><what>='<pattern>' is not a valid regular
// expression (...)" for one that does not compile.
// Thread safety: a pure function.
TORCH_MONITOR_API std::optional<std::regex> compiledPattern(
    const std::optional<std::string>& pattern,
    std::string_view prefix,
    std::string_view what);

} // namespace torch_monitor::detail
