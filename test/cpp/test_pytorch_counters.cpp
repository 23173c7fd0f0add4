// capturePytorchCounters: c10's wait counters (STATIC_SCOPED_WAIT_COUNTER,
// as PyTorch's C++ times its TCPStore) become Stats while a capture runs,
// and c10's dynamic counters are read at each window's close.

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/DynamicCounter.h>
#include <c10/util/WaitCounter.h>
#include <gtest/gtest.h>

#include <torch_monitor/detail/thread_slots.h>

#include "test_support.h"

namespace torch_monitor {
namespace {

using test::ScopedRecorder;
using test::valueOf;

void timedWork() {
  STATIC_SCOPED_WAIT_COUNTER(test.cpp.capture);
  std::this_thread::sleep_for(std::chrono::microseconds(50));
}

void otherWork() {
  STATIC_SCOPED_WAIT_COUNTER(test.cpp.other);
}

PytorchCounterOptions hourWindows() {
  PytorchCounterOptions options;
  options.windowSize = std::chrono::hours(1);
  return options;
}

TEST(PytorchCounters, UnitsTimedWhileACaptureRunsAreSamplesOfTheKeysStat) {
  ScopedRecorder recorder;
  timedWork(); // before any capture: nobody's
  {
    PytorchCounterOptions options = hourWindows();
    options.include = "capture$";
    auto capture = capturePytorchCounters(options);
    for (int i = 0; i < 3; ++i) {
      timedWork();
      otherWork();
    }
    EXPECT_EQ(capture->keys(), std::vector<std::string>{"test.cpp.capture"});
  } // destroyed: the open window is logged
  timedWork(); // after: nobody's
  ASSERT_EQ(recorder->statEvents().size(), 1u);
  const Event e = recorder->statEvents()[0];
  EXPECT_EQ(
      test::keysOf(e),
      (std::vector<std::string>{
          "test.cpp.capture.count",
          "test.cpp.capture.max",
          "test.cpp.capture.mean",
          "test.cpp.capture.sum"}));
  EXPECT_EQ(valueOf<double>(e, "test.cpp.capture.count"), 3.0);
  EXPECT_GE(valueOf<double>(e, "test.cpp.capture.max"), 50.0); // microseconds
  EXPECT_LT(valueOf<double>(e, "test.cpp.capture.max"), 50.0 * 1000);
}

TEST(PytorchCounters, BadOptionsAreRefusedWithTheReason) {
  PytorchCounterOptions badRegex;
  badRegex.exclude = "[";
  EXPECT_THROW(
      {
        try {
          PytorchCounterCapture capture(badRegex);
        } catch (const c10::ValueError& e) {
          EXPECT_NE(
              std::string(e.what()).find("exclude='[' is not a valid regular expression"),
              std::string::npos);
          throw;
        }
      },
      c10::ValueError);
  PytorchCounterOptions stepsOnTime;
  stepsOnTime.windowSteps = 2;
  stepsOnTime.closeOnTime = true;
  EXPECT_THROW(PytorchCounterCapture capture(stepsOnTime), c10::ValueError);
  PytorchCounterOptions noWindow;
  noWindow.windowSize = std::chrono::milliseconds(0);
  EXPECT_THROW(PytorchCounterCapture capture(noWindow), c10::ValueError);
}

// remove() waits for the units being recorded into the capture; captures
// come and go while threads time work (ASan sees any use after free): four,
// each with a thread slot, then more than there are slots, so that some
// read through the overflow path.
class CapturesComeAndGo : public testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(
    Threads,
    CapturesComeAndGo,
    testing::Values(4, detail::kMaxThreadSlots + 6));

TEST_P(CapturesComeAndGo, WhileThreadsTimeWork) {
  const int threadCount = GetParam();
  ScopedRecorder recorder;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < threadCount; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        otherWork();
      }
    });
  }
  for (int i = 0; i < (threadCount > 4 ? 10 : 200); ++i) {
    PytorchCounterOptions options;
    options.windowSize = std::chrono::milliseconds(1);
    PytorchCounterCapture first(options);
    PytorchCounterCapture second(hourWindows());
    first.remove();
    EXPECT_TRUE(first.removed());
  }
  stop = true;
  for (auto& thread : threads) {
    thread.join();
  }
  for (const Event& e : recorder->statEvents()) {
    // A window's units, or how many of the four threads' were running (0:
    // none since the close that saw some).
    if (e.data.count("test.cpp.other.active") != 0) {
      EXPECT_EQ(e.data.size(), 1u);
      EXPECT_GE(valueOf<int64_t>(e, "test.cpp.other.active"), 0);
      EXPECT_LE(valueOf<int64_t>(e, "test.cpp.other.active"), threadCount);
    } else {
      EXPECT_GE(valueOf<double>(e, "test.cpp.other.count"), 1.0);
    }
  }
}

// c10's dynamic counters are read at each window's close when the capture
// takes their key; one destroyed is read no more (c10 unregisters it, and
// the backend waits for a read under way).
TEST(PytorchCounters, DynamicCountersAreReadAtEachClose) {
  ScopedRecorder recorder;
  std::atomic<int64_t> value{7};
  setStep(0);
  {
    PytorchCounterOptions options;
    options.windowSteps = 2;
    options.exclude = "ignored$";
    auto capture = capturePytorchCounters(options);
    auto counter = std::make_unique<c10::monitor::DynamicCounter>(
        "test.cpp.dynamic", [&] { return value.load(); });
    c10::monitor::DynamicCounter ignored(
        "test.cpp.dynamic.ignored", [] { return int64_t(1); });
    setStep(1); // within [0, 2): nothing read
    setStep(2); // closes [0, 2)
    value = 9;
    setStep(4); // closes [2, 4)
    counter.reset();
    setStep(6); // closes [4, 6): nothing to read
  } // removed: its last window reads nothing either
  clearStep();
  const std::vector<Event> events = recorder->statEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].step, 2);
  EXPECT_EQ(
      test::keysOf(events[0]), std::vector<std::string>{"test.cpp.dynamic"});
  EXPECT_EQ(valueOf<int64_t>(events[0], "test.cpp.dynamic"), 7);
  EXPECT_EQ(events[1].step, 4);
  EXPECT_EQ(valueOf<int64_t>(events[1], "test.cpp.dynamic"), 9);
}

} // namespace
} // namespace torch_monitor
