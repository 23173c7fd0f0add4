// Concurrency stress of Stat: many threads add while the fake clock moves
// across window boundaries (the adding threads advance it, see SharedClock)
// and a prober thread reads the stat. No sample may be lost or counted twice
// across window closes, with the lock-free sharded path (unlimited
// max_samples), the overflow shard (more threads than detail::kMaxThreadSlots)
// and the capped path.
//
// CTest runs this executable twice: as is (membarrier(2) handshake, when the
// kernel has it) and with TORCH_MONITOR_NO_MEMBARRIER=1 (fence fallback).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "test_support.h"

namespace torch_monitor {
namespace {

using namespace std::chrono_literals;
using test::Latch;
using test::valueOf;

constexpr auto SUM = Aggregation::SUM;
constexpr auto COUNT = Aggregation::COUNT;
constexpr auto MAX = Aggregation::MAX;
constexpr auto MIN = Aggregation::MIN;

// Moves the shared fake clock forward by 1 ms; called by the adding threads
// every kTickEvery samples, so the number of window boundaries crossed during
// a run depends on the work done, not on how the scheduler treats a ticker
// thread (an add takes a few ns: a timer-paced ticker barely ticks before the
// workers finish). The mutex keeps the clock monotonic.
class SharedClock {
 public:
  explicit SharedClock(test::FakeClock& clock) : clock_(clock) {}
  void tick() {
    std::lock_guard<std::mutex> guard(mutex_);
    clock_.advance(1);
    ++ticks_;
  }
  int64_t ticks() const {
    return ticks_.load();
  }

 private:
  test::FakeClock& clock_;
  std::mutex mutex_;
  std::atomic<int64_t> ticks_{0};
};

constexpr int64_t kTickEvery = 1024;

// Starts `count` threads that wait on `start` (which may count others too),
// then each call add(t, i) for i < samples, ticking `shared` after every
// `tickEvery` calls. `add` is copied into every thread; join the threads
// returned.
template <typename Add>
std::vector<std::thread> startAdders(
    Latch& start,
    SharedClock& shared,
    int count,
    int64_t samples,
    int64_t tickEvery,
    Add add) {
  std::vector<std::thread> threads;
  for (int t = 0; t < count; ++t) {
    threads.emplace_back([&start, &shared, add, t, samples, tickEvery] {
      start.arriveAndWait();
      for (int64_t i = 0; i < samples; ++i) {
        if (i % tickEvery == tickEvery - 1) {
          shared.tick();
        }
        add(t, i);
      }
    });
  }
  return threads;
}

// Reads the stat (count() harvests every shard without resetting it; get())
// from its own thread until stopped, to race those reads against adds and
// window closes. `check` receives each count().
template <typename T>
class Prober {
 public:
  Prober(const Stat<T>& stat, std::function<void(int64_t)> check)
      : thread_([this, &stat, check = std::move(check)] {
          while (!stop_.load(std::memory_order_relaxed)) {
            const int64_t c = stat.count();
            if (check) {
              check(c);
            }
            stat.get();
            ++probes_;
            std::this_thread::sleep_for(20us);
          }
        }) {}
  ~Prober() {
    stop();
  }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) {
      thread_.join();
    }
  }
  int64_t probes() const {
    return probes_.load();
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> probes_{0};
  std::thread thread_;
};

struct Tally {
  int64_t events = 0;
  int64_t count = 0;
  int64_t sum = 0;
  int64_t max = std::numeric_limits<int64_t>::min();
  int64_t min = std::numeric_limits<int64_t>::max();
  int64_t largestWindow = 0;
};

Tally tally(
    const std::vector<Event>& events,
    const std::string& name,
    bool withMaxMin) {
  Tally t;
  for (const Event& e : events) {
    if (e.data.count(name + ".count") == 0) {
      continue; // another stat's event
    }
    ++t.events;
    const int64_t c = valueOf<int64_t>(e, name + ".count");
    EXPECT_GE(c, 1) << "an event for an empty window";
    t.count += c;
    t.sum += valueOf<int64_t>(e, name + ".sum");
    t.largestWindow = std::max(t.largestWindow, c);
    if (withMaxMin) {
      const int64_t mx = valueOf<int64_t>(e, name + ".max");
      const int64_t mn = valueOf<int64_t>(e, name + ".min");
      EXPECT_LE(mn, mx);
      t.max = std::max(t.max, mx);
      t.min = std::min(t.min, mn);
    }
  }
  return t;
}

constexpr int64_t kClockStart = 1000;

class StatConcurrency : public ::testing::Test {
 protected:
  test::FakeClock clock{kClockStart};
  test::ScopedRecorder recorder;
};

// The protocol variant in use is the one the environment asks for.
TEST_F(StatConcurrency, HandshakeVariantMatchesEnvironment) {
  Stat<int64_t> s("probe", {SUM}, 10ms); // registers membarrier once
  const bool disabled = std::getenv("TORCH_MONITOR_NO_MEMBARRIER") != nullptr;
  const long supported = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  const bool kernelHasIt =
      supported > 0 && (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0;
  std::cout << "[          ] membarrier: kernel "
            << (kernelHasIt ? "has it" : "lacks it")
            << (disabled ? ", disabled by TORCH_MONITOR_NO_MEMBARRIER" : "")
            << std::endl;
  EXPECT_EQ(
      detail::heavyBarrierAvailable.load(), kernelHasIt && !disabled);
}

// N threads x K samples into one Stat<int64_t> while windows keep closing,
// at three densities of window boundaries (every 2048, 256 and 32 samples of
// all threads together, on average).
class ShardedStress : public StatConcurrency,
                      public ::testing::WithParamInterface<int64_t> {};

TEST_P(ShardedStress, NoSampleLostOrCountedTwice) {
  constexpr int kThreads = 8; // more than the cores
  constexpr int64_t kSamples = 200000;
  const int64_t tickEvery = GetParam();
  const std::string name = "sharded";
  auto sample = [](int t, int64_t i) {
    return (i * 7919 + t * 104729) % 100003 - 50000;
  };
  std::optional<Stat<int64_t>> s;
  s.emplace(name, std::vector<Aggregation>{SUM, COUNT, MAX, MIN}, 2ms);
  SharedClock shared(clock);

  Latch start(kThreads + 1);
  std::vector<std::thread> threads = startAdders(
      start, shared, kThreads, kSamples, tickEvery, [&](int t, int64_t i) {
        s->add(sample(t, i));
      });
  int64_t expectedSum = 0, expectedMax = std::numeric_limits<int64_t>::min(),
          expectedMin = std::numeric_limits<int64_t>::max();
  for (int t = 0; t < kThreads; ++t) {
    for (int64_t i = 0; i < kSamples; ++i) {
      const int64_t v = sample(t, i);
      expectedSum += v;
      expectedMax = std::max(expectedMax, v);
      expectedMin = std::min(expectedMin, v);
    }
  }
  {
    Prober<int64_t> prober(*s, [&](int64_t c) {
      EXPECT_GE(c, 0);
      EXPECT_LE(c, kThreads * kSamples);
    });
    start.arriveAndWait();
    for (auto& th : threads) {
      th.join();
    }
    prober.stop();
    std::cout << "[          ] " << shared.ticks() << " ticks, "
              << prober.probes() << " probes" << std::endl;
  }

  const Tally beforeDestruction = tally(recorder->statEvents(), name, true);
  // kThreads * kSamples / tickEvery ticks of 1 ms over 2 ms windows.
  const int64_t windows = kThreads * (kSamples / tickEvery) / 2;
  EXPECT_GE(beforeDestruction.events, windows / 3)
      << "too few window closes happened during the run to test anything";
  // Each window is closed at most once, and the open one not yet.
  EXPECT_LE(beforeDestruction.events, clock.now() / 2 - kClockStart / 2)
      << "a window was closed more than once";
  const int64_t open = s->count();
  s.reset();
  const Tally t = tally(recorder->statEvents(), name, true);
  EXPECT_EQ(t.events, beforeDestruction.events + (open > 0 ? 1 : 0));
  EXPECT_EQ(t.count - beforeDestruction.count, open)
      << "the destruction event holds exactly the open window";
  EXPECT_EQ(t.count, kThreads * kSamples);
  EXPECT_EQ(t.sum, expectedSum);
  EXPECT_EQ(t.max, expectedMax);
  EXPECT_EQ(t.min, expectedMin);
  std::cout << "[          ] " << t.events << " windows, largest "
            << t.largestWindow << " samples" << std::endl;
}

INSTANTIATE_TEST_SUITE_P(
    TickDensity,
    ShardedStress,
    ::testing::Values(int64_t(1024), int64_t(128), int64_t(16)));

// As many adding threads as cores, so that every harvest runs while the
// other owners are really running (with more threads than cores they are
// mostly preempted), and windows closing every few dozen samples.
TEST_F(StatConcurrency, ShardedOneThreadPerCore) {
  const int threadsCount = std::clamp(
      int(std::thread::hardware_concurrency()), 2, 8);
  const int64_t samples = 16000000 / threadsCount;
  const std::string name = "percore";
  std::optional<Stat<int64_t>> s;
  s.emplace(name, std::vector<Aggregation>{SUM, COUNT}, 1ms);
  SharedClock shared(clock);
  Latch start(threadsCount);
  std::vector<std::thread> threads = startAdders(
      start, shared, threadsCount, samples, 64, [&](int t, int64_t) {
        s->add(t + 1);
      });
  for (auto& th : threads) {
    th.join();
  }
  const Tally before = tally(recorder->statEvents(), name, false);
  EXPECT_GE(before.events, shared.ticks() / 3);
  EXPECT_LE(before.events, clock.now() - kClockStart)
      << "a window was closed more than once";
  s.reset();
  const Tally t = tally(recorder->statEvents(), name, false);
  EXPECT_EQ(t.count, threadsCount * samples);
  EXPECT_EQ(t.sum, samples * threadsCount * (threadsCount + 1) / 2);
  std::cout << "[          ] " << threadsCount << " threads, " << t.events
            << " windows" << std::endl;
}

// The double stat goes through the same sharded path.
TEST_F(StatConcurrency, ShardedDoubleStat) {
  constexpr int kThreads = 4;
  constexpr int64_t kSamples = 100000;
  std::optional<Stat<double>> s;
  s.emplace("dbl", std::vector<Aggregation>{SUM, COUNT}, 1ms);
  SharedClock shared(clock);
  Latch start(kThreads);
  std::vector<std::thread> threads = startAdders(
      start, shared, kThreads, kSamples, kTickEvery, [&](int t, int64_t) {
        s->add(double(t + 1)); // small integers: exact sums
      });
  for (auto& th : threads) {
    th.join();
  }
  const size_t closes = recorder->statEvents().size();
  EXPECT_GE(closes, 100u);
  EXPECT_LE(int64_t(closes), clock.now() - kClockStart)
      << "a window was closed more than once";
  s.reset();
  double count = 0, sum = 0;
  for (const Event& e : recorder->statEvents()) {
    count += valueOf<double>(e, "dbl.count");
    sum += valueOf<double>(e, "dbl.sum");
  }
  EXPECT_EQ(count, double(kThreads * kSamples));
  EXPECT_EQ(sum, double(kSamples) * (1 + 2 + 3 + 4));
}

// More live threads than detail::kMaxThreadSlots: the surplus shares the
// overflow shard; slots of exited threads are reused.
TEST_F(StatConcurrency, OverflowShardAndSlotReuse) {
  constexpr int kLongLived = 8;
  constexpr int kWave1 = 80; // with kLongLived: 88 > 64 live threads
  constexpr int kWave2 = 48; // fits in the slots wave 1 gave back
  constexpr int64_t kWaveSamples = 40000;
  static_assert(kLongLived + kWave1 > detail::kMaxThreadSlots);
  static_assert(kLongLived + kWave2 + 1 <= detail::kMaxThreadSlots);
  const std::string name = "slots";
  std::optional<Stat<int64_t>> s;
  s.emplace(name, std::vector<Aggregation>{SUM, COUNT}, 3ms);
  SharedClock shared(clock);

  std::atomic<int64_t> totalCount{0}, totalSum{0};
  std::atomic<bool> stopLong{false};
  std::vector<int> longSlots(kLongLived, -1);
  Latch longReady(kLongLived);
  std::vector<std::thread> longLived;
  for (int t = 0; t < kLongLived; ++t) {
    longLived.emplace_back([&, t] {
      int64_t n = 0, sum = 0;
      s->add(t);
      ++n;
      sum += t;
      longSlots[t] = detail::threadSlot();
      longReady.countDown();
      while (!stopLong.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 1000; ++i) {
          s->add(i);
          ++n;
          sum += i;
        }
        shared.tick();
        // Leave CPU to the waves (2 cores, 88 threads).
        std::this_thread::yield();
      }
      totalCount += n;
      totalSum += sum;
    });
  }
  longReady.wait();

  // A wave of threads that all hold a slot at the same time, then add more.
  auto runWave = [&](int size, int salt) {
    std::vector<int> slots(size, -1);
    Latch allHaveSlots(size);
    std::vector<std::thread> wave;
    for (int t = 0; t < size; ++t) {
      wave.emplace_back([&, t] {
        int64_t sum = 0;
        for (int64_t i = 0; i < kWaveSamples; ++i) {
          const int64_t v = (t * 31 + i + salt) % 1000;
          s->add(v);
          sum += v;
          if (i == 0) {
            slots[t] = detail::threadSlot();
            allHaveSlots.arriveAndWait();
          } else if (i % kTickEvery == 0) {
            shared.tick();
          }
        }
        totalCount += kWaveSamples;
        totalSum += sum;
      });
    }
    for (auto& th : wave) {
      th.join();
    }
    return slots;
  };

  std::vector<int> wave1, wave2;
  {
    Prober<int64_t> prober(*s, [](int64_t c) { EXPECT_GE(c, 0); });
    wave1 = runWave(kWave1, 1);
    wave2 = runWave(kWave2, 2);
    stopLong = true;
    for (auto& th : longLived) {
      th.join();
    }
  }

  // Wave 1: at least the surplus went to the overflow shard, and no two live
  // threads ever shared a slot of their own.
  const std::set<int> live(longSlots.begin(), longSlots.end());
  EXPECT_EQ(live.count(detail::kOverflowSlot), 0u)
      << "the long-lived threads started with free slots";
  EXPECT_EQ(live.size(), size_t(kLongLived)) << "slots shared";
  int overflow = 0;
  std::set<int> wave1Slots = live;
  for (int slot : wave1) {
    ASSERT_GE(slot, 0);
    ASSERT_LE(slot, detail::kOverflowSlot);
    if (slot == detail::kOverflowSlot) {
      ++overflow;
    } else {
      EXPECT_TRUE(wave1Slots.insert(slot).second)
          << "slot " << slot << " given to two live threads";
    }
  }
  EXPECT_GE(overflow, kLongLived + kWave1 - detail::kMaxThreadSlots);
  // Wave 2 (after wave 1 exited): every thread got a slot of its own again.
  std::set<int> wave2Slots = live;
  for (int slot : wave2) {
    EXPECT_NE(slot, detail::kOverflowSlot)
        << "slots of exited threads were not reused";
    EXPECT_TRUE(wave2Slots.insert(slot).second)
        << "slot " << slot << " given to two live threads";
  }

  const Tally during = tally(recorder->statEvents(), name, false);
  EXPECT_GE(during.events, 20);
  EXPECT_LE(during.events, clock.now() / 3 - kClockStart / 3)
      << "a window was closed more than once";
  std::cout << "[          ] " << shared.ticks() << " ticks, " << overflow
            << " overflow threads, " << during.events << " windows"
            << std::endl;
  s.reset();
  const Tally t = tally(recorder->statEvents(), name, false);
  EXPECT_EQ(t.count, totalCount.load());
  EXPECT_EQ(t.sum, totalSum.load());
}

// The first thread to add keeps its shard inside the stat; the next ones
// claim shards in a table created when the second one adds. Fresh stats, so
// that the claim, the table's creation and the first shard creations race
// with each other and with a window close (a thread that ticks the clock)
// and with count() (a harvest).
TEST_F(StatConcurrency, FirstAddsOfSeveralThreadsRaceExactly) {
  constexpr int kThreads = 3; // one claims the inner shard, two race on
  constexpr int kRounds = 500; // the table
  constexpr int64_t kSamples = 64;
  const std::string name = "fresh";
  int64_t expectedCount = 0, expectedSum = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::optional<Stat<int64_t>> s;
    s.emplace(name, std::vector<Aggregation>{SUM, COUNT}, 2ms);
    SharedClock shared(clock);
    // Spinning at the start line (for a while, then yielding: there may be
    // fewer cores), so that the threads really make their first adds at the
    // same time when cores allow.
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        ++ready;
        for (int spins = 0; ready.load() < kThreads; ++spins) {
          if (spins < 20000) {
            detail::cpuRelax();
          } else {
            std::this_thread::yield();
          }
        }
        for (int64_t i = 0; i < kSamples; ++i) {
          s->add(t + 1);
          if (t == round % kThreads && i == kSamples / 2) {
            shared.tick(); // a close while the others are still starting
          }
        }
      });
    }
    EXPECT_GE(s->count(), 0); // a harvest while shards appear
    for (auto& th : threads) {
      th.join();
    }
    s.reset();
    expectedCount += kThreads * kSamples;
    expectedSum += kSamples * kThreads * (kThreads + 1) / 2;
  }
  const Tally t = tally(recorder->statEvents(), name, false);
  EXPECT_EQ(t.count, expectedCount);
  EXPECT_EQ(t.sum, expectedSum);
}

// Pairs of threads that add one pair after the other (so a later thread may
// reuse the slot of an exited one, and with it the shard inside the stat)
// lose nothing.
TEST_F(StatConcurrency, SuccessiveThreadsShareNothingAndLoseNothing) {
  constexpr int kThreads = 20;
  constexpr int64_t kSamples = 5000;
  const std::string name = "successive";
  std::optional<Stat<int64_t>> s;
  s.emplace(name, std::vector<Aggregation>{SUM, COUNT}, 2ms);
  SharedClock shared(clock);
  for (int t = 0; t < kThreads; ++t) {
    // Two at a time: one may inherit the first shard's slot, the other not.
    std::thread a([&] {
      for (int64_t i = 0; i < kSamples; ++i) {
        s->add(1);
      }
    });
    std::thread b([&] {
      for (int64_t i = 0; i < kSamples; ++i) {
        s->add(2);
        if (i % 1000 == 999) {
          shared.tick();
        }
      }
    });
    a.join();
    b.join();
  }
  s.reset();
  const Tally t = tally(recorder->statEvents(), name, false);
  EXPECT_EQ(t.count, 2 * kThreads * kSamples);
  EXPECT_EQ(t.sum, 3 * kThreads * kSamples);
}

// Finite max_samples (the mutex path) under contention with a moving clock:
// no window ever holds more than max_samples.
TEST_F(StatConcurrency, CappedNeverExceedsMaxSamples) {
  constexpr int kThreads = 8;
  constexpr int64_t kSamples = 50000;
  constexpr int64_t kMax = 300;
  const std::string name = "capped";
  std::optional<Stat<int64_t>> s;
  s.emplace(name, std::vector<Aggregation>{SUM, COUNT}, 2ms, kMax);
  SharedClock shared(clock);
  Latch start(kThreads + 1);
  std::vector<std::thread> threads = startAdders(
      start, shared, kThreads, kSamples, 256, [&](int, int64_t) {
        s->add(1);
      });
  {
    Prober<int64_t> prober(*s, [&](int64_t c) {
      EXPECT_GE(c, 0);
      EXPECT_LT(c, kMax) << "a window at max_samples is closed at once";
    });
    start.arriveAndWait();
    for (auto& th : threads) {
      th.join();
    }
  }
  s.reset();
  const auto events = recorder->statEvents();
  const Tally t = tally(events, name, false);
  for (const Event& e : events) {
    EXPECT_LE(valueOf<int64_t>(e, name + ".count"), kMax);
    EXPECT_EQ(
        valueOf<int64_t>(e, name + ".sum"),
        valueOf<int64_t>(e, name + ".count"));
  }
  // 1562 ticks of 1 ms over 2 ms windows; 512 samples per thread per window
  // on average: most windows reach the cap.
  EXPECT_GE(t.events, 200);
  EXPECT_EQ(t.largestWindow, kMax);
  EXPECT_LE(t.count, kThreads * kSamples);
  EXPECT_EQ(t.sum, t.count);
  std::cout << "[          ] " << shared.ticks() << " ticks, " << t.events
            << " windows, " << t.count << " samples accepted" << std::endl;
}

// A finite max_samples that is never reached must behave like an unlimited
// one: nothing discarded, at most one event per window.
//
// Regression: the capped path once used a clock reading taken before its
// mutex, so a thread could present a stale window id and lose samples.
TEST_F(StatConcurrency, CappedWithUnreachedMaxLosesNothing) {
  constexpr int kThreads = 8;
  constexpr int64_t kSamples = 200000;
  const std::string name = "unreached";
  std::optional<Stat<int64_t>> s;
  s.emplace(
      name,
      std::vector<Aggregation>{SUM, COUNT},
      2ms,
      Stat<int64_t>::kUnlimitedSamples - 1);
  SharedClock shared(clock);
  Latch start(kThreads);
  std::vector<std::thread> threads = startAdders(
      start, shared, kThreads, kSamples, 16, [&](int, int64_t) {
        s->add(1);
      });
  for (auto& th : threads) {
    th.join();
  }
  s.reset();
  const Tally t = tally(recorder->statEvents(), name, false);
  const int64_t windows = shared.ticks() / 2 + 1;
  EXPECT_LE(t.events, windows + 1) << "a window was closed twice";
  EXPECT_EQ(t.count, kThreads * kSamples) << "samples were discarded";
}

// With the clock standing still, contention must still accept exactly
// max_samples per window: one event each, nothing more.
TEST_F(StatConcurrency, CappedFrozenClockAcceptsExactlyMaxSamples) {
  constexpr int kThreads = 8;
  constexpr int64_t kSamples = 20000;
  constexpr int64_t kMax = 1000;
  const std::string name = "frozen";
  std::optional<Stat<int64_t>> s;
  s.emplace(name, std::vector<Aggregation>{SUM, COUNT}, 100ms, kMax);

  auto flood = [&](int64_t value) {
    Latch start(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        start.arriveAndWait();
        for (int64_t i = 0; i < kSamples; ++i) {
          s->add(value);
        }
      });
    }
    for (auto& th : threads) {
      th.join();
    }
  };

  clock.set(1050);
  flood(1);
  auto events = recorder->statEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(valueOf<int64_t>(events[0], name + ".count"), kMax);
  EXPECT_EQ(valueOf<int64_t>(events[0], name + ".sum"), kMax);
  EXPECT_EQ(s->count(), 0);
  EXPECT_EQ(s->get().at(COUNT), kMax);

  clock.set(1150); // next window
  flood(2);
  events = recorder->statEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(valueOf<int64_t>(events[1], name + ".count"), kMax);
  EXPECT_EQ(valueOf<int64_t>(events[1], name + ".sum"), 2 * kMax);
  EXPECT_EQ(s->count(), 0);
  s.reset();
  EXPECT_EQ(recorder->statEvents().size(), 2u);
}

} // namespace
} // namespace torch_monitor
