// Warnings raised on the library's own threads go to the sink a program sets
// with setBackgroundWarningSink, not to c10's default handler; nullptr
// restores the default. The window timer's thread is the example: a handler
// that throws there is reported with TORCH_WARN.

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <torch_monitor/background_warnings.h>
#include <torch_monitor/torch_monitor.h>

#include "test_support.h"

namespace torch_monitor {
namespace {

using namespace std::chrono_literals;

std::mutex caughtMutex;
std::vector<std::string> caught;
std::atomic<bool> caughtOnOtherThread{false};
std::thread::id testThread;

void recordWarning(const c10::Warning& warning) {
  std::lock_guard<std::mutex> guard(caughtMutex);
  caught.push_back(warning.msg());
  caughtOnOtherThread = std::this_thread::get_id() != testThread;
}

TEST(BackgroundWarnings, TheWindowTimersWarningsReachTheSetSink) {
  testThread = std::this_thread::get_id();
  setBackgroundWarningSink(&recordWarning);
  test::ScopedHandler handler(std::make_shared<test::FunctionHandler>(
      [](const Event& e) {
        if (e.name == kStatEventName) {
          throw std::runtime_error("handler broke");
        }
      }));
  Stat<double> stat(
      "timed", {Aggregation::SUM}, 20ms, Stat<double>::kUnlimitedSamples,
      WindowClose::ON_TIME);
  stat.add(1.0);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  bool seen = false;
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    std::lock_guard<std::mutex> guard(caughtMutex);
    seen = !caught.empty();
  }
  setBackgroundWarningSink(nullptr);
  ASSERT_TRUE(seen) << "no warning reached the sink";
  std::lock_guard<std::mutex> guard(caughtMutex);
  EXPECT_NE(caught[0].find("handler broke"), std::string::npos) << caught[0];
  EXPECT_NE(caught[0].find("window timer"), std::string::npos) << caught[0];
  EXPECT_TRUE(caughtOnOtherThread.load());
}

TEST(BackgroundWarnings, WarningsCarryMessagesNotBacktraces) {
  // A c10::Error's what() ends with its C++ backtrace, dozens of frames
  // ("Exception raised from ..."): warnings about such errors used to
  // carry it whole.
  testThread = std::this_thread::get_id();
  {
    std::lock_guard<std::mutex> guard(caughtMutex);
    caught.clear();
  }
  setBackgroundWarningSink(&recordWarning);
  test::ScopedHandler handler(std::make_shared<test::FunctionHandler>(
      [](const Event& e) {
        if (e.name == kStatEventName) {
          TORCH_CHECK_VALUE(false, "handler refused the window");
        }
      }));
  Stat<double> stat(
      "timed.c10", {Aggregation::SUM}, 20ms, Stat<double>::kUnlimitedSamples,
      WindowClose::ON_TIME);
  stat.add(1.0);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  bool seen = false;
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    std::lock_guard<std::mutex> guard(caughtMutex);
    seen = !caught.empty();
  }
  setBackgroundWarningSink(nullptr);
  ASSERT_TRUE(seen) << "no warning reached the sink";
  std::lock_guard<std::mutex> guard(caughtMutex);
  EXPECT_NE(caught[0].find("handler refused the window"), std::string::npos)
      << caught[0];
  EXPECT_EQ(caught[0].find("Exception raised from"), std::string::npos)
      << caught[0];
  EXPECT_EQ(caught[0].find('\n'), std::string::npos) << caught[0];
}

} // namespace
} // namespace torch_monitor
