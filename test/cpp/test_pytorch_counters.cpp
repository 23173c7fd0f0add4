// capturePytorchCounters: c10's wait counters (STATIC_SCOPED_WAIT_COUNTER,
// as PyTorch's C++ times its TCPStore) become Stats while a capture runs.

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/WaitCounter.h>
#include <gtest/gtest.h>

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
// come and go while four threads time work (ASan sees any use after free).
TEST(PytorchCounters, CapturesComeAndGoWhileThreadsTimeWork) {
  ScopedRecorder recorder;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        otherWork();
      }
    });
  }
  for (int i = 0; i < 200; ++i) {
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
    EXPECT_GE(valueOf<double>(e, "test.cpp.other.count"), 1.0);
  }
}

} // namespace
} // namespace torch_monitor
