// Stat<double> and Stat<int64_t>: aggregates, windows, max_samples, NaN,
// construction errors, a differential test against torch::monitor::Stat,
// closeAllStats() at exit and fork() while other threads add.
//
// Every window test runs on the fake monotonic clock; nothing sleeps.

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/csrc/monitor/counters.h>
#include <torch/csrc/monitor/events.h>

#include "test_support.h"

namespace torch_monitor {
namespace {

using namespace std::chrono_literals;
using test::expectValueError;
using test::kAllAggregations;
using test::keysOf;
using test::valueOf;

constexpr auto VALUE = Aggregation::VALUE;
constexpr auto MEAN = Aggregation::MEAN;
constexpr auto COUNT = Aggregation::COUNT;
constexpr auto SUM = Aggregation::SUM;
constexpr auto MAX = Aggregation::MAX;
constexpr auto MIN = Aggregation::MIN;

// get()'s result keyed by name, so failures print readably.
template <typename T>
std::map<std::string, T> byName(const std::unordered_map<Aggregation, T, AggregationHash>& m) {
  std::map<std::string, T> out;
  for (const auto& [a, v] : m) {
    out[aggregationName(a)] = v;
  }
  return out;
}

template <typename T>
std::map<std::string, T> zerosFor(const std::vector<Aggregation>& aggs) {
  std::map<std::string, T> out;
  for (Aggregation a : aggs) {
    out[aggregationName(a)] = T(0);
  }
  return out;
}

// Fake clock + a recorder for every test of this file.
class StatTestBase : public ::testing::Test {
 protected:
  test::FakeClock clock{0};
  test::ScopedRecorder recorder;

  std::vector<Event> events() const {
    return recorder->statEvents();
  }
};

template <typename T>
class StatTest : public StatTestBase {
 protected:
  T at(const Event& e, const std::string& key) const {
    return valueOf<T>(e, key);
  }
};

using StatTypes = ::testing::Types<double, int64_t>;
TYPED_TEST_SUITE(StatTest, StatTypes);

// ---------------------------------------------------------------------------
// Construction

TYPED_TEST(StatTest, RejectsWindowUnderOneMillisecond) {
  using T = TypeParam;
  expectValueError(
      [] { Stat<T>("lat", {SUM}, 0ms); },
      {"'lat'", "window_size", "at least 1 millisecond", "got 0 ms"});
  expectValueError(
      [] { Stat<T>("lat", {SUM}, -5ms); },
      {"'lat'", "window_size", "got -5 ms"});
  expectValueError(
      [] {
        Stat<T>(
            "lat",
            {SUM},
            std::chrono::duration_cast<std::chrono::milliseconds>(999us));
      },
      {"window_size"});
  // The smallest valid window.
  Stat<T> ok("lat", {SUM}, 1ms);
  EXPECT_EQ(ok.windowSize(), 1ms);
}

TYPED_TEST(StatTest, RejectsMaxSamplesUnderOne) {
  using T = TypeParam;
  expectValueError(
      [] { Stat<T>("lat", {SUM}, 100ms, 0); },
      {"'lat'", "max_samples", "at least 1", "got 0"});
  expectValueError(
      [] { Stat<T>("lat", {SUM}, 100ms, -1); },
      {"'lat'", "max_samples", "got -1"});
  expectValueError(
      [] {
        Stat<T>("lat", {SUM}, 100ms, std::numeric_limits<int64_t>::min());
      },
      {"max_samples"});
  Stat<T> ok("lat", {SUM}, 100ms, 1);
  EXPECT_EQ(ok.maxSamples(), 1);
}

TYPED_TEST(StatTest, RejectsInvalidAggregations) {
  using T = TypeParam;
  expectValueError(
      [] { Stat<T>("lat", {SUM, Aggregation::NONE}, 100ms); },
      {"value", "mean", "count", "sum", "max", "min"});
  expectValueError(
      [] { Stat<T>("lat", {static_cast<Aggregation>(7)}, 100ms); },
      {"valid aggregations"});
  // A rejected construction logs nothing.
  EXPECT_TRUE(this->events().empty());
}

// torch.monitor accepts an empty list and logs an empty event at every
// window close; we refuse it, naming the Stat (docs/differences.md).
TYPED_TEST(StatTest, RefusesEmptyAggregationList) {
  using T = TypeParam;
  test::expectValueError(
      [] { Stat<T> s("lat", std::vector<Aggregation>{}, 100ms); },
      {"Stat 'lat'", "at least one aggregation"});
  EXPECT_TRUE(this->events().empty());
}

TYPED_TEST(StatTest, Accessors) {
  using T = TypeParam;
  Stat<T> s("loss", {SUM, MEAN, SUM}, 2500ms);
  EXPECT_EQ(s.name(), "loss");
  EXPECT_EQ(s.windowSize(), 2500ms);
  EXPECT_EQ(s.maxSamples(), Stat<T>::kUnlimitedSamples);
  EXPECT_EQ(Stat<T>::kUnlimitedSamples, std::numeric_limits<int64_t>::max());
  // As given, duplicates kept.
  EXPECT_EQ(s.aggregations(), (std::vector<Aggregation>{SUM, MEAN, SUM}));
  EXPECT_EQ(s.count(), 0);

  Stat<T> capped("x", std::vector<Aggregation>{MAX}, 7ms, 42);
  EXPECT_EQ(capped.maxSamples(), 42);
  EXPECT_EQ(capped.windowSize(), 7ms);
}

// A stat keeps its list packed in a word up to 21 entries and on the heap
// beyond: both forms give the list back as given.
TEST(StatAggregationList, ShortAndLongListsComeBackAsGiven) {
  const std::vector<Aggregation>& all = kAllAggregations;
  for (size_t n : {size_t(1), size_t(6), size_t(20), size_t(21),
                   size_t(22), size_t(100)}) {
    std::vector<Aggregation> list;
    for (size_t i = 0; i < n; ++i) {
      list.push_back(all[(i * 5) % all.size()]);
    }
    Stat<double> s("list", list, 100ms);
    EXPECT_EQ(s.aggregations(), list) << n << " entries";
  }
}

TEST(WindowFromSeconds, TruncatesToWholeMilliseconds) {
  EXPECT_EQ(windowFromSeconds(2.0), 2000ms);
  EXPECT_EQ(windowFromSeconds(0.5), 500ms);
  EXPECT_EQ(windowFromSeconds(0.0015), 1ms);
  EXPECT_EQ(windowFromSeconds(0.25), 250ms);
  EXPECT_EQ(windowFromSeconds(60.0), 60000ms);
  EXPECT_EQ(windowFromSeconds(0.0009), 0ms);
  EXPECT_EQ(windowFromSeconds(1e-9), 0ms);
  EXPECT_EQ(windowFromSeconds(0.0), 0ms);
  EXPECT_EQ(windowFromSeconds(8.6e13), std::chrono::milliseconds(int64_t(8.6e16)));
  // Every whole number of ms survives the double round trip (1001 / 1000.0
  // * 1000 is 1000.9999999999999, once read as 1000 ms), and what a saved
  // state holds (secondsOfWindow) reads back exactly up to timedelta.max.
  for (int64_t ms = 0; ms < 3'000'000; ++ms) {
    ASSERT_EQ(windowFromSeconds(double(ms) / 1000.0).count(), ms);
  }
  for (int64_t ms : {int64_t(4432109905917567), (int64_t(1) << 52) + 3,
                     (int64_t(1) << 53) + 2, int64_t(86399999999999999)}) {
    const std::chrono::milliseconds window(ms);
    ASSERT_EQ(windowFromSeconds(secondsOfWindow(window)), window) << ms;
  }
}

TEST(WindowFromSeconds, RejectsNegativeNonFiniteAndHuge) {
  for (double bad : {-1.0, -0.001, -1e-300,
                     std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity(),
                     -std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(bad);
    expectValueError(
        [&] { windowFromSeconds(bad); }, {"window_size", "non-negative"});
  }
  // Beyond datetime.timedelta.max: torch_monitor used to accept up to 9.2e15
  // s, which Python then reported as a wrong window_size.
  for (double huge : {8.65e13, 9.3e15, 1e300}) {
    SCOPED_TRACE(huge);
    expectValueError(
        [&] { windowFromSeconds(huge); },
        {"window_size must be at most 86399999999999 s", "timedelta.max"});
  }
}

TEST(StatWindow, LongestWindowIsTimedeltaMax) {
  const auto longest = std::chrono::milliseconds(Stat<double>::kMaxWindowMs);
  Stat<double> ok("longest", {SUM}, longest);
  EXPECT_EQ(ok.windowSize(), longest);
  for (int64_t ms : {Stat<double>::kMaxWindowMs + 1,
                     std::numeric_limits<int64_t>::max()}) {
    SCOPED_TRACE(ms);
    expectValueError(
        [&] { Stat<int64_t>("huge", {SUM}, std::chrono::milliseconds(ms)); },
        {"'huge'", "window_size must be at most 86399999999999999 ms"});
  }
}

// The live Stats by name, sorted, each while it lives (a name twice for two
// Stats of one name).
TEST(LiveStatNames, ListEveryLiveStatWhileItLives) {
  const auto mine = [] {
    std::vector<std::string> out;
    for (const std::string& name : liveStatNames()) {
      if (name.rfind("names.", 0) == 0) {
        out.push_back(name);
      }
    }
    return out;
  };
  auto b = std::make_unique<Stat<double>>(
      "names.b", std::vector<Aggregation>{SUM}, std::chrono::seconds(60));
  Stat<int64_t> a("names.a", {SUM}, std::chrono::seconds(60));
  Stat<double> again("names.a", {MAX}, std::chrono::seconds(60));
  EXPECT_EQ(mine(), (std::vector<std::string>{"names.a", "names.a", "names.b"}));
  b.reset();
  EXPECT_EQ(mine(), (std::vector<std::string>{"names.a", "names.a"}));
}

// Names reach handlers, Python and JSON: they must be UTF-8 without NUL.
TEST(StatName, InvalidUtf8AndNulAreRejected) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("ab\0c", 4), "Stat name contains a NUL byte at index 2"},
      {"\xff", "Stat name is not valid UTF-8: byte 0xFF at index 0"},
      {"ok\xc3", "byte 0xC3 at index 2"}, // "é" cut after its first byte
      {"\xc0\xaf", "byte 0xC0 at index 0"}, // overlong "/"
      {"\xed\xa0\x80", "byte 0xED at index 0"}, // a surrogate, U+D800
      {"\xf4\x90\x80\x80", "byte 0xF4 at index 0"}, // above U+10FFFF
  };
  for (const auto& [name, message] : cases) {
    SCOPED_TRACE(message);
    expectValueError([&] { Stat<double>(name, {SUM}, 1s); }, {message});
    expectValueError([&] { Stat<int64_t>(name, {SUM}, 1s); }, {message});
  }
  // Every valid width of UTF-8 is accepted.
  Stat<double> text("é✓𝄞 loss", {SUM}, 1s);
  EXPECT_EQ(text.name(), "é✓𝄞 loss");
}

TEST(WindowFromSeconds, SubMillisecondWindowIsRejectedByStat) {
  expectValueError(
      [] { Stat<double>("tiny", {SUM}, windowFromSeconds(0.0009)); },
      {"'tiny'", "at least 1 millisecond"});
  Stat<double> ok("ok", {SUM}, windowFromSeconds(0.001));
  EXPECT_EQ(ok.windowSize(), 1ms);
}

// ---------------------------------------------------------------------------
// Aggregates

template <typename T>
struct AggregateCase {
  std::vector<T> samples;
  T value, mean, count, sum, max, min;
};

AggregateCase<double> aggregateCase(double) {
  // Exactly representable: the expected values are exact.
  return {{1.5, -2.0, 4.25, 0.5}, 0.5, 1.0625, 4.0, 4.25, 4.25, -2.0};
}
AggregateCase<int64_t> aggregateCase(int64_t) {
  // mean = 17 / 4 = 4 (integer division).
  return {{7, -3, 11, 2}, 2, 4, 4, 17, 11, -3};
}

TYPED_TEST(StatTest, EventCarriesEveryAggregation) {
  using T = TypeParam;
  const AggregateCase<T> c = aggregateCase(T());
  Stat<T> s("loss", kAllAggregations, 100ms);

  this->clock.set(1000);
  for (T v : c.samples) {
    s.add(v);
    this->clock.advance(10);
  }
  EXPECT_TRUE(this->events().empty());
  EXPECT_EQ(s.count(), int64_t(c.samples.size()));

  this->clock.set(1100);
  const auto before = std::chrono::system_clock::now();
  s.add(T(100));
  const auto after = std::chrono::system_clock::now();

  const auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u);
  const Event& e = evs[0];
  EXPECT_EQ(e.name, "torch.monitor.Stat");
  EXPECT_EQ(std::string(kStatEventName), "torch.monitor.Stat");
  EXPECT_EQ(
      keysOf(e),
      (std::vector<std::string>{
          "loss.count", "loss.max", "loss.mean", "loss.min", "loss.sum",
          "loss.value"}));
  // valueOf<T> also checks the variant alternative: double for double
  // stats (COUNT included), int64_t for int64 stats.
  EXPECT_EQ(this->at(e, "loss.value"), c.value);
  EXPECT_EQ(this->at(e, "loss.mean"), c.mean);
  EXPECT_EQ(this->at(e, "loss.count"), c.count);
  EXPECT_EQ(this->at(e, "loss.sum"), c.sum);
  EXPECT_EQ(this->at(e, "loss.max"), c.max);
  EXPECT_EQ(this->at(e, "loss.min"), c.min);
  // Stamped with the wall clock of the closing add.
  EXPECT_GE(e.timestamp, before);
  EXPECT_LE(e.timestamp, after);

  const std::map<std::string, T> expected = {
      {"value", c.value}, {"mean", c.mean}, {"count", c.count},
      {"sum", c.sum},     {"max", c.max},   {"min", c.min}};
  EXPECT_EQ(byName(s.get()), expected);
  EXPECT_EQ(s.count(), 1);
}

TYPED_TEST(StatTest, CountIsOfTheStatType) {
  using T = TypeParam;
  {
    Stat<T> s("n", {COUNT}, 100ms);
    s.add(T(3));
  }
  const auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u);
  const auto& v = evs[0].data.at("n.count");
  if constexpr (std::is_same_v<T, double>) {
    EXPECT_TRUE(std::holds_alternative<double>(v));
  } else {
    EXPECT_TRUE(std::holds_alternative<int64_t>(v));
  }
}

TYPED_TEST(StatTest, OneKeyPerDistinctEnabledAggregation) {
  using T = TypeParam;
  {
    Stat<T> s("x", {SUM, MAX, SUM, SUM}, 100ms);
    s.add(T(2));
    s.add(T(5));
    EXPECT_EQ(byName(s.get()), (zerosFor<T>({SUM, MAX})));
  }
  const auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(keysOf(evs[0]), (std::vector<std::string>{"x.max", "x.sum"}));
  EXPECT_EQ(this->at(evs[0], "x.sum"), T(7));
  EXPECT_EQ(this->at(evs[0], "x.max"), T(5));
}

TYPED_TEST(StatTest, SingleSampleWindow) {
  using T = TypeParam;
  {
    Stat<T> s("one", kAllAggregations, 100ms);
    s.add(T(-4));
  }
  const auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u);
  for (const char* k : {"one.value", "one.mean", "one.sum", "one.max",
                        "one.min"}) {
    EXPECT_EQ(this->at(evs[0], k), T(-4)) << k;
  }
  EXPECT_EQ(this->at(evs[0], "one.count"), T(1));
}

// addIfWindowOpen adds only within the open window, where nothing closes:
// not before the first add opens one, not once the window has ended (the
// add() that follows closes it), and never to a capped Stat.
TEST_F(StatTestBase, AddIfWindowOpenAddsOnlyWhereNoWindowCloses) {
  test::FakeClock clock(1000);
  {
    Stat<double> s("open", {COUNT, SUM}, 100ms);
    EXPECT_FALSE(s.addIfWindowOpen(1.0)); // no window yet
    s.add(2.0); // opens [1000, 1100)
    EXPECT_TRUE(s.addIfWindowOpen(3.0));
    clock.set(1099);
    EXPECT_TRUE(s.addIfWindowOpen(4.0));
    EXPECT_EQ(s.count(), 3);
    clock.set(1100);
    EXPECT_FALSE(s.addIfWindowOpen(5.0)); // the window ended: nothing logged
    EXPECT_TRUE(events().empty());
    s.add(6.0); // closes it
    ASSERT_EQ(events().size(), 1u);
    EXPECT_EQ(valueOf<double>(events()[0], "open.count"), 3.0);
    EXPECT_EQ(valueOf<double>(events()[0], "open.sum"), 9.0);
    Stat<double> capped("capped", {COUNT}, 100ms, /*maxSamples=*/10);
    capped.add(1.0);
    EXPECT_FALSE(capped.addIfWindowOpen(1.0));
    EXPECT_EQ(capped.count(), 1);
  }
}

TEST_F(StatTestBase, IntegerMeanTruncates) {
  {
    Stat<int64_t> a("a", {MEAN}, 100ms);
    a.add(1);
    a.add(2);
    Stat<int64_t> b("b", {MEAN}, 100ms);
    b.add(-7);
    b.add(0);
    Stat<double> c("c", {MEAN}, 100ms);
    c.add(1);
    c.add(2);
  }
  const auto evs = events();
  ASSERT_EQ(evs.size(), 3u);
  std::map<std::string, data_value_t> means;
  for (const Event& e : evs) {
    for (const auto& kv : e.data) {
      means[kv.first] = kv.second;
    }
  }
  EXPECT_EQ(means.at("a.mean"), data_value_t(int64_t(1)));
  EXPECT_EQ(means.at("b.mean"), data_value_t(int64_t(-3)));
  EXPECT_EQ(means.at("c.mean"), data_value_t(1.5));
}

// Decision (docs/differences.md): integer sums wrap modulo 2**64, as
// torch::monitor's int64 Stat does in practice, rather than overflow (UB),
// saturate or throw, which would cost every add a check.
TEST_F(StatTestBase, IntegerSumWraps) {
  {
    Stat<int64_t> s("w", {SUM, MAX}, 100ms);
    s.add(std::numeric_limits<int64_t>::max());
    s.add(1);
  }
  const auto evs = events();
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(valueOf<int64_t>(evs[0], "w.sum"),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(valueOf<int64_t>(evs[0], "w.max"),
            std::numeric_limits<int64_t>::max());
}

TEST_F(StatTestBase, NaNFirstSamplePoisonsMaxAndMin) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  {
    Stat<double> s("n", kAllAggregations, 100ms);
    s.add(nan);
    s.add(1.0);
    s.add(2.0);
  }
  const auto evs = events();
  ASSERT_EQ(evs.size(), 1u);
  const Event& e = evs[0];
  EXPECT_TRUE(std::isnan(valueOf<double>(e, "n.max")));
  EXPECT_TRUE(std::isnan(valueOf<double>(e, "n.min")));
  EXPECT_TRUE(std::isnan(valueOf<double>(e, "n.sum")));
  EXPECT_TRUE(std::isnan(valueOf<double>(e, "n.mean")));
  EXPECT_EQ(valueOf<double>(e, "n.value"), 2.0);
  EXPECT_EQ(valueOf<double>(e, "n.count"), 3.0);
}

TEST_F(StatTestBase, LaterNaNsAreIgnoredByMaxAndMin) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  {
    Stat<double> s("n", kAllAggregations, 100ms);
    s.add(1.0);
    s.add(nan);
    s.add(3.0);
    s.add(nan);
    s.add(-1.0);
  }
  const auto evs = events();
  ASSERT_EQ(evs.size(), 1u);
  const Event& e = evs[0];
  EXPECT_EQ(valueOf<double>(e, "n.max"), 3.0);
  EXPECT_EQ(valueOf<double>(e, "n.min"), -1.0);
  EXPECT_TRUE(std::isnan(valueOf<double>(e, "n.sum")));
  EXPECT_TRUE(std::isnan(valueOf<double>(e, "n.mean")));
  EXPECT_EQ(valueOf<double>(e, "n.value"), -1.0);
  EXPECT_EQ(valueOf<double>(e, "n.count"), 5.0);
}

TEST_F(StatTestBase, NaNLastSampleIsTheValue) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Stat<double> s("n", {VALUE, MAX}, 100ms);
  clock.set(10);
  s.add(5.0);
  s.add(nan);
  clock.set(100);
  s.add(0.0);
  const auto got = s.get();
  EXPECT_TRUE(std::isnan(got.at(VALUE)));
  EXPECT_EQ(got.at(MAX), 5.0);
}

TEST_F(StatTestBase, InfinitiesAreOrdinarySamples) {
  const double inf = std::numeric_limits<double>::infinity();
  Stat<double> s("i", {MAX, MIN, SUM}, 100ms);
  clock.set(10);
  s.add(inf);
  s.add(-1.0);
  clock.set(100);
  s.add(0.0);
  auto got = s.get();
  EXPECT_EQ(got.at(MAX), inf);
  EXPECT_EQ(got.at(MIN), -1.0);
  EXPECT_EQ(got.at(SUM), inf);
}

// ---------------------------------------------------------------------------
// Windows

TYPED_TEST(StatTest, WindowsAreAlignedToMultiplesOfTheWindow) {
  using T = TypeParam;
  this->clock.set(130); // construction time does not matter
  Stat<T> s("w", {SUM, COUNT}, 100ms);

  this->clock.set(150);
  s.add(T(1));
  this->clock.set(199);
  s.add(T(2));
  EXPECT_TRUE(this->events().empty()) << "150 and 199 share [100, 200)";
  EXPECT_EQ(s.count(), 2);

  this->clock.set(200);
  s.add(T(4));
  auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u) << "the add at 200 closes [100, 200)";
  // The event is the closed window's: the new sample is not in it.
  EXPECT_EQ(this->at(evs[0], "w.sum"), T(3));
  EXPECT_EQ(this->at(evs[0], "w.count"), T(2));
  EXPECT_EQ(s.count(), 1) << "the sample at 200 opens [200, 300)";

  this->clock.set(299);
  s.add(T(8));
  EXPECT_EQ(this->events().size(), 1u);
  this->clock.set(300);
  s.add(T(16));
  evs = this->events();
  ASSERT_EQ(evs.size(), 2u);
  EXPECT_EQ(this->at(evs[1], "w.sum"), T(12));
  EXPECT_EQ(this->at(evs[1], "w.count"), T(2));
}

// A window opened by the first add ends on the next multiple of the window,
// not one window after the first add.
TYPED_TEST(StatTest, WindowIsNotAlignedToTheFirstAdd) {
  using T = TypeParam;
  Stat<T> s("w", {SUM}, 100ms);
  this->clock.set(195);
  s.add(T(1));
  this->clock.set(205);
  s.add(T(2));
  const auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(this->at(evs[0], "w.sum"), T(1));
}

// window id = now_ms / window_ms + 1, with an odd window size.
TYPED_TEST(StatTest, WindowIdFormulaWithOddWindow) {
  using T = TypeParam;
  Stat<T> s("w", {COUNT}, 7ms);
  // [0, 7) [7, 14) [14, 21) ...
  for (int64_t t : {0, 3, 6}) {
    this->clock.set(t);
    s.add(T(1));
  }
  EXPECT_TRUE(this->events().empty());
  this->clock.set(7);
  s.add(T(1));
  ASSERT_EQ(this->events().size(), 1u);
  EXPECT_EQ(this->at(this->events()[0], "w.count"), T(3));
  this->clock.set(13);
  s.add(T(1));
  EXPECT_EQ(this->events().size(), 1u);
  this->clock.set(14);
  s.add(T(1));
  ASSERT_EQ(this->events().size(), 2u);
  EXPECT_EQ(this->at(this->events()[1], "w.count"), T(2));
}

TYPED_TEST(StatTest, OneMillisecondWindow) {
  using T = TypeParam;
  Stat<T> s("w", {COUNT}, 1ms);
  for (int64_t t = 10; t < 20; ++t) {
    this->clock.set(t);
    s.add(T(1));
    s.add(T(1));
  }
  // Every ms closed the previous one (the last one is still open).
  const auto evs = this->events();
  ASSERT_EQ(evs.size(), 9u);
  for (const Event& e : evs) {
    EXPECT_EQ(this->at(e, "w.count"), T(2));
  }
  EXPECT_EQ(s.count(), 2);
}

TYPED_TEST(StatTest, NoCloseWithoutAnAdd) {
  using T = TypeParam;
  Stat<T> s("w", {SUM}, 100ms);
  this->clock.set(150);
  s.add(T(1));
  this->clock.set(100000);
  // No timer: reads do not close the window either.
  EXPECT_EQ(s.count(), 1);
  EXPECT_EQ(byName(s.get()), zerosFor<T>({SUM}));
  EXPECT_TRUE(this->events().empty());
}

TYPED_TEST(StatTest, SkippedWindowsEmitNothing) {
  using T = TypeParam;
  {
    Stat<T> s("w", {SUM, COUNT}, 100ms);
    this->clock.set(150);
    s.add(T(1));
    this->clock.set(1050); // nine windows later
    s.add(T(2));
    auto evs = this->events();
    ASSERT_EQ(evs.size(), 1u) << "only [100, 200) had samples";
    EXPECT_EQ(this->at(evs[0], "w.sum"), T(1));
    this->clock.set(1099);
    s.add(T(4));
    EXPECT_EQ(this->events().size(), 1u);
  }
  const auto evs = this->events();
  ASSERT_EQ(evs.size(), 2u);
  EXPECT_EQ(this->at(evs[1], "w.sum"), T(6));
  EXPECT_EQ(this->at(evs[1], "w.count"), T(2));
}

TYPED_TEST(StatTest, GetIsZerosBeforeTheFirstClose) {
  using T = TypeParam;
  Stat<T> s("g", kAllAggregations, 100ms);
  EXPECT_EQ(byName(s.get()), zerosFor<T>(kAllAggregations));
  this->clock.set(120);
  s.add(T(5));
  s.add(T(9));
  EXPECT_EQ(byName(s.get()), zerosFor<T>(kAllAggregations))
      << "get() must not show the open window";
  EXPECT_EQ(s.get().size(), kAllAggregations.size());
}

TYPED_TEST(StatTest, GetReturnsTheLastClosedWindow) {
  using T = TypeParam;
  Stat<T> s("g", {SUM, COUNT, VALUE}, 100ms);
  this->clock.set(120);
  s.add(T(5));
  s.add(T(7));
  this->clock.set(230);
  s.add(T(100));
  EXPECT_EQ(
      byName(s.get()),
      (std::map<std::string, T>{{"sum", T(12)}, {"count", T(2)},
                                {"value", T(7)}}));
  s.add(T(1000)); // same window: get() unchanged
  EXPECT_EQ(byName(s.get()).at("sum"), T(12));
  this->clock.set(300);
  s.add(T(1));
  EXPECT_EQ(
      byName(s.get()),
      (std::map<std::string, T>{{"sum", T(1100)}, {"count", T(2)},
                                {"value", T(1000)}}));
}

TYPED_TEST(StatTest, CountIsTheOpenWindowsSamples) {
  using T = TypeParam;
  Stat<T> s("c", {SUM}, 100ms);
  EXPECT_EQ(s.count(), 0);
  this->clock.set(110);
  for (int i = 1; i <= 3; ++i) {
    s.add(T(i));
    EXPECT_EQ(s.count(), i);
  }
  this->clock.set(210);
  s.add(T(1));
  EXPECT_EQ(s.count(), 1);
}

TYPED_TEST(StatTest, DestructionEmitsTheOpenWindowBeforeItEnds) {
  using T = TypeParam;
  {
    Stat<T> s("d", {SUM, COUNT}, 100ms);
    this->clock.set(150);
    s.add(T(3));
    this->clock.set(160);
    s.add(T(4));
    this->clock.set(170); // the window ends at 200
  }
  const auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(evs[0].name, kStatEventName);
  EXPECT_EQ(this->at(evs[0], "d.sum"), T(7));
  EXPECT_EQ(this->at(evs[0], "d.count"), T(2));
}

TYPED_TEST(StatTest, DestructionOfAnEndedButUnclosedWindowEmitsIt) {
  using T = TypeParam;
  {
    Stat<T> s("d", {SUM}, 100ms);
    this->clock.set(150);
    s.add(T(3));
    this->clock.set(5000);
  }
  const auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(this->at(evs[0], "d.sum"), T(3));
}

TYPED_TEST(StatTest, DestructionOfAnEmptyStatEmitsNothing) {
  using T = TypeParam;
  { Stat<T> never("never", kAllAggregations, 100ms); }
  {
    // Capped: the max_samples close leaves an empty open window.
    Stat<T> capped("capped", {SUM}, 100ms, 2);
    this->clock.set(110);
    capped.add(T(1));
    capped.add(T(2));
    ASSERT_EQ(this->events().size(), 1u);
    capped.add(T(3)); // discarded
  }
  EXPECT_EQ(this->events().size(), 1u);
}

TYPED_TEST(StatTest, HugeWindowClosesOnlyOnDestruction) {
  using T = TypeParam;
  {
    Stat<T> s("h", {COUNT}, std::chrono::hours(24 * 365));
    for (int64_t t = 0; t < 1000; ++t) {
      this->clock.set(t * 1000000);
      s.add(T(1));
    }
    EXPECT_TRUE(this->events().empty());
    EXPECT_EQ(s.count(), 1000);
  }
  const auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(this->at(evs[0], "h.count"), T(1000));
}

// Huge windows must not overflow the clock choice (checked by UBSan builds).
TYPED_TEST(StatTest, MaximalWindow) {
  using T = TypeParam;
  {
    Stat<T> s("h", {COUNT}, std::chrono::milliseconds(Stat<T>::kMaxWindowMs));
    this->clock.set(1);
    s.add(T(1));
    this->clock.set(Stat<T>::kMaxWindowMs - 1);
    s.add(T(1));
    EXPECT_TRUE(this->events().empty());
  }
  ASSERT_EQ(this->events().size(), 1u);
  EXPECT_EQ(this->at(this->events()[0], "h.count"), T(2));
}

TYPED_TEST(StatTest, TwoStatsAreIndependent) {
  using T = TypeParam;
  Stat<T> a("a", {SUM}, 100ms);
  Stat<T> b("b", {SUM}, 10ms);
  this->clock.set(100);
  a.add(T(1));
  b.add(T(2));
  this->clock.set(110);
  b.add(T(3)); // closes b's window only
  auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(keysOf(evs[0]), std::vector<std::string>{"b.sum"});
  EXPECT_EQ(a.count(), 1);
  EXPECT_EQ(b.count(), 1);
}

// ---------------------------------------------------------------------------
// max_samples

TYPED_TEST(StatTest, MaxSamplesClosesTheWindowAtOnce) {
  using T = TypeParam;
  std::optional<Stat<T>> s;
  s.emplace("m", std::vector<Aggregation>{SUM, COUNT, VALUE}, 100ms, 3);

  this->clock.set(110);
  s->add(T(1));
  this->clock.set(120);
  s->add(T(2));
  EXPECT_EQ(s->count(), 2);
  EXPECT_TRUE(this->events().empty());

  this->clock.set(130);
  s->add(T(4)); // reaches max: closes now, the event includes it
  auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(this->at(evs[0], "m.sum"), T(7));
  EXPECT_EQ(this->at(evs[0], "m.count"), T(3));
  EXPECT_EQ(this->at(evs[0], "m.value"), T(4));
  EXPECT_EQ(s->count(), 0) << "0 right after a close";
  EXPECT_EQ(byName(s->get()).at("sum"), T(7));

  // The rest of the window is discarded.
  this->clock.set(140);
  s->add(T(8));
  this->clock.set(199);
  s->add(T(16));
  EXPECT_EQ(s->count(), 0);
  EXPECT_EQ(this->events().size(), 1u);
  EXPECT_EQ(byName(s->get()).at("value"), T(4)) << "discarded: not VALUE";

  // The first add of the next window closes the empty discarded window: no
  // event, but get() goes back to zeros (torch.monitor's quirk, kept).
  this->clock.set(210);
  s->add(T(32));
  EXPECT_EQ(this->events().size(), 1u);
  EXPECT_EQ(byName(s->get()), (zerosFor<T>({SUM, COUNT, VALUE})));
  EXPECT_EQ(s->count(), 1) << "the new window accepts samples again";

  s.reset();
  evs = this->events();
  ASSERT_EQ(evs.size(), 2u);
  EXPECT_EQ(this->at(evs[1], "m.sum"), T(32));
  EXPECT_EQ(this->at(evs[1], "m.count"), T(1));
}

TYPED_TEST(StatTest, MaxSamplesNotReachedBehavesLikeUnlimited) {
  using T = TypeParam;
  Stat<T> s("m", {SUM, COUNT}, 100ms, 10);
  this->clock.set(110);
  s.add(T(1));
  s.add(T(2));
  s.add(T(3));
  EXPECT_TRUE(this->events().empty());
  this->clock.set(250);
  s.add(T(4));
  const auto evs = this->events();
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(this->at(evs[0], "m.sum"), T(6));
  EXPECT_EQ(this->at(evs[0], "m.count"), T(3));
  EXPECT_EQ(s.count(), 1);
}

TYPED_TEST(StatTest, MaxSamplesOne) {
  using T = TypeParam;
  Stat<T> s("one", {VALUE, COUNT}, 100ms, 1);
  this->clock.set(100);
  s.add(T(5)); // closes at once
  ASSERT_EQ(this->events().size(), 1u);
  EXPECT_EQ(this->at(this->events()[0], "one.value"), T(5));
  EXPECT_EQ(this->at(this->events()[0], "one.count"), T(1));
  EXPECT_EQ(s.count(), 0);
  EXPECT_EQ(byName(s.get()).at("value"), T(5));

  s.add(T(6)); // same window: discarded
  this->clock.set(199);
  s.add(T(7));
  EXPECT_EQ(this->events().size(), 1u);
  EXPECT_EQ(s.count(), 0);

  this->clock.set(200);
  s.add(T(8)); // closes the empty window, then accepted and closed at once
  ASSERT_EQ(this->events().size(), 2u);
  EXPECT_EQ(this->at(this->events()[1], "one.value"), T(8));
  EXPECT_EQ(byName(s.get()).at("value"), T(8));
  EXPECT_EQ(s.count(), 0);

  this->clock.set(750);
  s.add(T(9));
  ASSERT_EQ(this->events().size(), 3u);
  EXPECT_EQ(this->at(this->events()[2], "one.value"), T(9));
}

TYPED_TEST(StatTest, MaxSamplesDiscardedWindowThenSkippedWindows) {
  using T = TypeParam;
  Stat<T> s("m", {SUM}, 100ms, 2);
  this->clock.set(100);
  s.add(T(1));
  s.add(T(2));
  s.add(T(3)); // discarded
  ASSERT_EQ(this->events().size(), 1u);
  this->clock.set(1000); // eight windows later
  s.add(T(10));
  EXPECT_EQ(this->events().size(), 1u);
  EXPECT_EQ(byName(s.get()).at("sum"), T(0));
  EXPECT_EQ(s.count(), 1);
  s.add(T(20)); // reaches max in the new window
  ASSERT_EQ(this->events().size(), 2u);
  EXPECT_EQ(this->at(this->events()[1], "m.sum"), T(30));
}

// The first sample of a window closes the previous one, which had not reached
// max_samples: that window's event, then the new sample is accepted.
TYPED_TEST(StatTest, MaxSamplesWindowEndsBeforeTheCap) {
  using T = TypeParam;
  Stat<T> s("m", {SUM, COUNT}, 100ms, 2);
  this->clock.set(150);
  s.add(T(1));
  this->clock.set(200);
  s.add(T(2));
  ASSERT_EQ(this->events().size(), 1u);
  EXPECT_EQ(this->at(this->events()[0], "m.count"), T(1));
  EXPECT_EQ(s.count(), 1);
  s.add(T(4));
  ASSERT_EQ(this->events().size(), 2u);
  EXPECT_EQ(this->at(this->events()[1], "m.sum"), T(6));
}

// ---------------------------------------------------------------------------
// Differential test against torch::monitor::Stat.
//
// torch::monitor::Stat::currentWindowId() is a protected virtual (PyTorch's
// own tests override it); this subclass computes it from our fake clock with
// torch's own formula (now / window + 1), so both stats see the same windows
// and every window-driven behaviour can be compared, not only max_samples.

template <typename T>
class TorchFakeClockStat : public torch::monitor::Stat<T> {
 public:
  TorchFakeClockStat(
      std::string name,
      std::vector<torch::monitor::Aggregation> aggregations,
      int64_t windowMs,
      int64_t maxSamples)
      : torch::monitor::Stat<T>(
            std::move(name),
            std::move(aggregations),
            std::chrono::milliseconds(windowMs),
            maxSamples),
        windowMs_(windowMs) {}

 protected:
  uint64_t currentWindowId() const override {
    return uint64_t(readClock(ClockSource::PRECISE) / windowMs_ + 1);
  }

 private:
  const int64_t windowMs_;
};

class TorchRecorder : public torch::monitor::EventHandler {
 public:
  void handle(const torch::monitor::Event& e) override {
    std::lock_guard<std::mutex> guard(mutex_);
    events_.push_back(e);
  }
  std::vector<torch::monitor::Event> events() const {
    std::lock_guard<std::mutex> guard(mutex_);
    return events_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<torch::monitor::Event> events_;
};

struct ScopedTorchRecorder {
  std::shared_ptr<TorchRecorder> handler = std::make_shared<TorchRecorder>();
  ScopedTorchRecorder() {
    torch::monitor::registerEventHandler(handler);
  }
  ~ScopedTorchRecorder() {
    torch::monitor::unregisterEventHandler(handler);
  }
};

template <typename T, typename Map>
std::map<int, T> byInt(const Map& m) {
  std::map<int, T> out;
  for (const auto& [a, v] : m) {
    out[static_cast<int>(a)] = v;
  }
  return out;
}

template <typename T>
void compareWithTorch(
    uint32_t seed,
    int64_t windowMs,
    int64_t maxSamples,
    const std::vector<Aggregation>& aggs,
    test::FakeClock& clock,
    const test::RecordingHandler& ours) {
  SCOPED_TRACE(
      "seed " + std::to_string(seed) + ", window " + std::to_string(windowMs) +
      " ms, max_samples " + std::to_string(maxSamples));
  ScopedTorchRecorder theirs;
  std::vector<torch::monitor::Aggregation> theirAggs;
  for (Aggregation a : aggs) {
    theirAggs.push_back(static_cast<torch::monitor::Aggregation>(a));
  }
  const size_t oursBefore = ours.statEvents().size();
  std::mt19937 rng(seed);
  clock.set(int64_t(rng() % 1000) + 1);

  auto compareEvents = [&](const char* when, int step) {
    const auto a = ours.statEvents();
    const auto b = theirs.handler->events();
    ASSERT_EQ(a.size() - oursBefore, b.size()) << when << " step " << step;
    for (size_t i = 0; i < b.size(); ++i) {
      const Event& e = a[oursBefore + i];
      EXPECT_EQ(e.name, b[i].name);
      // data_value_t is the same std::variant in both libraries.
      EXPECT_EQ(e.data, b[i].data) << when << " step " << step << " event "
                                   << i;
    }
  };

  {
    std::optional<Stat<T>> mine;
    std::optional<TorchFakeClockStat<T>> ref;
    mine.emplace("d", aggs, std::chrono::milliseconds(windowMs), maxSamples);
    ref.emplace("d", theirAggs, windowMs, maxSamples);
    for (int step = 0; step < 400; ++step) {
      const uint32_t r = rng() % 100;
      if (r < 15) {
        clock.advance(int64_t(rng() % (5 * windowMs + 1)));
      } else if (r < 50) {
        clock.advance(int64_t(rng() % (windowMs / 2 + 1)));
      }
      // Quarter-integers: every double sum and mean is exact and both
      // libraries add in the same order.
      T v = std::is_same_v<T, double> ? T(int(rng() % 401) - 200) / T(4)
                                      : T(int(rng() % 401) - 200);
      mine->add(v);
      ref->add(v);
      ASSERT_EQ(mine->count(), ref->count()) << "step " << step;
      ASSERT_EQ(byInt<T>(mine->get()), byInt<T>(ref->get()))
          << "step " << step;
      compareEvents("after add", step);
      if (::testing::Test::HasFailure()) {
        return;
      }
    }
    mine.reset();
    ref.reset();
  }
  compareEvents("after destruction", -1);
  EXPECT_GE(theirs.handler->events().size(), 10u)
      << "the script closed too few windows to compare anything";
}

TYPED_TEST(StatTest, MatchesTorchMonitorUnlimited) {
  using T = TypeParam;
  for (uint32_t seed : {1u, 2u, 3u}) {
    for (int64_t window : {1, 10, 100}) {
      compareWithTorch<T>(
          seed, window, Stat<T>::kUnlimitedSamples, kAllAggregations,
          this->clock, *this->recorder.handler);
    }
  }
}

TYPED_TEST(StatTest, MatchesTorchMonitorCapped) {
  using T = TypeParam;
  for (uint32_t seed : {4u, 5u}) {
    for (int64_t window : {1, 10, 100}) {
      for (int64_t max : {1, 2, 3, 7}) {
        compareWithTorch<T>(
            seed * 100 + uint32_t(max), window, max, kAllAggregations,
            this->clock, *this->recorder.handler);
      }
    }
  }
}

TYPED_TEST(StatTest, MatchesTorchMonitorSubsetOfAggregations) {
  using T = TypeParam;
  compareWithTorch<T>(
      7, 10, Stat<T>::kUnlimitedSamples, {MIN, SUM, MIN}, this->clock,
      *this->recorder.handler);
  compareWithTorch<T>(
      8, 10, 3, {VALUE, COUNT}, this->clock, *this->recorder.handler);
}

// The unmodified torch::monitor::Stat (steady_clock windows): with a window
// of ~11.6 days the run stays in one window of both clocks, so only
// max_samples closes and destruction act, which do not depend on the clock.
TYPED_TEST(StatTest, MatchesUnmodifiedTorchMonitorWithinOneWindow) {
  using T = TypeParam;
  constexpr int64_t kWindowMs = 1000000000;
  ScopedTorchRecorder theirs;
  const std::vector<torch::monitor::Aggregation> theirAggs = {
      torch::monitor::Aggregation::VALUE, torch::monitor::Aggregation::MEAN,
      torch::monitor::Aggregation::COUNT, torch::monitor::Aggregation::SUM,
      torch::monitor::Aggregation::MAX,   torch::monitor::Aggregation::MIN};
  for (int64_t maxSamples : {int64_t(1), int64_t(4), Stat<T>::kUnlimitedSamples}) {
    SCOPED_TRACE("max_samples " + std::to_string(maxSamples));
    const size_t oursBefore = this->events().size();
    const size_t theirsBefore = theirs.handler->events().size();
    {
      Stat<T> mine(
          "u", kAllAggregations, std::chrono::milliseconds(kWindowMs),
          maxSamples);
      torch::monitor::Stat<T> ref(
          "u", theirAggs, std::chrono::milliseconds(kWindowMs), maxSamples);
      for (int i = 0; i < 10; ++i) {
        const T v = T(i * 3 % 7) - T(2);
        mine.add(v);
        ref.add(v);
        ASSERT_EQ(mine.count(), ref.count()) << "sample " << i;
        ASSERT_EQ(byInt<T>(mine.get()), byInt<T>(ref.get())) << "sample " << i;
      }
    }
    const auto a = this->events();
    const auto b = theirs.handler->events();
    ASSERT_EQ(a.size() - oursBefore, b.size() - theirsBefore);
    ASSERT_GE(b.size() - theirsBefore, 1u);
    for (size_t i = 0; i < b.size() - theirsBefore; ++i) {
      EXPECT_EQ(a[oursBefore + i].name, b[theirsBefore + i].name);
      EXPECT_EQ(a[oursBefore + i].data, b[theirsBefore + i].data) << i;
    }
  }
}

// ---------------------------------------------------------------------------
// Exit: closeAllStats() and the last window of a Stat that is never destroyed

TEST_F(StatTestBase, CloseAllStatsLogsOpenWindowsAndStatsStayUsable) {
  Stat<double> sharded("close.sharded", {SUM, COUNT}, 1h);
  Stat<int64_t> capped("close.capped", {SUM}, 1h, 10);
  Stat<double> empty("close.empty", {SUM}, 1h);
  sharded.add(1.5);
  sharded.add(2.0);
  capped.add(4);
  closeAllStats();
  auto evs = events();
  ASSERT_EQ(evs.size(), 2u); // the empty stat logs nothing
  std::map<std::string, data_value_t> data;
  for (const Event& e : evs) {
    data.insert(e.data.begin(), e.data.end());
  }
  EXPECT_EQ(data.at("close.sharded.sum"), data_value_t(3.5));
  EXPECT_EQ(data.at("close.sharded.count"), data_value_t(2.0));
  EXPECT_EQ(data.at("close.capped.sum"), data_value_t(int64_t(4)));
  EXPECT_EQ(byName(sharded.get()).at("sum"), 3.5);
  EXPECT_EQ(sharded.count(), 0);
  // Nothing twice: a second close and the destructors log only new samples.
  closeAllStats();
  EXPECT_EQ(events().size(), 2u);
  sharded.add(1.0);
  capped.add(1);
  EXPECT_EQ(sharded.count(), 1);
  EXPECT_EQ(capped.count(), 1);
  closeAllStats();
  EXPECT_EQ(events().size(), 4u);
}

// A Stat owned by something that is never destroyed (a leaked object, a
// module-level Python object, a registered handler) still logs its last
// window at exit, and before the sinks flush: the event is in the file.
TEST(StatExit, LastWindowOfAStatThatIsNeverDestroyedReachesHandlersAndSinks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The "threadsafe" child re-runs this test body: no pid in the name.
  const std::string path =
      ::testing::TempDir() + "torch_monitor_test_stat_exit.jsonl";
  std::remove(path.c_str());
  EXPECT_EXIT(
      {
        registerEventHandler(std::make_shared<test::FunctionHandler>(
            [](const Event& e) {
              for (const auto& [key, value] : e.data) {
                std::fprintf(
                    stderr, "handler got %s=%g\n", key.c_str(),
                    std::get<double>(value));
              }
            }));
        registerEventHandler(std::make_shared<sinks::JsonLinesWriter>(path));
        auto* leaked = new Stat<double>("exit.leaked", {SUM}, 1h);
        leaked->add(1.0);
        leaked->add(5.0);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0),
      "handler got exit.leaked.sum=6");
  std::FILE* file = std::fopen(path.c_str(), "r");
  ASSERT_NE(file, nullptr) << path;
  char line[4096] = {};
  const bool read = std::fgets(line, sizeof(line), file) != nullptr;
  std::fclose(file);
  std::remove(path.c_str());
  ASSERT_TRUE(read);
  EXPECT_NE(std::string(line).find("exit.leaked.sum"), std::string::npos)
      << line;
  EXPECT_NE(std::string(line).find("6.0"), std::string::npos) << line;
}

// ---------------------------------------------------------------------------
// fork(): while other threads add (sharded and capped stats), log, and
// create and destroy stats, a forked child must never deadlock on a lock it
// inherited held, nor spin on a shard frozen mid-add; it can use every Stat.

TEST(StatFork, ChildCanUseEveryStatWhileOtherThreadsAddAndLog) {
  if (test::sanitizerForbidsThreadsAfterFork()) {
    GTEST_SKIP() << "the sanitizer runtime cannot start threads in a forked "
                    "child of a multi-threaded process; the plain build runs this";
  }
  Stat<double> sharded("fork.sharded", {SUM, COUNT}, 1ms); // closes often
  Stat<int64_t> capped("fork.capped", {SUM}, 1ms, 3);
  Stat<double> inherited("fork.inherited", {COUNT}, 1h);
  test::ScopedHandler handler(
      std::make_shared<test::FunctionHandler>([](const Event&) {}));
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        sharded.add(1.0);
        capped.add(1);
        inherited.add(1.0);
        logEvent(Event{"fork.busy", std::chrono::system_clock::now(), {}, {}});
      }
    });
  }
  threads.emplace_back([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      Stat<double> shortLived("fork.short", {SUM}, 1ms);
      shortLived.add(1.0);
      std::thread([&] { shortLived.add(1.0); }).join(); // thread slots
    }
  });
  for (int i = 0; i < 50; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::alarm(20); // a deadlocked child dies of SIGALRM
      // The open window the child inherited is the parent's to log.
      if (inherited.count() != 0) {
        ::_exit(3);
      }
      inherited.add(1.0);
      sharded.add(2.0);
      capped.add(2);
      logEvent(Event{"fork.child", std::chrono::system_clock::now(), {}, {}});
      Stat<double> fresh("fork.fresh", {SUM}, 1h);
      std::thread([&] {
        fresh.add(1.0);
        sharded.add(1.0);
      }).join();
      if (inherited.count() != 1 || fresh.count() != 1) {
        ::_exit(4);
      }
      closeAllStats();
      ::_exit(0);
    }
    test::expectChildExitedCleanly(pid, "fork " + std::to_string(i));
  }
  stop = true;
  for (auto& t : threads) {
    t.join();
  }
}

} // namespace
} // namespace torch_monitor
