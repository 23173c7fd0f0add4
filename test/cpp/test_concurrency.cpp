// Several threads meeting in the handler registry, the sinks and a capped
// Stat at once. Written for the ThreadSanitizer run of scripts/test.sh: TSan
// only sees races on code that really runs concurrently, and the other test
// files mostly drive one object from one thread. The checks here are light
// (nothing lost, nothing counted twice); the point is the interleavings.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <torch_monitor/detail/word_lock.h>
#include <torch_monitor/sinks/sinks.h>
#include <torch_monitor/torch_monitor.h>

#include "test_support.h"

namespace torch_monitor {
namespace {

using namespace std::chrono_literals;
using test::ScopedHandler;
using test::ScopedRecorder;

constexpr int kThreads = 4;

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr ? tmp : "/tmp") + "/tm_concurrency_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp failed for " + pattern);
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& name) const {
    return (path_ / name).string();
  }

 private:
  std::filesystem::path path_;
};

Event numbered(const std::string& name, int64_t n) {
  Event e;
  e.name = name;
  e.timestamp = std::chrono::system_clock::now();
  e.data["n"] = n;
  e.data["x"] = double(n) / 2;
  return e;
}

size_t linesIn(const std::string& path) {
  std::ifstream in(path);
  size_t lines = 0;
  for (std::string line; std::getline(in, line);) {
    ++lines;
  }
  return lines;
}

// Every sink kind registered at once; loggers on several threads while
// another thread reads, flushes and clears. Memory ring small enough to wrap.
// A Stat's lock (detail/word_lock.h): every increment of a plain counter
// under it survives four threads contending (lost ones would show a missing
// exclusion, a hang a lost wake-up; TSan sees a data race on `counter` if
// the lock orders nothing), and try_lock fails while another thread holds it.
TEST(Concurrency, WordLockExcludesAndWakesEveryWaiter) {
  detail::WordLock lock;
  int64_t counter = 0;
  constexpr int kThreads = 4;
  constexpr int kIncrements = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        std::lock_guard<detail::WordLock> guard(lock);
        ++counter;
        if (i % 1000 == 0) {
          std::this_thread::yield(); // holds it long enough for waiters
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(counter, int64_t{kThreads} * kIncrements);

  lock.lock();
  bool taken = true;
  std::thread([&] { taken = lock.try_lock(); }).join();
  EXPECT_FALSE(taken);
  lock.unlock();
  std::thread([&] {
    taken = lock.try_lock();
    if (taken) {
      lock.unlock();
    }
  }).join();
  EXPECT_TRUE(taken);
}

TEST(Concurrency, SinksShareLoggersWithReadersAndFlushes) {
  ScratchDir dir;
  constexpr int kEvents = 1500;
  constexpr int kConsoleEvery = 100; // keeps the test's stdout short
  auto memory = std::make_shared<sinks::MemoryHandler>(64);
  sinks::JsonLinesWriterOptions jsonOptions;
  jsonOptions.flushInterval = 1ms; // background flushes race with appends
  auto json = std::make_shared<sinks::JsonLinesWriter>(
      dir / "events.jsonl", jsonOptions);
  sinks::TensorBoardWriterOptions tbOptions;
  tbOptions.flushInterval = 1ms;
  auto tb = std::make_shared<sinks::TensorBoardWriter>(dir / "tb", tbOptions);
  auto console = std::make_shared<sinks::ConsoleHandler>(
      sinks::ConsoleStream::Stdout, std::vector<std::string>{"console"});
  memory->registerSelf();
  json->registerSelf();
  tb->registerSelf();
  console->registerSelf();

  std::atomic<int> running{kThreads};
  std::vector<std::thread> loggers;
  for (int t = 0; t < kThreads; ++t) {
    loggers.emplace_back([&, t] {
      for (int i = 0; i < kEvents; ++i) {
        const int64_t n = int64_t(t) * kEvents + i;
        logEvent(numbered(i % kConsoleEvery == 0 ? "console" : "logged", n));
      }
      --running;
    });
  }
  int64_t readerRounds = 0;
  while (running.load() > 0) {
    EXPECT_LE(memory->size(), memory->capacity());
    for (const Event& e : memory->events()) {
      EXPECT_EQ(e.data.size(), 2u);
    }
    json->flush();
    tb->flush();
    EXPECT_FALSE(tb->filePath().empty());
    if (++readerRounds % 50 == 0) {
      memory->clear();
    }
  }
  for (auto& t : loggers) {
    t.join();
  }
  for (const std::shared_ptr<sinks::Sink>& sink :
       std::vector<std::shared_ptr<sinks::Sink>>{memory, json, tb, console}) {
    sink->close();
    EXPECT_TRUE(sink->problems().empty()) << sink->description();
  }
  EXPECT_EQ(json->dropped(), 0);
  EXPECT_EQ(tb->dropped(), 0);
  EXPECT_EQ(linesIn(dir / "events.jsonl"), size_t(kThreads * kEvents));
}

// registerSelf(), which refuses a sink being closed with a ValueError.
void registerUnlessClosed(sinks::Sink& sink, const std::atomic<bool>& closing) {
  try {
    sink.registerSelf();
  } catch (const c10::ValueError&) {
    EXPECT_TRUE(closing.load()) << "registerSelf() refused an open sink";
  }
}

// registerSelf/unregisterSelf from several threads while others log, then a
// close() that lands in the middle of it all: the sink ends closed and
// ignores later events.
TEST(Concurrency, SelfRegistrationAndCloseRaceLogging) {
  ScratchDir dir;
  sinks::JsonLinesWriterOptions options;
  options.flushInterval = 1ms;
  auto json =
      std::make_shared<sinks::JsonLinesWriter>(dir / "events.jsonl", options);
  auto memory = std::make_shared<sinks::MemoryHandler>();
  std::atomic<bool> stop{false};
  std::atomic<bool> closing{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t i = 0; !stop.load(); ++i) {
        if (t % 2 == 0) {
          logEvent(numbered("logged", i));
        } else if (i % 2 == 0) {
          registerUnlessClosed(*json, closing);
          registerUnlessClosed(*memory, closing);
        } else {
          json->unregisterSelf();
          memory->unregisterSelf();
        }
      }
    });
  }
  std::this_thread::sleep_for(50ms);
  closing = true;
  json->close();
  memory->close();
  std::this_thread::sleep_for(20ms);
  stop = true;
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_TRUE(json->closed());
  // A registerSelf() racing with close() never leaves a closed sink
  // registered (it did, in about a quarter of such races, before close()
  // refused registration first).
  EXPECT_FALSE(json->registeredSelf());
  EXPECT_FALSE(memory->registeredSelf());
  const size_t kept = memory->size();
  json->handle(numbered("after close", 0));
  memory->handle(numbered("after close", 0));
  EXPECT_EQ(memory->size(), kept);
}

// A capped Stat (the mutex path of Stat::add) fed from several threads with
// 1 ms windows, so closes race with adds; its window events go through the
// registry to a handler that reads the same Stat back and to a sink. No
// sample is lost: the cap is never reached.
TEST(Concurrency, CappedStatWindowsReachHandlersThatReadIt) {
  constexpr int kAdds = 3000;
  ScopedRecorder recorder;
  auto memory = std::make_shared<sinks::MemoryHandler>(1 << 16);
  ScopedHandler memoryRegistration(memory);
  {
    Stat<int64_t> stat(
        "capped", {Aggregation::COUNT, Aggregation::SUM}, 1ms, int64_t(1) << 40);
    auto reader = std::make_shared<test::FunctionHandler>([&](const Event&) {
      EXPECT_GE(stat.count(), 0);
      EXPECT_GE(stat.get().at(Aggregation::COUNT), 0);
    });
    ScopedHandler readerRegistration(reader);
    std::vector<std::thread> adders;
    for (int t = 0; t < kThreads; ++t) {
      adders.emplace_back([&] {
        for (int i = 0; i < kAdds; ++i) {
          stat.add(1);
        }
      });
    }
    for (auto& t : adders) {
      t.join();
    }
    readerRegistration.release(); // the destructor's close must not call it
  } // closes the last window
  int64_t counted = 0;
  int64_t summed = 0;
  for (const Event& e : recorder->statEvents()) {
    counted += test::valueOf<int64_t>(e, "capped.count");
    summed += test::valueOf<int64_t>(e, "capped.sum");
  }
  EXPECT_EQ(counted, int64_t(kThreads) * kAdds);
  EXPECT_EQ(summed, int64_t(kThreads) * kAdds);
  EXPECT_EQ(memory->size(), recorder->statEvents().size());
}

} // namespace
} // namespace torch_monitor
