#pragma once

// Text encodings shared by the JSON Lines and console sinks (and the
// TensorBoard writer's tag repair): UTF-8 repair, JSON string escaping,
// numbers and UTC timestamps. Every function appends to `out`.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>
#include <torch_monitor/process_rank.h>

namespace torch_monitor::sinks::text {

// Appends `s` with every ill-formed sequence replaced by U+FFFD, one per
// maximal invalid subpart (the Unicode recommendation, and what Python's
// bytes.decode("utf-8", "replace") does).
TORCH_MONITOR_API void appendUtf8Repaired(std::string& out, std::string_view s);

// Appends the inside of a JSON string literal (no quotes): `"` and `\`
// escaped, control characters as \n, \t, ... or \u00XX, invalid UTF-8 as
// U+FFFD. The result never contains a raw newline.
TORCH_MONITOR_API void appendJsonEscaped(std::string& out, std::string_view s);
// The same between double quotes.
TORCH_MONITOR_API void appendJsonString(std::string& out, std::string_view s);

// Appends a double as a JSON value: the shortest text that reads back to the
// same double, always with a '.' or an exponent so that readers keep it a
// float (2.0 -> "2.0"); NaN and infinities, which JSON numbers cannot hold,
// as the strings "NaN", "Infinity", "-Infinity" (protobuf's JSON mapping;
// Python's float() reads them back).
TORCH_MONITOR_API void appendJsonDouble(std::string& out, double value);
TORCH_MONITOR_API void appendInt(std::string& out, int64_t value);

// "2024-05-01T12:34:56.123456Z": ISO-8601, UTC, microseconds.
TORCH_MONITOR_API void appendIso8601Utc(std::string& out, int64_t epochMicros);
// "1714566896.123456": exact decimal seconds since the epoch.
TORCH_MONITOR_API void appendEpochSeconds(std::string& out, int64_t epochMicros);

// One JSON Lines record, newline included:
// {"name":...,"timestamp":"<ISO-8601>","epoch_seconds":<s.us>[,"step":<int>]
// [,"rank":<int>,"world_size":<int>],"data":{...}} ("step" only when the
// event has one, "rank" and "world_size" only when `rank` is given)
// with data keys sorted; ints as JSON integers, doubles as above, bools as
// true/false, strings as strings.
TORCH_MONITOR_API void appendJsonLine(
    std::string& out,
    const Event& event,
    std::optional<ProcessRank> rank = std::nullopt);

// One human-readable line, newline included:
// 2024-05-01T12:34:56.123456Z torch.monitor.Stat loss.mean=0.25 n=3 ok=true s="x"
// (keys sorted; names and keys escaped like JSON string contents, string
// values quoted), so that no event can span two lines; with "[rank 3] "
// before the name when `rank` is given (the ranks of a job share one
// terminal) and " [step 12]" after it when the event has a step.
TORCH_MONITOR_API void appendConsoleLine(
    std::string& out,
    const Event& event,
    std::optional<ProcessRank> rank = std::nullopt);

} // namespace torch_monitor::sinks::text
