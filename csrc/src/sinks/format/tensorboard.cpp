#include <torch_monitor/sinks/format/tensorboard.h>

#include <cstring>
#include <type_traits>

#include <torch_monitor/sinks/format/crc32c.h>
#include <torch_monitor/sinks/format/histogram.h>
#include <torch_monitor/sinks/format/text.h>

namespace torch_monitor::sinks::tensorboard {
namespace {

// Protobuf keys: (field number << 3) | wire type.
constexpr char kWallTimeKey = 0x09; // Event.wall_time, fixed64 (double)
constexpr char kStepKey = 0x10; // Event.step, varint
constexpr char kFileVersionKey = 0x1a; // Event.file_version, bytes
constexpr char kSummaryKey = 0x2a; // Event.summary, bytes
constexpr char kValueKey = 0x0a; // Summary.value, bytes
constexpr char kTagKey = 0x0a; // Summary.Value.tag, bytes
constexpr char kSimpleValueKey = 0x15; // Summary.Value.simple_value, fixed32
constexpr char kHistoKey = 0x2a; // Summary.Value.histo, bytes
// HistogramProto: min, max, num, sum, sum_squares (fixed64 doubles), then
// bucket_limit and bucket (packed doubles, bytes).
constexpr char kHistoMinKey = 0x09;
constexpr char kHistoMaxKey = 0x11;
constexpr char kHistoNumKey = 0x19;
constexpr char kHistoSumKey = 0x21;
constexpr char kHistoSumSquaresKey = 0x29;
constexpr char kBucketLimitKey = 0x32;
constexpr char kBucketKey = 0x3a;

template <typename T>
char* storeLittleEndian(char* p, T value) {
  static_assert(std::is_trivially_copyable_v<T>);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  for (size_t i = 0; i < sizeof(T); ++i) {
    p[i] = bytes[sizeof(T) - 1 - i];
  }
#else
  std::memcpy(p, &value, sizeof(T));
#endif
  return p + sizeof(T);
}

char* storeVarint(char* p, uint64_t value) {
  while (value >= 0x80) {
    *p++ = static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  *p++ = static_cast<char>(value);
  return p;
}

void appendDouble(std::string& out, double value) {
  char bytes[8];
  storeLittleEndian(bytes, value);
  out.append(bytes, 8);
}

void appendLengthDelimited(std::string& out, char key, std::string_view bytes) {
  out.push_back(key);
  appendVarint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

// A proto3 double field: omitted when its bits are all zero (+0.0).
void appendDoubleField(std::string& out, char key, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, 8);
  if (bits != 0) {
    out.push_back(key);
    appendDouble(out, value);
  }
}

void appendPackedDoubles(
    std::string& out,
    char key,
    const std::vector<double>& values) {
  if (values.empty()) {
    return;
  }
  out.push_back(key);
  appendVarint(out, values.size() * 8);
  for (double v : values) {
    appendDouble(out, v);
  }
}

// Event{wall_time, step (omitted when 0), summary {value = summaryValue}}.
std::string summaryEvent(
    double wallTime,
    int64_t step,
    std::string_view summaryValue) {
  std::string summary;
  appendLengthDelimited(summary, kValueKey, summaryValue);

  std::string event;
  event.push_back(kWallTimeKey);
  appendDouble(event, wallTime);
  if (step != 0) {
    event.push_back(kStepKey);
    appendVarint(event, static_cast<uint64_t>(step));
  }
  appendLengthDelimited(event, kSummaryKey, summary);
  return event;
}

} // namespace

size_t varintSize(uint64_t value) noexcept {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

void appendVarint(std::string& out, uint64_t value) {
  char bytes[10];
  out.append(bytes, storeVarint(bytes, value) - bytes);
}

void appendRecord(std::string& out, std::string_view payload) {
  char header[12];
  storeLittleEndian(header, static_cast<uint64_t>(payload.size()));
  storeLittleEndian(header + 8, maskCrc32c(crc32c(header, 8)));
  out.append(header, 12);
  out.append(payload.data(), payload.size());
  char footer[4];
  storeLittleEndian(
      footer, maskCrc32c(crc32c(payload.data(), payload.size())));
  out.append(footer, 4);
}

std::string fileVersionEvent(double wallTime) {
  std::string event;
  event.push_back(kWallTimeKey);
  appendDouble(event, wallTime);
  appendLengthDelimited(event, kFileVersionKey, kFileVersion);
  return event;
}

std::string scalarEvent(
    double wallTime,
    int64_t step,
    std::string_view tag,
    float value) {
  std::string summaryValue;
  appendLengthDelimited(summaryValue, kTagKey, tag);
  summaryValue.push_back(kSimpleValueKey);
  char bytes[4];
  storeLittleEndian(bytes, value);
  summaryValue.append(bytes, 4);
  return summaryEvent(wallTime, step, summaryValue);
}

std::string histogramEvent(
    double wallTime,
    int64_t step,
    std::string_view tag,
    const Histogram& histogram) {
  std::string histo;
  appendDoubleField(histo, kHistoMinKey, histogram.min);
  appendDoubleField(histo, kHistoMaxKey, histogram.max);
  appendDoubleField(histo, kHistoNumKey, histogram.num);
  appendDoubleField(histo, kHistoSumKey, histogram.sum);
  appendDoubleField(histo, kHistoSumSquaresKey, histogram.sumSquares);
  appendPackedDoubles(histo, kBucketLimitKey, histogram.bucketLimits);
  appendPackedDoubles(histo, kBucketKey, histogram.bucketCounts);

  std::string summaryValue;
  appendLengthDelimited(summaryValue, kTagKey, tag);
  appendLengthDelimited(summaryValue, kHistoKey, histo);
  return summaryEvent(wallTime, step, summaryValue);
}

ScalarTag::ScalarTag(std::string_view tag) {
  text::appendUtf8Repaired(tag_, tag);
  const size_t valueSize = 1 + varintSize(tag_.size()) + tag_.size() + 1 + 4;
  const size_t summarySize = 1 + varintSize(valueSize) + valueSize;
  prefix_.push_back(kSummaryKey);
  appendVarint(prefix_, summarySize);
  prefix_.push_back(kValueKey);
  appendVarint(prefix_, valueSize);
  prefix_.push_back(kTagKey);
  appendVarint(prefix_, tag_.size());
  prefix_.append(tag_);
  prefix_.push_back(kSimpleValueKey);
}

void appendScalarRecord(
    std::string& out,
    double wallTime,
    int64_t step,
    const ScalarTag& tag,
    float value) {
  const std::string& prefix = tag.encodedPrefix();
  const uint64_t stepBits = static_cast<uint64_t>(step);
  const size_t payloadSize =
      1 + 8 + (step != 0 ? 1 + varintSize(stepBits) : 0) + prefix.size() + 4;
  const size_t start = out.size();
  out.resize(start + 12 + payloadSize + 4);
  char* const record = &out[start];
  storeLittleEndian(record, static_cast<uint64_t>(payloadSize));
  storeLittleEndian(record + 8, maskCrc32c(crc32c(record, 8)));
  char* const payload = record + 12;
  char* p = payload;
  *p++ = kWallTimeKey;
  p = storeLittleEndian(p, wallTime);
  if (step != 0) {
    *p++ = kStepKey;
    p = storeVarint(p, stepBits);
  }
  std::memcpy(p, prefix.data(), prefix.size());
  p += prefix.size();
  p = storeLittleEndian(p, value);
  storeLittleEndian(p, maskCrc32c(crc32c(payload, payloadSize)));
}

} // namespace torch_monitor::sinks::tensorboard
