// torch::monitor's C++ surface, as code written for it uses it: the
// map type of get() spelled with AggregationHash, NUM_AGGREGATIONS, Stats
// deleted through a base pointer, and the protected virtual
// currentWindowId() that subclasses override to drive windows by hand.
// Written with `using namespace torch_monitor;` at file scope, as such code
// is, so that GoogleTest's `testing::` stays unambiguous.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include <gtest/gtest.h>

#include "test_support.h"

using namespace torch_monitor;
using torch_monitor::test::FakeClock;
using torch_monitor::test::ScopedRecorder;
using torch_monitor::test::valueOf;

namespace {

// A stat whose windows follow a number the test sets.
template <typename T>
class DrivenStat : public Stat<T> {
 public:
  using Stat<T>::Stat;
  uint64_t window = 1;

 protected:
  uint64_t currentWindowId() const override {
    return window;
  }
};

// A stat that answers as Stat itself does, counting how often it is asked.
class CountingStat : public Stat<double> {
 public:
  using Stat<double>::Stat;
  mutable int asked = 0;

 protected:
  uint64_t currentWindowId() const override {
    ++asked;
    return Stat<double>::currentWindowId();
  }
};

// Sets a flag when destroyed, to see deletion through a base pointer.
class FlaggingStat : public Stat<int64_t> {
 public:
  FlaggingStat(bool& destroyed)
      : Stat<int64_t>("flagged", {Aggregation::SUM}, std::chrono::hours(1)),
        destroyed_(destroyed) {}
  ~FlaggingStat() override {
    destroyed_ = true;
  }

 private:
  bool& destroyed_;
};

// `testing::Test` must name GoogleTest's class here: the project's own test
// hooks live in torch_monitor::test_hooks.
class CppSurface : public testing::Test {};

TEST_F(CppSurface, GetReturnsTheMapTypeTorchMonitorSpellsOut) {
  Stat<int64_t> stat("a", {Aggregation::SUM}, std::chrono::hours(1), 2);
  stat.add(5);
  stat.add(6);
  const std::unordered_map<Aggregation, int64_t, AggregationHash> want = {
      {Aggregation::SUM, 11}};
  EXPECT_EQ(stat.get(), want);
  EXPECT_EQ(AggregationHash()(Aggregation::MIN), 6u);
  static_assert(NUM_AGGREGATIONS == 7, "NONE and the six aggregations");
}

TEST_F(CppSurface, DeletingThroughABasePointerRunsTheSubclassDestructor) {
  ScopedRecorder recorder;
  bool destroyed = false;
  std::unique_ptr<Stat<int64_t>> stat =
      std::make_unique<FlaggingStat>(destroyed);
  stat->add(3);
  stat.reset();
  EXPECT_TRUE(destroyed);
  // The base part still logs its open window.
  ASSERT_EQ(recorder->statEvents().size(), 1u);
  EXPECT_EQ(valueOf<int64_t>(recorder->statEvents()[0], "flagged.sum"), 3);
}

// Two stats with the same (1 ms) window, each driven by its own override:
// the real clock, which passes many windows meanwhile, plays no part.
TEST_F(CppSurface, OverridesDriveTwoStatsIndependently) {
  ScopedRecorder recorder;
  FakeClock clock(0);
  DrivenStat<int64_t> a("a", {Aggregation::SUM}, std::chrono::milliseconds(1));
  DrivenStat<double> b("b", {Aggregation::COUNT}, std::chrono::milliseconds(1));
  a.add(1);
  b.add(1.0);
  clock.advance(1000); // a thousand windows of the own clock
  a.add(2);
  b.add(2.0);
  EXPECT_EQ(a.count(), 2);
  EXPECT_EQ(b.count(), 2);
  EXPECT_TRUE(recorder->statEvents().empty());

  a.window = 2; // only a's window ends
  a.add(4);
  EXPECT_EQ(a.count(), 1);
  EXPECT_EQ(b.count(), 2);
  ASSERT_EQ(recorder->statEvents().size(), 1u);
  EXPECT_EQ(valueOf<int64_t>(recorder->statEvents()[0], "a.sum"), 3);

  b.window = 7;
  b.add(3.0);
  ASSERT_EQ(recorder->statEvents().size(), 2u);
  EXPECT_EQ(valueOf<double>(recorder->statEvents()[1], "b.count"), 2.0);
  EXPECT_EQ(a.get().at(Aggregation::SUM), 3);
}

// torch::monitor's maxSamples rule under an override: a full window is
// closed at once, later samples of the same window are dropped.
TEST_F(CppSurface, OverrideDrivesACappedStat) {
  ScopedRecorder recorder;
  DrivenStat<int64_t> stat(
      "capped", {Aggregation::SUM}, std::chrono::milliseconds(1), 2);
  stat.add(1);
  stat.add(2); // full: closed
  stat.add(100); // same window: dropped
  ASSERT_EQ(recorder->statEvents().size(), 1u);
  EXPECT_EQ(stat.count(), 0);
  stat.window = 2;
  stat.add(5);
  EXPECT_EQ(stat.count(), 1);
  EXPECT_EQ(recorder->statEvents().size(), 1u);
}

// The override point costs add() nothing within a window: it is asked at a
// boundary of the stat's own clock only (here: the first add, then each
// window), never once per sample.
TEST_F(CppSurface, CurrentWindowIdIsAskedAtWindowBoundariesOnly) {
  for (int64_t maxSamples : {Stat<double>::kUnlimitedSamples, int64_t(1000)}) {
    SCOPED_TRACE(maxSamples);
    ScopedRecorder recorder;
    FakeClock clock(0);
    CountingStat stat(
        "counted", {Aggregation::COUNT}, std::chrono::milliseconds(10),
        maxSamples);
    for (int i = 0; i < 100; ++i) {
      stat.add(1.0);
    }
    EXPECT_EQ(stat.asked, 1);
    clock.advance(10);
    for (int i = 0; i < 100; ++i) {
      stat.add(1.0);
    }
    EXPECT_EQ(stat.asked, 2);
    // Answering as Stat does is no override: the own clock keeps the lead.
    ASSERT_EQ(recorder->statEvents().size(), 1u);
    EXPECT_EQ(valueOf<double>(recorder->statEvents()[0], "counted.count"), 100);
  }
}

TEST_F(CppSurface, DestroyingADrivenStatLogsItsOpenWindow) {
  ScopedRecorder recorder;
  {
    DrivenStat<int64_t> stat(
        "last", {Aggregation::SUM}, std::chrono::hours(10));
    stat.add(1);
    EXPECT_TRUE(recorder->statEvents().empty());
  }
  ASSERT_EQ(recorder->statEvents().size(), 1u);
  EXPECT_EQ(valueOf<int64_t>(recorder->statEvents()[0], "last.sum"), 1);
}

} // namespace
