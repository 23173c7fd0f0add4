// WaitCounter: each guard is one unit of work, its duration one sample (in
// microseconds) of a Stat named after the key.

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.h"

namespace torch_monitor {
namespace {

using test::FakeClock;
using test::ScopedRecorder;
using test::valueOf;

TEST(WaitCounter, GuardsRecordCountTotalMaxAndMeanPerWindow) {
  ScopedRecorder recorder;
  FakeClock clock(0);
  WaitCounter counter("io.read", std::chrono::milliseconds(1000));
  EXPECT_EQ(counter.key(), "io.read");
  counter.record(std::chrono::microseconds(10));
  counter.record(std::chrono::microseconds(30));
  {
    auto guard = counter.guard();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(counter.stat().count(), 3);
  clock.advance(1000);
  counter.record(std::chrono::microseconds(1)); // closes the window
  ASSERT_EQ(recorder->statEvents().size(), 1u);
  const Event e = recorder->statEvents()[0];
  EXPECT_EQ(
      test::keysOf(e),
      (std::vector<std::string>{
          "io.read.count", "io.read.max", "io.read.mean", "io.read.sum"}));
  EXPECT_EQ(valueOf<double>(e, "io.read.count"), 3.0);
  const double slept = valueOf<double>(e, "io.read.max");
  EXPECT_GE(slept, 2000.0); // microseconds
  EXPECT_LT(slept, 2000.0 * 1000); // not nanoseconds
  EXPECT_DOUBLE_EQ(valueOf<double>(e, "io.read.sum"), 40.0 + slept);
  EXPECT_DOUBLE_EQ(valueOf<double>(e, "io.read.mean"), (40.0 + slept) / 3);
}

TEST(WaitCounter, StopRecordsOnceAndAMovedGuardOnce) {
  WaitCounter counter("once", std::chrono::hours(1));
  auto guard = counter.guard();
  guard.stop();
  guard.stop();
  EXPECT_EQ(counter.stat().count(), 1);
  {
    auto first = counter.guard();
    auto moved = std::move(first);
  }
  EXPECT_EQ(counter.stat().count(), 2);
}

TEST(WaitCounter, GuardsOnManyThreadsAreAllCounted) {
  WaitCounter counter("threads", std::chrono::hours(1));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        auto guard = counter.guard();
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(counter.stat().count(), 4000);
}

// A handler failing while a guard's destructor records: a warning, not
// std::terminate; stop() lets the exception reach its caller.
TEST(WaitCounter, AThrowingHandlerIsAWarningInTheDestructor) {
  FakeClock clock(0);
  test::ScopedHandler failing(std::make_shared<test::FunctionHandler>(
      [](const Event&) { throw std::runtime_error("handler failed"); }));
  WaitCounter counter("faulty", std::chrono::milliseconds(10));
  counter.record(std::chrono::microseconds(1));
  clock.advance(10);
  { auto guard = counter.guard(); } // closes the window: warns
  clock.advance(10);
  auto guard = counter.guard();
  EXPECT_THROW(guard.stop(), std::runtime_error);
  EXPECT_EQ(counter.stat().count(), 1); // recorded all the same
}

TEST(WaitCounter, RejectsBadKeysWindowsAndDurations) {
  test::expectValueError(
      [] { WaitCounter(std::string("bad\0key", 7), std::chrono::hours(1)); },
      {"name"});
  test::expectValueError(
      [] { WaitCounter("k", std::chrono::milliseconds(0)); },
      {"window_size", "1 millisecond"});
  WaitCounter counter("k");
  test::expectValueError(
      [&] { counter.record(std::chrono::nanoseconds(-1)); },
      {"'k'", "negative"});
  EXPECT_EQ(counter.stat().windowSize(), WaitCounter::kDefaultWindow);
}

TEST(WaitCounter, SharedCountersAreOnePerKeyWindowAndClose) {
  const auto first = sharedWaitCounter("shared.key", std::chrono::hours(1));
  const auto again = sharedWaitCounter("shared.key", std::chrono::hours(1));
  EXPECT_EQ(first.get(), again.get());
  const auto otherWindow = sharedWaitCounter("shared.key", std::chrono::hours(2));
  const auto onTime = sharedWaitCounter(
      "shared.key", std::chrono::hours(1), WindowClose::ON_TIME);
  EXPECT_NE(otherWindow.get(), first.get());
  EXPECT_NE(onTime.get(), first.get());
  EXPECT_NE(onTime.get(), otherWindow.get());
  first->record(std::chrono::microseconds(5));
  EXPECT_EQ(again->stat().count(), 1);
  test::expectValueError(
      [] { sharedWaitCounter(std::string("bad\0key", 7)); }, {"name"});
}

} // namespace
} // namespace torch_monitor
