// The sinks: CRC-32C and TensorBoard record encoding against golden values,
// JSON escaping and number formats, the memory/console/JSON Lines/TensorBoard
// sinks end to end, and their fault paths (unwritable directory, failing
// writes, vanished directory, full buffer, fork, closed and stalled pipes,
// FIFOs, exit).
//
// The TensorBoard files are checked here with a minimal decoder; the real
// oracle (TensorBoard's own reader) runs in test/python/test_sinks.py.

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <csignal>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <torch_monitor/detail/text.h>
#include <torch_monitor/process_rank.h>
#include <torch_monitor/sinks/detail/buffered_file_writer.h>
#include <torch_monitor/sinks/format/crc32c.h>
#include <torch_monitor/sinks/format/tensorboard.h>
#include <torch_monitor/sinks/format/text.h>
#include <torch_monitor/sinks/rank_files.h>
#include <torch_monitor/sinks/sinks.h>
#include <torch_monitor/step.h>

#include "test_support.h"

namespace torch_monitor {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using sinks::crc32c;
using sinks::maskCrc32c;
using test::RecordingHandler;
using test::ScopedHandler;
using test::TempDir;

// ---------------------------------------------------------------- helpers

// Collects the warnings issued on this thread for its lifetime.
class CapturedWarnings : public c10::WarningHandler {
 public:
  CapturedWarnings() : guard_(this) {}
  void process(const c10::Warning& warning) override {
    messages.push_back(warning.msg());
  }
  bool anyContains(const std::string& text) const {
    for (const auto& m : messages) {
      if (m.find(text) != std::string::npos) {
        return true;
      }
    }
    return false;
  }
  std::vector<std::string> messages;

 private:
  c10::WarningUtils::WarningHandlerGuard guard_;
};

// Makes every write of every BufferedFileWriter fail for the scope.
class InjectedWriteError {
 public:
  explicit InjectedWriteError(int error) {
    sinks::detail::BufferedFileWriter::setWriteErrorForTesting(error);
  }
  ~InjectedWriteError() {
    sinks::detail::BufferedFileWriter::setWriteErrorForTesting(0);
  }
};

bool anyProblemContains(const sinks::Sink& sink, const std::string& text) {
  for (const auto& p : sink.problems()) {
    if (p.find(text) != std::string::npos) {
      return true;
    }
  }
  return false;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::vector<std::string> filesIn(const fs::path& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) {
    return out;
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> linesOf(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
  }
  return lines;
}

template <typename T>
T loadLE(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A decoded TensorBoard Event (only the fields the writer produces).
struct DecodedEvent {
  double wallTime = 0;
  int64_t step = 0;
  std::string fileVersion;
  std::string tag;
  float value = 0;
  bool hasSummary = false;
};

uint64_t readVarint(const std::string& s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; pos < s.size(); shift += 7) {
    const auto byte = static_cast<unsigned char>(s[pos++]);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if (!(byte & 0x80)) {
      return v;
    }
  }
  ADD_FAILURE() << "truncated varint";
  return v;
}

std::string readBytes(const std::string& s, size_t& pos) {
  const size_t n = readVarint(s, pos);
  EXPECT_LE(pos + n, s.size());
  std::string out = s.substr(pos, n);
  pos += n;
  return out;
}

DecodedEvent decodeEvent(const std::string& data) {
  DecodedEvent e;
  size_t pos = 0;
  while (pos < data.size()) {
    const auto key = static_cast<unsigned char>(data[pos++]);
    switch (key) {
      case 0x09:
        e.wallTime = loadLE<double>(data.data() + pos);
        pos += 8;
        break;
      case 0x10:
        e.step = static_cast<int64_t>(readVarint(data, pos));
        break;
      case 0x1a:
        e.fileVersion = readBytes(data, pos);
        break;
      case 0x2a: {
        e.hasSummary = true;
        const std::string summary = readBytes(data, pos);
        size_t sp = 0;
        EXPECT_EQ(summary[sp++], 0x0a);
        const std::string value = readBytes(summary, sp);
        EXPECT_EQ(sp, summary.size());
        size_t vp = 0;
        EXPECT_EQ(value[vp++], 0x0a);
        e.tag = readBytes(value, vp);
        EXPECT_EQ(value[vp++], 0x15);
        e.value = loadLE<float>(value.data() + vp);
        vp += 4;
        EXPECT_EQ(vp, value.size());
        break;
      }
      default:
        ADD_FAILURE() << "unexpected protobuf key " << int(key);
        return e;
    }
  }
  return e;
}

// Splits a TFRecord file, checking both CRCs of every record; a truncated
// last record is ignored (as TensorBoard does).
std::vector<std::string> readRecords(const std::string& bytes) {
  std::vector<std::string> records;
  size_t pos = 0;
  while (pos + 12 <= bytes.size()) {
    const uint64_t length = loadLE<uint64_t>(bytes.data() + pos);
    EXPECT_EQ(
        loadLE<uint32_t>(bytes.data() + pos + 8),
        maskCrc32c(crc32c(bytes.data() + pos, 8)))
        << "length CRC at offset " << pos;
    if (pos + 12 + length + 4 > bytes.size()) {
      break;
    }
    const std::string data = bytes.substr(pos + 12, length);
    EXPECT_EQ(
        loadLE<uint32_t>(bytes.data() + pos + 12 + length),
        maskCrc32c(crc32c(data.data(), data.size())))
        << "data CRC at offset " << pos;
    records.push_back(data);
    pos += 12 + length + 4;
  }
  return records;
}

// Whether `bytes` is a sequence of whole TFRecords (ends at a record end).
bool endsAtRecordEnd(const std::string& bytes) {
  size_t pos = 0;
  while (pos + 12 <= bytes.size()) {
    pos += 12 + loadLE<uint64_t>(bytes.data() + pos) + 4;
  }
  return pos == bytes.size();
}

// Every scalar of every event file in `dir`, per tag, in file order; checks
// that each file starts with the file_version record.
std::map<std::string, std::vector<DecodedEvent>> readScalars(
    const fs::path& dir) {
  std::map<std::string, std::vector<DecodedEvent>> out;
  for (const std::string& file : filesIn(dir)) {
    EXPECT_NE(file.find("events.out.tfevents."), std::string::npos) << file;
    const auto records = readRecords(readFile(file));
    EXPECT_FALSE(records.empty()) << file;
    for (size_t i = 0; i < records.size(); ++i) {
      const DecodedEvent e = decodeEvent(records[i]);
      EXPECT_FALSE(std::isnan(e.wallTime));
      if (i == 0) {
        EXPECT_EQ(e.fileVersion, "brain.Event:2") << file;
        continue;
      }
      EXPECT_TRUE(e.hasSummary);
      out[e.tag].push_back(e);
    }
  }
  return out;
}

Event statEvent(
    std::map<std::string, data_value_t> data,
    int64_t micros = 1714566896123456) {
  Event e;
  e.name = kStatEventName;
  e.timestamp = fromEpochMicros(micros);
  for (auto& [k, v] : data) {
    e.data.emplace(k, v);
  }
  return e;
}

sinks::TensorBoardWriterOptions slowFlush() {
  sinks::TensorBoardWriterOptions o;
  o.flushInterval = std::chrono::hours(1); // only explicit flushes write
  return o;
}

// ---------------------------------------------------------------- CRC-32C

TEST(SinkCrc32c, GoldenValues) {
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  const std::string ones(32, '\xff');
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  std::string up(32, '\0');
  std::string down(32, '\0');
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc32c(up.data(), up.size()), 0x46dd794eu);
  EXPECT_EQ(crc32c(down.data(), down.size()), 0x113fdb5cu);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(SinkCrc32c, ImplementationsAgreeOnEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::string data(600, '\0');
  for (char& c : data) {
    c = static_cast<char>(rng());
  }
  const bool hw = sinks::detail::hardwareCrc32cAvailable();
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t len = 0; len + offset <= 300; ++len) {
      const char* p = data.data() + offset;
      const uint32_t portable = sinks::detail::crc32cPortable(p, len, 0);
      EXPECT_EQ(crc32c(p, len), portable) << offset << "/" << len;
      if (hw) {
        EXPECT_EQ(sinks::detail::crc32cHardware(p, len, 0), portable)
            << offset << "/" << len;
      }
    }
  }
}

TEST(SinkCrc32c, ContinuesAPreviousResult) {
  const std::string a = "hello, ";
  const std::string b = "tensorboard";
  const std::string ab = a + b;
  EXPECT_EQ(
      crc32c(b.data(), b.size(), crc32c(a.data(), a.size())),
      crc32c(ab.data(), ab.size()));
}

TEST(SinkCrc32c, Mask) {
  EXPECT_EQ(maskCrc32c(0), 0xa282ead8u);
  // tensorboard.compat...masked_crc32c(b"123456789")
  EXPECT_EQ(maskCrc32c(0xe3069283u), 0xc78ab0e5u);
  EXPECT_EQ(maskCrc32c(0x8a9136aau), 0x0fd7fffau);
}

// ---------------------------------------------------------------- TensorBoard encoding

TEST(SinkTensorBoardFormat, Varints) {
  using sinks::tensorboard::appendVarint;
  using sinks::tensorboard::varintSize;
  const std::vector<std::pair<uint64_t, std::string>> cases = {
      {0, std::string("\x00", 1)},
      {1, "\x01"},
      {127, "\x7f"},
      {128, "\x80\x01"},
      {300, "\xac\x02"},
      {16384, "\x80\x80\x01"},
      {uint64_t(int64_t(-1)), "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"},
  };
  for (const auto& [value, bytes] : cases) {
    std::string out;
    appendVarint(out, value);
    EXPECT_EQ(out, bytes) << value;
    EXPECT_EQ(varintSize(value), bytes.size()) << value;
  }
  EXPECT_EQ(varintSize(std::numeric_limits<int64_t>::max()), 9u);
}

TEST(SinkTensorBoardFormat, RecordFraming) {
  std::string out;
  sinks::tensorboard::appendRecord(out, "abc");
  ASSERT_EQ(out.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(loadLE<uint64_t>(out.data()), 3u);
  EXPECT_EQ(loadLE<uint32_t>(out.data() + 8), maskCrc32c(crc32c(out.data(), 8)));
  EXPECT_EQ(out.substr(12, 3), "abc");
  EXPECT_EQ(loadLE<uint32_t>(out.data() + 15), maskCrc32c(crc32c("abc", 3)));

  std::string empty;
  sinks::tensorboard::appendRecord(empty, "");
  ASSERT_EQ(empty.size(), 16u);
  const std::string zeros(8, '\0');
  EXPECT_EQ(empty.substr(0, 8), zeros);
  EXPECT_EQ(loadLE<uint32_t>(empty.data() + 8), maskCrc32c(crc32c(zeros.data(), 8)));
  EXPECT_EQ(loadLE<uint32_t>(empty.data() + 12), maskCrc32c(0));
}

TEST(SinkTensorBoardFormat, FileVersionEventBytes) {
  const std::string e = sinks::tensorboard::fileVersionEvent(1.5);
  const std::string expected = std::string("\x09", 1) +
      std::string("\x00\x00\x00\x00\x00\x00\xf8\x3f", 8) + "\x1a\x0d" +
      "brain.Event:2";
  EXPECT_EQ(e, expected);
}

TEST(SinkTensorBoardFormat, ScalarEventBytes) {
  // wall_time 1.5, step 0 (omitted), tag "a", value 2.0f.
  const std::string value = std::string("\x0a\x01" "a" "\x15", 4) +
      std::string("\x00\x00\x00\x40", 4);
  const std::string summary = "\x0a" + std::string(1, char(value.size())) + value;
  const std::string head = std::string("\x09", 1) +
      std::string("\x00\x00\x00\x00\x00\x00\xf8\x3f", 8);
  EXPECT_EQ(
      sinks::tensorboard::scalarEvent(1.5, 0, "a", 2.0f),
      head + "\x2a" + std::string(1, char(summary.size())) + summary);
  // A non-zero step comes between wall_time and summary.
  EXPECT_EQ(
      sinks::tensorboard::scalarEvent(1.5, 300, "a", 2.0f),
      head + "\x10\xac\x02" + "\x2a" + std::string(1, char(summary.size())) +
          summary);
  const DecodedEvent d =
      decodeEvent(sinks::tensorboard::scalarEvent(-3.25, 1234567, "x/y", -0.5f));
  EXPECT_EQ(d.wallTime, -3.25);
  EXPECT_EQ(d.step, 1234567);
  EXPECT_EQ(d.tag, "x/y");
  EXPECT_EQ(d.value, -0.5f);
}

TEST(SinkTensorBoardFormat, InPlaceRecordEqualsComposedRecord) {
  const std::vector<std::string> tags = {
      "", "loss.mean", std::string(127, 't'), std::string(200, 'u'),
      std::string(20000, 'v')};
  const std::vector<int64_t> steps = {
      0, 1, 127, 128, std::numeric_limits<int64_t>::max(), -1};
  for (const auto& tag : tags) {
    const sinks::tensorboard::ScalarTag encoded(tag);
    for (int64_t step : steps) {
      std::string composed = "prefix";
      sinks::tensorboard::appendRecord(
          composed, sinks::tensorboard::scalarEvent(12.5, step, tag, 0.25f));
      std::string inPlace = "prefix";
      sinks::tensorboard::appendScalarRecord(inPlace, 12.5, step, encoded, 0.25f);
      EXPECT_EQ(inPlace, composed) << tag.size() << " " << step;
    }
  }
}

TEST(SinkTensorBoardFormat, ScalarTagRepairsInvalidUtf8) {
  const sinks::tensorboard::ScalarTag tag(std::string("a\xff" "b", 3));
  EXPECT_EQ(tag.tag(), "a\xEF\xBF\xBD" "b");
  EXPECT_TRUE(torch_monitor::detail::isValidText(tag.tag()));
}

// ---------------------------------------------------------------- text formats

std::string jsonString(std::string_view s) {
  std::string out;
  sinks::text::appendJsonString(out, s);
  return out;
}

std::string repaired(std::string_view s) {
  std::string out;
  sinks::text::appendUtf8Repaired(out, s);
  return out;
}

const std::string kFFFD = "\xEF\xBF\xBD";

TEST(SinkJson, EscapesQuotesBackslashesAndControls) {
  EXPECT_EQ(jsonString("plain"), "\"plain\"");
  EXPECT_EQ(jsonString("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(jsonString("l1\nl2\r\t\b\f"), "\"l1\\nl2\\r\\t\\b\\f\"");
  EXPECT_EQ(jsonString(std::string("\x00\x01\x1f", 3)), "\"\\u0000\\u0001\\u001f\"");
  EXPECT_EQ(jsonString("\x7f"), "\"\x7f\""); // DEL is valid in JSON
  EXPECT_EQ(jsonString("/"), "\"/\"");
}

TEST(SinkJson, KeepsValidUtf8) {
  const std::string text = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xEF\xBF\xBF";
  EXPECT_TRUE(torch_monitor::detail::isValidText(text));
  EXPECT_EQ(jsonString(text), "\"" + text + "\"");
}

TEST(SinkJson, ReplacesInvalidUtf8LikePython) {
  // Expected results are Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(repaired("\xff"), kFFFD);
  EXPECT_EQ(repaired("a\x80" "b"), "a" + kFFFD + "b");
  EXPECT_EQ(repaired("\xC0\xAF"), kFFFD + kFFFD); // overlong '/'
  EXPECT_EQ(repaired("\xE2\x82"), kFFFD); // truncated euro sign
  EXPECT_EQ(repaired("\xE2\x82" "x"), kFFFD + "x");
  EXPECT_EQ(repaired("\xED\xA0\x80"), kFFFD + kFFFD + kFFFD); // surrogate
  EXPECT_EQ(repaired("\xF0\x9F\x98"), kFFFD); // truncated emoji
  EXPECT_EQ(repaired("\xF4\x90\x80\x80"), kFFFD + kFFFD + kFFFD + kFFFD);
  EXPECT_EQ(repaired("\xF5"), kFFFD);
  EXPECT_EQ(repaired("\xE0\x80\x80"), kFFFD + kFFFD + kFFFD);
  EXPECT_FALSE(torch_monitor::detail::isValidText("\xED\xA0\x80"));
  EXPECT_EQ(jsonString("\"\xff\n"), "\"\\\"" + kFFFD + "\\n\"");
}

TEST(SinkJson, EscapedOutputIsAlwaysOneLineOfValidUtf8) {
  std::mt19937 rng(11);
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) {
      c = static_cast<char>(rng());
    }
    const std::string out = jsonString(s);
    EXPECT_TRUE(torch_monitor::detail::isValidText(out));
    EXPECT_EQ(out.find('\n'), std::string::npos);
    for (unsigned char c : out) {
      EXPECT_GE(c, 0x20);
    }
  }
}

TEST(SinkJson, Numbers) {
  auto d = [](double v) {
    std::string out;
    sinks::text::appendJsonDouble(out, v);
    return out;
  };
  EXPECT_EQ(d(2.0), "2.0");
  EXPECT_EQ(d(0.1), "0.1");
  EXPECT_EQ(d(-0.0), "-0.0");
  EXPECT_EQ(d(1e300), "1e+300");
  EXPECT_EQ(d(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(d(std::nan("")), "\"NaN\"");
  EXPECT_EQ(d(INFINITY), "\"Infinity\"");
  EXPECT_EQ(d(-INFINITY), "\"-Infinity\"");
  std::string i;
  sinks::text::appendInt(i, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(i, "-9223372036854775808");
}

TEST(SinkJson, Timestamps) {
  auto iso = [](int64_t us) {
    std::string out;
    sinks::text::appendIso8601Utc(out, us);
    return out;
  };
  auto epoch = [](int64_t us) {
    std::string out;
    sinks::text::appendEpochSeconds(out, us);
    return out;
  };
  EXPECT_EQ(iso(0), "1970-01-01T00:00:00.000000Z");
  EXPECT_EQ(iso(1714566896123456), "2024-05-01T12:34:56.123456Z");
  EXPECT_EQ(iso(951782400000000), "2000-02-29T00:00:00.000000Z");
  EXPECT_EQ(iso(-1), "1969-12-31T23:59:59.999999Z");
  EXPECT_EQ(epoch(1714566896123456), "1714566896.123456");
  EXPECT_EQ(epoch(100000), "0.100000");
  EXPECT_EQ(epoch(-1), "-0.000001");
}

TEST(SinkJson, EventLine) {
  Event e = statEvent(
      {{"z", int64_t(-3)},
       {"a", 0.5},
       {"flag", true},
       {"s", std::string("x\"y")},
       {"whole", 4.0}});
  e.name = "my\nevent";
  std::string line;
  sinks::text::appendJsonLine(line, e);
  EXPECT_EQ(
      line,
      "{\"name\":\"my\\nevent\",\"timestamp\":\"2024-05-01T12:34:56.123456Z\","
      "\"epoch_seconds\":1714566896.123456,\"data\":{\"a\":0.5,\"flag\":true,"
      "\"s\":\"x\\\"y\",\"whole\":4.0,\"z\":-3}}\n");
}

TEST(SinkConsole, Line) {
  Event e = statEvent(
      {{"loss.mean", 0.25}, {"n", int64_t(3)}, {"ok", false}, {"s", std::string("a b")}});
  std::string line;
  sinks::text::appendConsoleLine(line, e);
  EXPECT_EQ(
      line,
      "2024-05-01T12:34:56.123456Z torch.monitor.Stat loss.mean=0.25 n=3 "
      "ok=false s=\"a b\"\n");
  // A step window's event, on rank 3 of 8.
  e.step = 12;
  line.clear();
  sinks::text::appendConsoleLine(line, e, ProcessRank{3, 8});
  EXPECT_EQ(
      line,
      "2024-05-01T12:34:56.123456Z [rank 3] torch.monitor.Stat [step 12] "
      "loss.mean=0.25 n=3 ok=false s=\"a b\"\n");
}

// ---------------------------------------------------------------- memory handler

TEST(SinkMemory, RingKeepsTheLastEventsInOrder) {
  auto memory = std::make_shared<sinks::MemoryHandler>(3);
  for (int64_t i = 0; i < 5; ++i) {
    memory->handle(statEvent({{"i", i}}));
  }
  const auto events = memory->events();
  ASSERT_EQ(events.size(), 3u);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(std::get<int64_t>(events[i].data.at("i")), i + 2);
  }
  EXPECT_EQ(memory->dropped(), 2);
  EXPECT_EQ(memory->size(), 3u);
  memory->clear();
  EXPECT_EQ(memory->size(), 0u);
  memory->handle(statEvent({{"i", int64_t(9)}}));
  ASSERT_EQ(memory->events().size(), 1u);
  EXPECT_EQ(std::get<int64_t>(memory->events()[0].data.at("i")), 9);
}

TEST(SinkMemory, FilterRegisterSelfAndClose) {
  auto memory = std::make_shared<sinks::MemoryHandler>(
      10, std::vector<std::string>{"wanted"});
  memory->registerSelf();
  memory->registerSelf(); // idempotent: events still arrive once
  EXPECT_TRUE(memory->registeredSelf());
  Event wanted;
  wanted.name = "wanted";
  Event other;
  other.name = "other";
  logEvent(wanted);
  logEvent(other);
  EXPECT_EQ(memory->size(), 1u);
  memory->close(); // unregisters
  EXPECT_FALSE(memory->registeredSelf());
  logEvent(wanted);
  memory->handle(wanted); // closed: ignored
  EXPECT_EQ(memory->size(), 1u);
  EXPECT_THROW(memory->registerSelf(), c10::ValueError);
}

TEST(SinkMemory, RegisterSelfNeedsSharedOwnership) {
  sinks::MemoryHandler onStack(1);
  EXPECT_THROW(onStack.registerSelf(), c10::ValueError);
}

TEST(SinkMemory, BadCapacity) {
  test::expectValueError(
      [] { sinks::MemoryHandler(0); }, {"capacity", "at least 1"});
}

// ---------------------------------------------------------------- console handler

TEST(SinkConsole, WritesOneLinePerEventToStdout) {
  auto console = std::make_shared<sinks::ConsoleHandler>(sinks::ConsoleStream::Stdout);
  ::testing::internal::CaptureStdout();
  console->handle(statEvent({{"x", 1.5}}));
  Event e;
  e.name = "two\nlines";
  e.timestamp = fromEpochMicros(0);
  console->handle(e);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(
      out,
      "2024-05-01T12:34:56.123456Z torch.monitor.Stat x=1.5\n"
      "1970-01-01T00:00:00.000000Z two\\nlines\n");
  EXPECT_EQ(console->dropped(), 0);
}

TEST(SinkConsole, ClosedPipeIsAWarningNotASignal) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int savedStdout = ::dup(STDOUT_FILENO);
  ::dup2(fds[1], STDOUT_FILENO);
  ::close(fds[1]);
  ::close(fds[0]); // nobody reads: writes fail with EPIPE
  auto console = std::make_shared<sinks::ConsoleHandler>(sinks::ConsoleStream::Stdout);
  {
    CapturedWarnings warnings;
    console->handle(statEvent({{"x", 1.0}}));
    console->handle(statEvent({{"x", 2.0}}));
    EXPECT_EQ(warnings.messages.size(), 1u);
  }
  ::dup2(savedStdout, STDOUT_FILENO);
  ::close(savedStdout);
  EXPECT_EQ(console->dropped(), 2);
  ASSERT_EQ(console->problems().size(), 1u);
  EXPECT_NE(console->problems()[0].find("stdout"), std::string::npos);
}

TEST(SinkConsole, StreamNames) {
  EXPECT_EQ(sinks::consoleStreamFromName("stdout"), sinks::ConsoleStream::Stdout);
  EXPECT_EQ(sinks::consoleStreamFromName("stderr"), sinks::ConsoleStream::Stderr);
  test::expectValueError(
      [] { sinks::consoleStreamFromName("stdin"); }, {"stdout", "stderr", "stdin"});
}

// ---------------------------------------------------------------- TensorBoard writer

TEST(SinkTensorBoardWriter, WritesStatValuesWithPerTagSteps) {
  TempDir dir;
  const std::string logdir = dir / "run/nested";
  {
    auto tb = std::make_shared<sinks::TensorBoardWriter>(logdir);
    const auto files = filesIn(logdir);
    ASSERT_EQ(files.size(), 1u); // created eagerly
    EXPECT_EQ(tb->filePath(), files[0]);
    const std::string name = fs::path(files[0]).filename().string();
    // events.out.tfevents.<10 digits>.<host>.<pid>.<n>
    ASSERT_EQ(name.rfind("events.out.tfevents.", 0), 0u);
    EXPECT_EQ(name.find('.', 20), 30u);
    EXPECT_NE(name.find("." + std::to_string(::getpid()) + "."), std::string::npos);

    tb->handle(statEvent(
        {{"loss.mean", 0.5},
         {"n", int64_t(7)},
         {"ok", true},
         {"label", std::string("skipped")}},
        1000000));
    tb->handle(statEvent({{"loss.mean", 0.25}, {"ok", false}}, 2000000));
    Event other;
    other.name = "not a stat";
    other.data["loss.mean"] = 99.0;
    tb->handle(other); // not written: only Stat events by default
  } // destructor flushes
  const auto scalars = readScalars(logdir);
  ASSERT_EQ(scalars.size(), 3u);
  const auto& loss = scalars.at("loss.mean");
  ASSERT_EQ(loss.size(), 2u);
  EXPECT_EQ(loss[0].step, 0);
  EXPECT_EQ(loss[0].value, 0.5f);
  EXPECT_EQ(loss[0].wallTime, 1.0);
  EXPECT_EQ(loss[1].step, 1);
  EXPECT_EQ(loss[1].value, 0.25f);
  EXPECT_EQ(loss[1].wallTime, 2.0);
  EXPECT_EQ(scalars.at("n").at(0).value, 7.0f);
  const auto& ok = scalars.at("ok");
  ASSERT_EQ(ok.size(), 2u);
  EXPECT_EQ(ok[0].value, 1.0f);
  EXPECT_EQ(ok[1].value, 0.0f);
  EXPECT_EQ(ok[1].step, 1);
}

TEST(SinkTensorBoardWriter, StepKeyEventNamesAndAddScalar) {
  TempDir dir;
  sinks::TensorBoardWriterOptions options = slowFlush();
  options.eventNames = {"train"};
  options.stepKey = "step";
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", options);
  Event e;
  e.name = "train";
  e.timestamp = fromEpochMicros(5000000);
  e.data["step"] = int64_t(40);
  e.data["acc"] = 0.75;
  tb->handle(e);
  tb->handle(statEvent({{"acc", 0.1}})); // not in event_names
  tb->addScalar("direct", 3.0, int64_t(1) << 40, 7.5);
  tb->addScalar("now", 1.0, 0); // NaN wall time -> now
  tb->close();
  const auto scalars = readScalars(dir / "tb");
  EXPECT_EQ(scalars.count("step"), 0u);
  ASSERT_EQ(scalars.at("acc").size(), 1u);
  EXPECT_EQ(scalars.at("acc")[0].step, 40);
  EXPECT_EQ(scalars.at("acc")[0].wallTime, 5.0);
  EXPECT_EQ(scalars.at("direct")[0].step, int64_t(1) << 40);
  EXPECT_EQ(scalars.at("direct")[0].wallTime, 7.5);
  const double now =
      static_cast<double>(toEpochMicros(std::chrono::system_clock::now())) / 1e6;
  EXPECT_NEAR(scalars.at("now")[0].wallTime, now, 60.0);
}

// Points land on the event's step, else the per-tag counter; add_scalar
// without a step takes the training step, else the counter.
TEST(SinkTensorBoardWriter, EventStepsAndAddScalarWithoutAStep) {
  TempDir dir;
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", slowFlush());
  Event stepped = statEvent({{"loss", 0.5}});
  stepped.step = 1200;
  tb->handle(stepped);
  tb->handle(statEvent({{"loss", 0.25}})); // no step: the tag's counter, 0
  clearStep();
  tb->addScalar("direct", 1.0); // no training step: the counter, 0
  tb->addScalar("direct", 2.0); // 1
  setStep(300);
  tb->addScalar("direct", 3.0); // the training step
  tb->addScalar("direct", 4.0, 7); // explicit
  clearStep();
  tb->close();
  const auto scalars = readScalars(dir / "tb");
  const auto& loss = scalars.at("loss");
  ASSERT_EQ(loss.size(), 2u);
  EXPECT_EQ(loss[0].step, 1200);
  EXPECT_EQ(loss[1].step, 0);
  std::vector<int64_t> steps;
  for (const auto& point : scalars.at("direct")) {
    steps.push_back(point.step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 300, 7}));
}

TEST(SinkJson, StepFieldOnlyWhenTheEventHasOne) {
  Event e = statEvent({{"a", int64_t(1)}});
  std::string line;
  sinks::text::appendJsonLine(line, e);
  EXPECT_EQ(line.find("\"step\""), std::string::npos) << line;
  e.step = 42;
  line.clear();
  sinks::text::appendJsonLine(line, e);
  EXPECT_NE(
      line.find("\"epoch_seconds\":1714566896.123456,\"step\":42,\"data\""),
      std::string::npos)
      << line;
}

TEST(SinkTensorBoardWriter, RegisteredWriterReceivesStatWindows) {
  TempDir dir;
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", slowFlush());
  {
    ScopedHandler registration(tb);
    test::FakeClock clock(0);
    Stat<double> stat("loss", {Aggregation::MEAN, Aggregation::COUNT}, 1000ms);
    for (int window = 0; window < 3; ++window) {
      stat.add(window);
      stat.add(window + 1.0);
      clock.advance(1000);
      stat.add(0.0); // closes the window
    }
  }
  tb->close();
  const auto scalars = readScalars(dir / "tb");
  ASSERT_GE(scalars.at("loss.mean").size(), 2u);
  EXPECT_EQ(scalars.at("loss.mean")[0].value, 0.5f);
  EXPECT_EQ(scalars.at("loss.mean")[1].step, 1);
}

TEST(SinkTensorBoardWriter, ConcurrentProducersLoseNothing) {
  TempDir dir;
  sinks::TensorBoardWriterOptions options;
  options.flushInterval = 5ms; // flushes race with appends
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", options);
  constexpr int kThreads = 4;
  constexpr int kEvents = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEvents; ++i) {
        tb->handle(statEvent(
            {{"shared", double(i)}, {"own." + std::to_string(t), double(i)}}));
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  tb->close();
  EXPECT_EQ(tb->dropped(), 0);
  const auto scalars = readScalars(dir / "tb");
  const auto& shared = scalars.at("shared");
  ASSERT_EQ(shared.size(), size_t(kThreads * kEvents));
  for (size_t i = 0; i < shared.size(); ++i) {
    EXPECT_EQ(shared[i].step, int64_t(i)); // one counter, no step twice
  }
  for (int t = 0; t < kThreads; ++t) {
    const auto& own = scalars.at("own." + std::to_string(t));
    ASSERT_EQ(own.size(), size_t(kEvents));
    for (int i = 0; i < kEvents; ++i) {
      EXPECT_EQ(own[i].value, float(i));
      EXPECT_EQ(own[i].step, i);
    }
  }
}

TEST(SinkTensorBoardWriter, BackgroundThreadFlushesWithoutBeingAsked) {
  TempDir dir;
  sinks::TensorBoardWriterOptions options;
  options.flushInterval = 20ms;
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", options);
  tb->handle(statEvent({{"x", 1.0}}));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  size_t found = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    found = readScalars(dir / "tb")["x"].size();
    if (found == 1) {
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(found, 1u);
}

TEST(SinkTensorBoardWriter, BadArguments) {
  test::expectValueError(
      [] { sinks::TensorBoardWriter(""); }, {"logdir is empty"});
  sinks::TensorBoardWriterOptions options;
  options.flushInterval = 0ms;
  TempDir dir;
  test::expectValueError(
      [&] { sinks::TensorBoardWriter(dir / "x", options); }, {"flush interval"});
  test::expectValueError(
      [] { sinks::flushIntervalFromSeconds(0.0); }, {"flush_interval"});
  test::expectValueError(
      [] { sinks::flushIntervalFromSeconds(std::nan("")); }, {"flush_interval"});
  EXPECT_EQ(sinks::flushIntervalFromSeconds(0.25), 250ms);
}

// ---------------------------------------------------------------- faults

TEST(SinkFaults, UnwritableDirectoryWarnsOnceAndTrainingGoesOn) {
  TempDir dir;
  // A directory below a regular file can never be created, even by root.
  const std::string blocker = dir / "a_file";
  std::ofstream(blocker) << "x";
  const std::string logdir = blocker + "/logs";

  auto recorder = std::make_shared<RecordingHandler>();
  std::shared_ptr<sinks::TensorBoardWriter> tb;
  {
    CapturedWarnings warnings;
    tb = std::make_shared<sinks::TensorBoardWriter>(logdir, slowFlush());
    ASSERT_EQ(warnings.messages.size(), 1u);
    EXPECT_TRUE(warnings.anyContains("cannot create the directory"));
    EXPECT_TRUE(warnings.anyContains(blocker));
    EXPECT_TRUE(warnings.anyContains("retried"));
  }
  ScopedHandler first(tb);
  ScopedHandler second(recorder);
  {
    CapturedWarnings warnings;
    for (int i = 0; i < 100; ++i) {
      EXPECT_NO_THROW(logEvent(statEvent({{"x", double(i)}})));
      tb->flush(); // retried, not warned again
    }
    EXPECT_TRUE(warnings.messages.empty());
  }
  EXPECT_EQ(recorder->size(), 100u);
  EXPECT_EQ(tb->problems().size(), 1u);
  EXPECT_EQ(tb->filePath(), "");

  // Once the directory can be created, the kept events are written.
  fs::remove(blocker);
  tb->flush();
  EXPECT_EQ(readScalars(logdir)["x"].size(), 100u);
}

TEST(SinkFaults, FailingWritesAreRetriedWithoutLoss) {
  TempDir dir;
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", slowFlush());
  {
    InjectedWriteError full(ENOSPC);
    CapturedWarnings warnings;
    for (int i = 0; i < 10; ++i) {
      tb->handle(statEvent({{"x", double(i)}}));
      tb->flush();
    }
    ASSERT_EQ(warnings.messages.size(), 1u);
    EXPECT_TRUE(warnings.anyContains("No space left on device"));
  }
  tb->flush(); // the disk has room again
  const auto xs = readScalars(dir / "tb")["x"];
  ASSERT_EQ(xs.size(), 10u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(xs[i].step, i);
  }
  EXPECT_EQ(tb->dropped(), 0);
}

// A file size limit makes write(2) stop part-way through a record (then fail
// with EFBIG), exactly as a disk filling up does.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    previousHandler_ = std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &previous_);
    rlimit limit = previous_;
    limit.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &previous_);
    std::signal(SIGXFSZ, previousHandler_);
  }

 private:
  rlimit previous_{};
  void (*previousHandler_)(int) = nullptr;
};

TEST(SinkFaults, PartWrittenRecordIsCutBackAndWrittenWholeOnRetry) {
  TempDir dir;
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", slowFlush());
  const size_t headerSize = fs::file_size(tb->filePath());
  {
    FileSizeLimit limit(headerSize + 100); // a record is ~40 bytes
    CapturedWarnings warnings;
    for (int i = 0; i < 10; ++i) {
      tb->handle(statEvent({{"x", double(i)}}));
    }
    tb->flush();
    EXPECT_TRUE(warnings.anyContains("File too large"));
    // The write stopped inside the third record; that part was cut off
    // again, so the file ends after the last whole record.
    const std::string bytes = readFile(tb->filePath());
    EXPECT_LT(bytes.size(), headerSize + 100);
    EXPECT_TRUE(endsAtRecordEnd(bytes)) << bytes.size() << " bytes";
    EXPECT_EQ(readRecords(bytes).size(), 3u);
  }
  tb->close();
  const auto xs = readScalars(dir / "tb")["x"];
  ASSERT_EQ(xs.size(), 10u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(xs[i].value, float(i));
  }
  EXPECT_EQ(tb->dropped(), 0);
}

TEST(SinkFaults, PartWrittenLineIsCutBackAndWrittenWholeOnRetry) {
  TempDir dir;
  const std::string path = dir / "e.jsonl";
  sinks::JsonLinesWriterOptions options;
  options.flushInterval = std::chrono::hours(1);
  auto writer = std::make_shared<sinks::JsonLinesWriter>(path, options);
  {
    FileSizeLimit limit(150); // a line is ~110 bytes
    CapturedWarnings warnings;
    for (int i = 0; i < 5; ++i) {
      writer->handle(statEvent({{"a", int64_t(i)}}));
    }
    writer->flush();
    const std::string text = readFile(path);
    EXPECT_LT(text.size(), 150u);
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.back(), '\n');
    EXPECT_EQ(linesOf(text).size(), 1u);
    EXPECT_EQ(warnings.messages.size(), 1u);
  }
  writer->close();
  const auto lines = linesOf(readFile(path));
  ASSERT_EQ(lines.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_NE(lines[i].find("\"a\":" + std::to_string(i) + "}"), std::string::npos)
        << lines[i];
  }
  EXPECT_EQ(writer->dropped(), 0);
}

// Issue 25: a full disk at close lost 220 of 330 events with dropped() == 0
// and left a torn last line. Whatever close() cannot write is counted, in
// the sink's unit, and the file ends at a record boundary.
TEST(SinkFaults, FullDiskAtCloseCountsEveryLineNotWritten) {
  TempDir dir;
  const std::string path = dir / "e.jsonl";
  sinks::JsonLinesWriterOptions options;
  options.flushInterval = std::chrono::hours(1);
  auto writer = std::make_shared<sinks::JsonLinesWriter>(path, options);
  {
    FileSizeLimit limit(10001); // a real short write, then EFBIG
    CapturedWarnings warnings;
    for (int i = 0; i < 330; ++i) {
      writer->handle(statEvent({{"a", int64_t(i)}, {"b", double(i)}}));
      if (i % 10 == 9) {
        writer->flush();
      }
    }
    writer->close();
    EXPECT_TRUE(warnings.anyContains("could not be written before close"));
  }
  const std::string text = readFile(path);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "a torn last line";
  const auto lines = linesOf(text);
  EXPECT_GT(writer->dropped(), 0);
  EXPECT_EQ(int64_t(lines.size()) + writer->dropped(), 330);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_NE(lines[i].find("\"a\":" + std::to_string(i) + ","), std::string::npos)
        << lines[i];
  }
}

TEST(SinkFaults, FullDiskAtCloseCountsEveryPointNotWritten) {
  TempDir dir;
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", slowFlush());
  {
    FileSizeLimit limit(5001);
    CapturedWarnings warnings;
    for (int i = 0; i < 330; ++i) {
      tb->handle(statEvent({{"x", double(i)}, {"y", double(i)}})); // 2 points
      if (i % 10 == 9) {
        tb->flush();
      }
    }
    tb->close();
    EXPECT_TRUE(warnings.anyContains("could not be written before close"));
  }
  EXPECT_TRUE(endsAtRecordEnd(readFile(tb->filePath())));
  auto scalars = readScalars(dir / "tb");
  const int64_t written = int64_t(scalars["x"].size() + scalars["y"].size());
  EXPECT_GT(written, 0);
  EXPECT_GT(tb->dropped(), 0);
  EXPECT_EQ(written + tb->dropped(), 660); // points, not events
}

// The test hook: nothing reaches the file. Every record is counted, the
// file's header (never written either) is not.
TEST(SinkFaults, RecordsNeverWrittenAreCountedAtCloseButNotTheHeader) {
  TempDir dir;
  InjectedWriteError full(ENOSPC);
  CapturedWarnings warnings;
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", slowFlush());
  sinks::JsonLinesWriterOptions options;
  options.flushInterval = std::chrono::hours(1);
  auto jsonl = std::make_shared<sinks::JsonLinesWriter>(dir / "e.jsonl", options);
  for (int i = 0; i < 5; ++i) {
    const Event e = statEvent({{"x", double(i)}, {"y", double(i)}});
    tb->handle(e);
    jsonl->handle(e);
  }
  tb->flush();
  jsonl->flush();
  EXPECT_EQ(tb->dropped(), 0); // still waiting for the retry
  EXPECT_EQ(jsonl->dropped(), 0);
  tb->close();
  jsonl->close();
  EXPECT_EQ(tb->dropped(), 10);
  EXPECT_EQ(jsonl->dropped(), 5);
  EXPECT_TRUE(anyProblemContains(*tb, "10 record(s)"));
  EXPECT_TRUE(anyProblemContains(*jsonl, "5 record(s)"));
  EXPECT_EQ(fs::file_size(tb->filePath()), 0u);
  EXPECT_EQ(fs::file_size(dir / "e.jsonl"), 0u);
}

TEST(SinkFaults, PrometheusTextFileCountsWindowsItCouldNotWrite) {
  TempDir dir;
  const std::string path = dir / "train.prom";
  auto prom = std::make_shared<sinks::PrometheusTextFile>(path);
  int64_t failed = 0;
  {
    FileSizeLimit limit(1000);
    CapturedWarnings warnings; // kBackgroundSink falls back to this thread
    for (int i = 0; i < 30; ++i) {
      // A new Stat each time: the text grows until it no longer fits.
      prom->handle(statEvent({{"s" + std::to_string(100 + i) + ".mean", double(i)}}));
      const std::string text = readFile(path);
      ASSERT_TRUE(text.empty() || text.back() == '\n');
      if (text.find("s" + std::to_string(100 + i)) == std::string::npos) {
        ++failed;
      }
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_LT(failed, 30);
  EXPECT_EQ(prom->dropped(), failed);
  EXPECT_EQ(filesIn(dir.path()), std::vector<std::string>{path}); // no temporary file
  prom->close();
}

TEST(SinkFaults, FullBufferDropsAndCounts) {
  TempDir dir;
  sinks::TensorBoardWriterOptions options = slowFlush();
  options.maxBufferBytes = 2000;
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", options);
  {
    InjectedWriteError failing(EIO);
    CapturedWarnings warnings;
    for (int i = 0; i < 200; ++i) {
      tb->handle(statEvent({{"x", double(i)}}));
    }
    tb->flush();
    for (int i = 0; i < 200; ++i) {
      tb->handle(statEvent({{"x", double(i)}}));
    }
    // The drop is seen by this thread; the failed write maybe by the
    // flusher (woken early by the filling buffer), which warns on its own
    // thread: `problems` has both either way.
    EXPECT_TRUE(warnings.anyContains("buffer is full"));
  }
  const auto problems = tb->problems();
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_NE(
      (problems[0] + problems[1]).find("Input/output error"), std::string::npos);
  EXPECT_GT(tb->dropped(), 300);
  tb->close();
  const auto xs = readScalars(dir / "tb")["x"];
  EXPECT_EQ(int64_t(xs.size()) + tb->dropped(), 400);
}

TEST(SinkFaults, VanishedDirectoryIsRecreated) {
  TempDir dir;
  const fs::path logdir = dir.path() / "tb";
  auto tb = std::make_shared<sinks::TensorBoardWriter>(logdir.string(), slowFlush());
  tb->handle(statEvent({{"x", 1.0}}));
  tb->flush();
  const std::string firstFile = tb->filePath();
  fs::remove_all(logdir);
  {
    CapturedWarnings warnings;
    tb->handle(statEvent({{"x", 2.0}}));
    tb->flush();
    EXPECT_TRUE(warnings.anyContains("was removed while writing"));
  }
  tb->handle(statEvent({{"x", 3.0}}));
  tb->close();
  EXPECT_NE(tb->filePath(), firstFile);
  const auto xs = readScalars(logdir)["x"];
  ASSERT_EQ(xs.size(), 2u); // the first point went with the removed file
  EXPECT_EQ(xs[0].value, 2.0f);
  EXPECT_EQ(xs[1].value, 3.0f);
  EXPECT_EQ(xs[1].step, 2);
}

TEST(SinkFaults, ThrowingNeighbourDoesNotStopOtherHandlers) {
  TempDir dir;
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", slowFlush());
  auto thrower = std::make_shared<test::FunctionHandler>(
      [](const Event&) { throw std::runtime_error("broken handler"); });
  ScopedHandler a(thrower);
  ScopedHandler b(tb);
  EXPECT_THROW(logEvent(statEvent({{"x", 1.0}})), std::runtime_error);
  tb->close();
  EXPECT_EQ(readScalars(dir / "tb")["x"].size(), 1u);
}

TEST(SinkFaults, ForkedChildNeitherWritesNorHangs) {
  TempDir dir;
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", slowFlush());
  tb->handle(statEvent({{"x", 1.0}}));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    tb->handle(statEvent({{"x", 99.0}}));
    tb->flush();
    tb->close();
    std::exit(0); // runs the static destructors (the at-exit close) too
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  tb->handle(statEvent({{"x", 2.0}}));
  tb->close();
  const auto xs = readScalars(dir / "tb")["x"];
  ASSERT_EQ(xs.size(), 2u);
  EXPECT_EQ(xs[0].value, 1.0f);
  EXPECT_EQ(xs[1].value, 2.0f);
}

TEST(SinkFaults, ExitFlushesRegisteredWriters) {
  TempDir dir;
  const std::string logdir = dir / "tb";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto tb = std::make_shared<sinks::TensorBoardWriter>(logdir, slowFlush());
    tb->registerSelf(); // owned by the registry: no destructor will run
    tb.reset();
    logEvent(statEvent({{"x", 5.0}}));
    std::exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const auto xs = readScalars(logdir)["x"];
  ASSERT_EQ(xs.size(), 1u);
  EXPECT_EQ(xs[0].value, 5.0f);
}

// ---------------------------------------------------------------- JSON Lines writer

TEST(SinkJsonLines, WritesOneLinePerEventAndAppends) {
  TempDir dir;
  const std::string path = dir / "logs/events.jsonl";
  sinks::JsonLinesWriterOptions options;
  options.flushInterval = std::chrono::hours(1);
  {
    auto writer = std::make_shared<sinks::JsonLinesWriter>(path, options);
    writer->handle(statEvent({{"a", int64_t(1)}}));
    Event e;
    e.name = std::string("bad\xff\nname", 9);
    e.timestamp = fromEpochMicros(0);
    e.data[std::string("k\"\x01", 3)] = std::string("\xed\xa0\x80");
    writer->handle(e);
    writer->flush();
    EXPECT_EQ(linesOf(readFile(path)).size(), 2u);
  }
  {
    auto writer = std::make_shared<sinks::JsonLinesWriter>(path, options);
    writer->handle(statEvent({{"b", 2.0}}));
  }
  const auto lines = linesOf(readFile(path));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(
      lines[1],
      "{\"name\":\"bad" + kFFFD +
          "\\nname\",\"timestamp\":\"1970-01-01T00:00:00.000000Z\","
          "\"epoch_seconds\":0.000000,\"data\":{\"k\\\"\\u0001\":\"" + kFFFD +
          kFFFD + kFFFD + "\"}}");
  EXPECT_NE(lines[2].find("\"b\":2.0"), std::string::npos);

  options.append = false;
  {
    auto writer = std::make_shared<sinks::JsonLinesWriter>(path, options);
    writer->handle(statEvent({{"c", 3.0}}));
  }
  EXPECT_EQ(linesOf(readFile(path)).size(), 1u);
}

TEST(SinkJsonLines, FailedWriteNeverLeavesAHalfLine) {
  TempDir dir;
  const std::string path = dir / "e.jsonl";
  sinks::JsonLinesWriterOptions options;
  options.flushInterval = std::chrono::hours(1);
  auto writer = std::make_shared<sinks::JsonLinesWriter>(path, options);
  {
    InjectedWriteError full(ENOSPC);
    CapturedWarnings warnings;
    writer->handle(statEvent({{"a", int64_t(1)}}));
    writer->flush();
    EXPECT_EQ(warnings.messages.size(), 1u);
  }
  writer->handle(statEvent({{"a", int64_t(2)}}));
  writer->close();
  const auto lines = linesOf(readFile(path));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("\"a\":1}"), std::string::npos);
  EXPECT_NE(lines[1].find("\"a\":2}"), std::string::npos);
}

TEST(SinkJsonLines, BadArguments) {
  test::expectValueError(
      [] { sinks::JsonLinesWriter(""); }, {"path is empty"});
  test::expectValueError(
      [] { sinks::JsonLinesWriter("some/dir/"); }, {"names a directory"});
}

TEST(SinkJsonLines, DevFullIsAWarningNotAnError) {
  if (!fs::exists("/dev/full")) {
    GTEST_SKIP() << "no /dev/full";
  }
  sinks::JsonLinesWriterOptions options;
  options.flushInterval = std::chrono::hours(1);
  auto writer = std::make_shared<sinks::JsonLinesWriter>("/dev/full", options);
  CapturedWarnings warnings;
  for (int i = 0; i < 5; ++i) {
    writer->handle(statEvent({{"a", int64_t(i)}}));
    EXPECT_NO_THROW(writer->flush());
  }
  EXPECT_EQ(warnings.messages.size(), 1u);
  EXPECT_TRUE(warnings.anyContains("No space left on device"));
  writer->close(); // reports what could not be written
  EXPECT_GE(writer->problems().size(), 2u);
  EXPECT_EQ(writer->dropped(), 5); // each event it could not write
}

// ---------------------------------------------------------------- reliability
//
// Whatever could kill or hang runs in a forked child with SIGPIPE at its
// default disposition (as in any C++ program) and an alarm(): a death or a
// deadlock fails the one test.

// Runs body() in a child and returns its wait status; the child exits with
// body()'s result through std::exit (static destructors, i.e. the at-exit
// flush, run) or dies of SIGALRM after `seconds`.
int runInChild(const std::function<int()>& body, unsigned seconds = 60) {
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    std::signal(SIGPIPE, SIG_DFL);
    ::alarm(seconds);
    int code = 2;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child threw: %s\n", e.what());
    }
    std::exit(code);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return status;
}

std::string describeStatus(int status) {
  if (WIFSIGNALED(status)) {
    return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) +
        " (" + strsignal(WTERMSIG(status)) + ")";
  }
  return "exit status " + std::to_string(WEXITSTATUS(status));
}

#define EXPECT_CHILD_OK(status)                                  \
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)     \
      << describeStatus(status)

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

TEST(SinkReliability, ClosedPipeIsOneWarningNotSigpipe) {
  for (const bool explicitFlush : {true, false}) {
    const int status = runInChild([&] {
      int fds[2];
      if (::pipe(fds) != 0) {
        return 10;
      }
      sinks::JsonLinesWriterOptions options;
      options.flushInterval =
          explicitFlush ? std::chrono::milliseconds(3600000) : 1ms;
      auto writer = std::make_shared<sinks::JsonLinesWriter>(
          "/dev/fd/" + std::to_string(fds[1]), options);
      ::close(fds[0]); // the reader leaves, as `| head` does
      for (int i = 0; i < 50; ++i) {
        writer->handle(statEvent({{"i", int64_t(i)}}));
        if (explicitFlush) {
          writer->flush();
        } else {
          std::this_thread::sleep_for(2ms);
        }
      }
      writer->close(); // adds the total of dropped events
      const auto problems = writer->problems();
      const bool oneWarning = problems.size() == 2 &&
          problems[0].find("went away") != std::string::npos &&
          problems[0].find("further events to this sink are dropped") !=
              std::string::npos;
      return oneWarning && writer->dropped() > 0 ? 0 : 3;
    });
    EXPECT_CHILD_OK(status) << (explicitFlush ? " (flush())" : " (flusher)");
  }
}

TEST(SinkReliability, ClosedPipeOnConsoleIsOneWarningNotSigpipe) {
  const int status = runInChild([] {
    int fds[2];
    if (::pipe(fds) != 0) {
      return 10;
    }
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    auto console =
        std::make_shared<sinks::ConsoleHandler>(sinks::ConsoleStream::Stdout);
    for (int i = 0; i < 5; ++i) {
      console->handle(statEvent({{"i", int64_t(i)}}));
    }
    return console->dropped() == 5 && console->problems().size() == 1 &&
            anyProblemContains(*console, "the reader of stdout went away")
        ? 0
        : 3;
  });
  EXPECT_CHILD_OK(status);
}


// stdout redirected to a file on a full disk: each line it could not take
// is counted, and the part of a line that reached the file is cut off.
TEST(SinkReliability, ConsoleOnAFullFileCountsLinesAndLeavesNoTornLine) {
  TempDir dir;
  const std::string path = dir / "out.log";
  const int status = runInChild([&] {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDOUT_FILENO);
    auto console =
        std::make_shared<sinks::ConsoleHandler>(sinks::ConsoleStream::Stdout);
    FileSizeLimit limit(1001); // a real short write, then EFBIG
    for (int i = 0; i < 40; ++i) {
      console->handle(statEvent({{"i", int64_t(i)}}));
    }
    const std::string text = readFile(path);
    const bool whole = !text.empty() && text.back() == '\n';
    const int64_t lines = int64_t(linesOf(text).size());
    std::fprintf(stderr, "%lld lines, %lld dropped, %zu bytes\n",
        static_cast<long long>(lines),
        static_cast<long long>(console->dropped()), text.size());
    if (!whole) {
      return 3;
    }
    return lines > 0 && console->dropped() > 0 &&
            lines + console->dropped() == 40
        ? 0
        : 4;
  });
  EXPECT_CHILD_OK(status) << " (3: a torn last line; 4: lines not counted)";
}

TEST(SinkReliability, ConsoleOnDevFullCountsEveryLine) {
  if (!fs::exists("/dev/full")) {
    GTEST_SKIP() << "no /dev/full";
  }
  const int status = runInChild([&] {
    const int fd = ::open("/dev/full", O_WRONLY);
    ::dup2(fd, STDOUT_FILENO);
    auto console =
        std::make_shared<sinks::ConsoleHandler>(sinks::ConsoleStream::Stdout);
    for (int i = 0; i < 40; ++i) {
      console->handle(statEvent({{"i", int64_t(i)}}));
    }
    return console->dropped() == 40 ? 0 : 3;
  });
  EXPECT_CHILD_OK(status);
}
TEST(SinkReliability, FifoWithoutReaderNeitherBlocksNorFails) {
  TempDir dir;
  const std::string fifo = dir / "events.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int status = runInChild(
      [&] {
        sinks::JsonLinesWriterOptions options;
        options.flushInterval = std::chrono::hours(1);
        auto writer = std::make_shared<sinks::JsonLinesWriter>(fifo, options);
        if (!anyProblemContains(*writer, "no process has it open for reading")) {
          return 3;
        }
        writer->handle(statEvent({{"i", int64_t(1)}}));
        // A reader comes: the next flush opens the FIFO and writes.
        const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
        writer->flush();
        char buffer[4096];
        const ssize_t n = ::read(reader, buffer, sizeof(buffer));
        writer->close();
        return n > 0 && writer->problems().size() == 1 ? 0 : 4;
      },
      20);
  EXPECT_CHILD_OK(status);
}

TEST(SinkReliability, StalledFifoReaderCostsDataNotAHang) {
  TempDir dir;
  const std::string fifo = dir / "events.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int status = runInChild(
      [&] {
        const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
        (void)reader; // kept open, never read: the pipe fills up
        sinks::JsonLinesWriterOptions options;
        options.flushInterval = 1ms;
        options.maxBufferBytes = 256 << 10;
        auto writer = std::make_shared<sinks::JsonLinesWriter>(fifo, options);
        for (int i = 0; i < 20000; ++i) {
          writer->handle(statEvent({{"i", int64_t(i)}, {"pad", std::string(40, 'x')}}));
        }
        auto start = std::chrono::steady_clock::now();
        writer->flush();
        const double flushed = secondsSince(start);
        start = std::chrono::steady_clock::now();
        writer->close();
        const double closed = secondsSince(start);
        std::fprintf(stderr, "flush %.3f s, close %.3f s\n", flushed, closed);
        const bool bounded = flushed < 0.5 && closed < 5.0;
        const bool reported = writer->dropped() > 0 &&
            anyProblemContains(*writer, "in-memory buffer is full") &&
            anyProblemContains(*writer, "did not take them");
        return bounded && reported ? 0 : 3;
      },
      30);
  EXPECT_CHILD_OK(status);
}

TEST(SinkReliability, ExitWithStalledFifoReaderIsBounded) {
  TempDir dir;
  const std::string fifo = dir / "events.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  const int status = runInChild(
      [&] {
        ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK); // never read
        sinks::JsonLinesWriterOptions options;
        options.flushInterval = std::chrono::hours(1);
        auto writer = std::make_shared<sinks::JsonLinesWriter>(fifo, options);
        writer->registerSelf(); // owned by the registry: closed at exit
        for (int i = 0; i < 20000; ++i) {
          logEvent(statEvent({{"i", int64_t(i)}, {"pad", std::string(40, 'x')}}));
        }
        return 0; // std::exit: the at-exit flush meets a full pipe
      },
      30);
  EXPECT_CHILD_OK(status);
  EXPECT_LT(secondsSince(start), 10.0);
}

TEST(SinkReliability, PathArgumentsAreChecked) {
  TempDir dir;
  test::expectValueError(
      [&] { sinks::JsonLinesWriter(dir.path().string()); }, {"is a directory"});
  test::expectValueError(
      [&] { sinks::JsonLinesWriter(dir / std::string("a\0b.jsonl", 9)); },
      {"JsonLinesWriter: path", "contains a NUL byte"});
  test::expectValueError(
      [&] { sinks::JsonLinesWriter(dir / "bad\xff.jsonl"); },
      {"JsonLinesWriter: path", "not valid UTF-8"});
  test::expectValueError(
      [&] { sinks::TensorBoardWriter(dir / std::string("runs\0x", 6)); },
      {"TensorBoardWriter: logdir", "contains a NUL byte"});
  test::expectValueError(
      [&] { sinks::TensorBoardWriter(dir / "bad\xc3"); },
      {"TensorBoardWriter: logdir", "not valid UTF-8"});
  EXPECT_TRUE(filesIn(dir.path()).empty());
  // Character devices stay usable.
  sinks::JsonLinesWriterOptions options;
  options.flushInterval = std::chrono::hours(1);
  auto devNull = std::make_shared<sinks::JsonLinesWriter>("/dev/null", options);
  devNull->handle(statEvent({{"x", 1.0}}));
  devNull->close();
  EXPECT_TRUE(devNull->problems().empty());
}

// Threads log into every sink kind while the test forks; each grandchild
// logs one event and reads the memory handler. Before the locks were made
// fork-safe, up to a quarter of the children deadlocked.
TEST(SinkReliability, ForkWhileThreadsLogNeverDeadlocksTheChild) {
  if (test::sanitizerForbidsThreadsAfterFork()) {
    GTEST_SKIP() << "the sanitizer runtime cannot start threads in a forked "
                    "child of a multi-threaded process; the plain build runs this";
  }
  TempDir dir;
  const int status = runInChild(
      [&] {
        const int devNull = ::open("/dev/null", O_WRONLY);
        ::dup2(devNull, STDOUT_FILENO);
        ::dup2(devNull, STDERR_FILENO); // the children's fork warnings
        auto memory = std::make_shared<sinks::MemoryHandler>(100);
        auto console =
            std::make_shared<sinks::ConsoleHandler>(sinks::ConsoleStream::Stdout);
        sinks::JsonLinesWriterOptions jsonOptions;
        jsonOptions.flushInterval = 1ms;
        auto jsonl =
            std::make_shared<sinks::JsonLinesWriter>(dir / "e.jsonl", jsonOptions);
        sinks::TensorBoardWriterOptions tbOptions;
        tbOptions.flushInterval = 1ms;
        tbOptions.eventNames = {};
        auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", tbOptions);
        const std::vector<std::shared_ptr<sinks::Sink>> all = {
            memory, console, jsonl, tb};

        std::atomic<bool> stop{false};
        std::atomic<int64_t> logged{0};
        std::vector<std::thread> threads;
        for (int t = 0; t < 3; ++t) {
          threads.emplace_back([&] {
            while (!stop.load()) {
              const Event e = statEvent({{"n", logged.fetch_add(1)}});
              for (const auto& sink : all) {
                sink->handle(e);
              }
            }
          });
        }
        int failures = 0;
        for (int i = 0; i < 50; ++i) {
          std::this_thread::sleep_for(2ms);
          const pid_t child = ::fork();
          if (child == 0) {
            ::alarm(10); // a deadlocked child dies of SIGALRM
            Event e = statEvent({{"child", int64_t(1)}});
            for (const auto& sink : all) {
              sink->handle(e);
            }
            const auto events = memory->events();
            jsonl->flush();
            tb->close(); // inert in the child: the parent's thread and file
            ::_exit(events.back().data.count("child") == 1 ? 0 : 3);
          }
          int childStatus = 0;
          ::waitpid(child, &childStatus, 0);
          failures += childStatus != 0;
        }
        stop = true;
        for (auto& t : threads) {
          t.join();
        }
        for (const auto& sink : all) {
          sink->close();
        }
        // Every parent event once; nothing from, or duplicated by, a child.
        const auto lines = linesOf(readFile(dir / "e.jsonl"));
        const bool complete =
            static_cast<int64_t>(lines.size()) + jsonl->dropped() == logged.load();
        for (const auto& line : lines) {
          if (line.find("\"child\"") != std::string::npos) {
            return 5;
          }
        }
        return failures == 0 ? (complete ? 0 : 4) : 3;
      },
      240);
  EXPECT_CHILD_OK(status) << " (3: a child deadlocked or failed; 4: lines "
                             "lost or written twice; 5: a child wrote)";
}

// ---------------------------------------------------------------- ranks

// Sets the process rank for one test and clears it after, so that no other
// test sees a distributed process.
class ScopedProcessRank {
 public:
  ScopedProcessRank(int64_t rank, int64_t worldSize) {
    setProcessRank(rank, worldSize);
  }
  ~ScopedProcessRank() {
    clearProcessRank();
  }
  ScopedProcessRank(const ScopedProcessRank&) = delete;
  ScopedProcessRank& operator=(const ScopedProcessRank&) = delete;
};

TEST(SinkRanks, ProcessRankIsSetClearedAndChecked) {
  clearProcessRank();
  EXPECT_FALSE(processRank().has_value());
  {
    ScopedProcessRank rank(3, 4);
    ASSERT_TRUE(processRank().has_value());
    EXPECT_EQ(*processRank(), (ProcessRank{3, 4}));
    EXPECT_EQ(*distributedRank(), (ProcessRank{3, 4}));
  }
  EXPECT_FALSE(processRank().has_value());
  {
    ScopedProcessRank alone(0, 1); // a world of one is not distributed
    EXPECT_TRUE(processRank().has_value());
    EXPECT_FALSE(distributedRank().has_value());
  }
  test::expectValueError([] { setProcessRank(2, 2); }, {"rank must be"});
  test::expectValueError([] { setProcessRank(-1, 2); }, {"rank must be"});
  test::expectValueError([] { setProcessRank(0, 0); }, {"world size"});
  test::expectValueError(
      [] { setProcessRank(0, int64_t(1) << 31); }, {"world size"});
  EXPECT_FALSE(processRank().has_value()); // a refused setting changes nothing
}

TEST(SinkRanks, RankPathPerMode) {
  using sinks::RankFiles;
  using sinks::rankPath;
  clearProcessRank();
  EXPECT_EQ(rankPath("runs/a", RankFiles::Separate, true), "runs/a");
  EXPECT_EQ(rankPath("runs/a", RankFiles::Zero, true), "runs/a");
  {
    ScopedProcessRank rank(1, 2);
    EXPECT_EQ(rankPath("runs/a", RankFiles::Separate, true), "runs/a/rank1");
    EXPECT_EQ(
        rankPath("runs/e.jsonl", RankFiles::Separate, false),
        "runs/rank1/e.jsonl");
    EXPECT_EQ(rankPath("e.jsonl", RankFiles::Separate, false), "rank1/e.jsonl");
    EXPECT_EQ(
        rankPath("/dev/null", RankFiles::Separate, false), "/dev/null");
    EXPECT_FALSE(rankPath("runs/a", RankFiles::Zero, true).has_value());
  }
  {
    ScopedProcessRank rank(0, 2);
    EXPECT_EQ(rankPath("runs/a", RankFiles::Zero, true), "runs/a");
  }
  EXPECT_EQ(
      sinks::rankFilesFromName("zero", "ranks"), sinks::RankFiles::Zero);
  EXPECT_STREQ(sinks::rankFilesName(sinks::RankFiles::Separate), "separate");
  test::expectValueError(
      [] { sinks::rankFilesFromName("all", "TensorBoardWriter: ranks"); },
      {"TensorBoardWriter: ranks must be \"separate\""});
}

TEST(SinkRanks, EachRankWritesItsOwnRunAndRankZeroOnlyOnRequest) {
  TempDir dir;
  const std::string logdir = dir / "tb";
  {
    ScopedProcessRank rank(1, 2);
    auto tb = std::make_shared<sinks::TensorBoardWriter>(logdir, slowFlush());
    EXPECT_EQ(tb->logdir(), logdir);
    EXPECT_EQ(tb->runDir(), logdir + "/rank1");
    tb->handle(statEvent({{"x", 1.0}}));
    tb->close();
    EXPECT_EQ(readScalars(logdir + "/rank1")["x"].size(), 1u);

    auto zeroOptions = slowFlush();
    zeroOptions.ranks = sinks::RankFiles::Zero;
    auto quiet = std::make_shared<sinks::TensorBoardWriter>(
        dir / "zero", zeroOptions);
    EXPECT_EQ(quiet->runDir(), "");
    quiet->handle(statEvent({{"x", 1.0}}));
    quiet->addScalar("y", 2.0, 0);
    quiet->close();
    EXPECT_EQ(quiet->filePath(), "");
    EXPECT_FALSE(fs::exists(dir / "zero")); // no file, no folder
  }
  // Rank 0 of the same job writes its own run beside rank 1's.
  ScopedProcessRank rank(0, 2);
  auto tb = std::make_shared<sinks::TensorBoardWriter>(logdir, slowFlush());
  tb->handle(statEvent({{"x", 5.0}}));
  tb->close();
  EXPECT_EQ(readScalars(logdir + "/rank0")["x"].size(), 1u);
  // Nothing but the two runs in the log directory: no rank folded in.
  EXPECT_EQ(
      filesIn(logdir),
      (std::vector<std::string>{logdir + "/rank0", logdir + "/rank1"}));
}

TEST(SinkRanks, JsonLinesCarryTheRankAndGoToTheRanksFile) {
  TempDir dir;
  const std::string path = dir / "logs/events.jsonl";
  sinks::JsonLinesWriterOptions options;
  options.flushInterval = std::chrono::hours(1);
  {
    ScopedProcessRank rank(1, 4);
    auto writer = std::make_shared<sinks::JsonLinesWriter>(path, options);
    EXPECT_EQ(writer->path(), path);
    EXPECT_EQ(writer->filePath(), dir / "logs/rank1/events.jsonl");
    Event e = statEvent({{"a", int64_t(1)}});
    e.step = 7;
    writer->handle(e);
    writer->close();
  }
  const auto lines = linesOf(readFile(dir / "logs/rank1/events.jsonl"));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(
      lines[0].find(",\"step\":7,\"rank\":1,\"world_size\":4,\"data\":{"),
      std::string::npos)
      << lines[0];
  EXPECT_FALSE(fs::exists(path));
  // Not distributed: no rank in the line, the path as given.
  std::string line;
  sinks::text::appendJsonLine(line, statEvent({{"a", int64_t(1)}}));
  EXPECT_EQ(line.find("rank"), std::string::npos);
}

TEST(SinkRanks, InheritedWriterWarnsOnceInTheForkedChild) {
  TempDir dir;
  auto jsonl = std::make_shared<sinks::JsonLinesWriter>(dir / "e.jsonl");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int warned = 0;
    {
      CapturedWarnings warnings;
      for (int i = 0; i < 3; ++i) {
        jsonl->handle(statEvent({{"x", 1.0}}));
      }
      for (const auto& m : warnings.messages) {
        warned += m.find("before fork()") != std::string::npos;
      }
    }
    std::_Exit(warned == 1 ? 0 : 1);
  }
  test::expectChildExitedCleanly(child, "one fork warning in the child");
  jsonl->close();
  EXPECT_TRUE(linesOf(readFile(dir / "e.jsonl")).empty());
}

} // namespace
} // namespace torch_monitor
