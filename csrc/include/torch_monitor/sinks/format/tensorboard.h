#pragma once

// The few pieces of TensorBoard's event-file format the native writer needs,
// encoded by hand (no protobuf dependency): TFRecord framing, and the
// Event messages it writes (file version, scalar, histogram). See docs/sinks.md for the byte layout.

#include <cstdint>
#include <string>
#include <string_view>

#include <torch_monitor/export.h>

namespace torch_monitor::sinks {
struct Histogram;
} // namespace torch_monitor::sinks

namespace torch_monitor::sinks::tensorboard {

// The file_version every TensorBoard event file starts with.
inline constexpr const char* kFileVersion = "brain.Event:2";

// Bytes of `value` as a protobuf varint (1..10; int64 fields encode negative
// numbers as their 64-bit two's complement, hence 10 bytes).
TORCH_MONITOR_API size_t varintSize(uint64_t value) noexcept;
TORCH_MONITOR_API void appendVarint(std::string& out, uint64_t value);

// Appends one TFRecord: uint64 length, uint32 masked CRC-32C of those 8
// bytes, the payload, uint32 masked CRC-32C of the payload (little-endian).
TORCH_MONITOR_API void appendRecord(std::string& out, std::string_view payload);

// Serialised Event{wall_time = 1 (double), file_version = 3 (string)}.
TORCH_MONITOR_API std::string fileVersionEvent(double wallTime);

// Serialised Event{wall_time = 1, step = 2 (varint, omitted when 0, as proto3
// does), summary = 5 {value = 1 {tag = 1, simple_value = 2 (float)}}}.
// `tag` is copied as given; TensorBoard needs valid UTF-8 (see ScalarTag).
TORCH_MONITOR_API std::string
scalarEvent(double wallTime, int64_t step, std::string_view tag, float value);

// Serialised Event{wall_time = 1, step = 2, summary = 5 {value = 1 {tag = 1,
// histo = 5 (HistogramProto {min = 1, max = 2, num = 3, sum = 4,
// sum_squares = 5 (doubles, omitted when +0, as proto3 does),
// bucket_limit = 6, bucket = 7 (packed doubles)})}}}. `tag` is copied as
// given (repair it with ScalarTag first).
TORCH_MONITOR_API std::string histogramEvent(
    double wallTime,
    int64_t step,
    std::string_view tag,
    const Histogram& histogram);

// The bytes of a scalar Event that depend only on the tag (the summary's
// length prefixes and the tag), computed once per tag so that the hot path
// only writes wall time, step and value around them. Invalid UTF-8 in the
// tag is replaced by U+FFFD: TensorBoard's reader rejects a string field that
// is not UTF-8.
// Thread safety: immutable after construction.
class TORCH_MONITOR_API ScalarTag {
 public:
  explicit ScalarTag(std::string_view tag);
  // The tag as written (after UTF-8 repair).
  const std::string& tag() const noexcept {
    return tag_;
  }
  // Field 5 (summary) up to and including the simple_value key byte 0x15.
  const std::string& encodedPrefix() const noexcept {
    return prefix_;
  }

 private:
  std::string tag_;
  std::string prefix_;
};

// Appends the record of scalarEvent(wallTime, step, tag.tag(), value), built
// in place: the writer's per-scalar hot path.
TORCH_MONITOR_API void appendScalarRecord(
    std::string& out,
    double wallTime,
    int64_t step,
    const ScalarTag& tag,
    float value);

} // namespace torch_monitor::sinks::tensorboard
