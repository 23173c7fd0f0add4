#include <torch_monitor/detail/pattern.h>

#include <c10/util/Exception.h>

namespace torch_monitor::detail {

std::optional<std::regex> compiledPattern(
    const std::optional<std::string>& pattern,
    std::string_view prefix,
    std::string_view what) {
  if (!pattern) {
    return std::nullopt;
  }
  try {
    return std::regex(*pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    TORCH_CHECK_VALUE(
        false,
        prefix,
        what,
        "='",
        *pattern,
        "' is not a valid regular expression (ECMAScript syntax, in Python "
        "as in C++): ",
        e.what());
  }
}

} // namespace torch_monitor::detail
