// Stats synced across ranks (rank_sync.h): forked processes, one per rank,
// each with its own c10d FileStore client on one file, as a C++ training
// program would create them. Where gloo's headers are installed (the torch
// wheel ships none; Debian's libgloo-dev has them, the symbols are in
// libtorch_cpu), each rank also trains through a ProcessGroupGloo made on
// that Store: an all-reduce per step beside the synced Stat, as in DDP.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#ifdef TORCH_MONITOR_TEST_GLOO
#include <ATen/ops/full.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <torch_monitor/rank_sync.h>
#include <torch_monitor/stat.h>
#include <torch_monitor/step.h>

#include "counting_store.h"
#include "test_support.h"

namespace torch_monitor::test {
namespace {

constexpr int64_t kWindowSteps = 2;
constexpr int64_t kSteps = 6;

// Rank r adds r + 1 samples per step: exact binary fractions.
std::vector<double> samplesOf(int64_t rank, int64_t step) {
  std::vector<double> out;
  for (int64_t i = 0; i <= rank; ++i) {
    out.push_back(rank * 10 + step * 0.25 + i * 0.5);
  }
  return out;
}

// What one process fed the window's samples of `ranks` would log.
detail::Accumulator<double> expectedWindow(
    int64_t window,
    const std::vector<int64_t>& ranks) {
  detail::Accumulator<double> all;
  // From the highest rank, so VALUE is the lowest rank's last sample.
  for (auto r = ranks.rbegin(); r != ranks.rend(); ++r) {
    for (int64_t step = window * kWindowSteps;
         step < (window + 1) * kWindowSteps;
         ++step) {
      for (double v : samplesOf(*r, step)) {
        all.add(v, 0);
      }
    }
  }
  return all;
}

// The body of one rank; its exit status is the number of failed checks.
int runRank(
    const std::string& storePath,
    int64_t rank,
    int64_t worldSize,
    int64_t ranksAlive,
    bool trainWithGloo) {
  alarm(60); // never outlive a hung test
  if (rank >= ranksAlive) {
    _exit(0); // a rank that died before posting anything
  }
  int failures = 0;
  const auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "rank %ld: %s\n", long(rank), what.c_str());
      ++failures;
    }
  };
  auto group = std::make_shared<RankGroup>();
  group->store = c10::make_intrusive<c10d::FileStore>(storePath, worldSize);
  group->rank = rank;
  group->worldSize = worldSize;
  group->deadline = std::chrono::milliseconds(1000);
  setDefaultRankGroup(group);
  // One step of data-parallel training: the ranks' gradients all-reduced.
  std::function<void()> trainStep = [] {};
#ifdef TORCH_MONITOR_TEST_GLOO
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  if (trainWithGloo) {
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
        group->store, int(rank), int(worldSize), options);
    trainStep = [&] {
      std::vector<at::Tensor> grad{at::full({4}, double(rank + 1), at::kDouble)};
      pg->allreduce(grad)->wait();
      check(
          grad[0][0].item<double>() == double(worldSize * (worldSize + 1) / 2),
          "the all-reduced gradient");
    };
  }
#else
  (void)trainWithGloo;
#endif
  auto recorder = std::make_shared<RecordingHandler>();
  registerEventHandler(recorder);
  {
    Stat<double> loss("loss", kAllAggregations, WindowSteps{kWindowSteps});
    loss.syncRanks(nullptr); // the process default group
    for (int64_t step = 0; step < kSteps; ++step) {
      setStep(step);
      trainStep();
      for (double v : samplesOf(rank, step)) {
        loss.add(v);
      }
    }
    setStep(kSteps);
  } // destruction posts the last window
  flushRankSync();
  const auto events = recorder->statEvents();
  if (rank != 0) {
    check(events.empty(), "a rank other than 0 logged a merged event");
    return failures;
  }
  check(events.size() == kSteps / kWindowSteps, "one event per window");
  std::vector<int64_t> alive;
  for (int64_t r = 0; r < ranksAlive; ++r) {
    alive.push_back(r);
  }
  for (size_t w = 0; w < events.size(); ++w) {
    const Event& e = events[w];
    const auto want = expectedWindow(e.step.value_or(0) / kWindowSteps - 1, alive);
    // Keyed by the Stat: one TensorBoard tag per synced Stat.
    check(std::get<int64_t>(e.data.at("loss.ranks")) == ranksAlive, "loss.ranks");
    check(std::get<double>(e.data.at("loss.count")) == want.count, "count");
    check(std::get<double>(e.data.at("loss.sum")) == want.sum, "sum");
    check(std::get<double>(e.data.at("loss.mean")) == want.mean(), "mean");
    check(std::get<double>(e.data.at("loss.min")) == want.min, "min");
    check(std::get<double>(e.data.at("loss.max")) == want.max, "max");
    check(std::get<double>(e.data.at("loss.value")) == want.value, "value");
  }
  return failures;
}

void runRanks(int64_t worldSize, int64_t ranksAlive, bool trainWithGloo = false) {
  TempDir dir;
  const std::string storePath = dir / "store";
  std::vector<pid_t> pids;
  for (int64_t rank = 0; rank < worldSize; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      _exit(runRank(storePath, rank, worldSize, ranksAlive, trainWithGloo));
    }
    pids.push_back(pid);
  }
  for (size_t r = 0; r < pids.size(); ++r) {
    expectChildExitedCleanly(pids[r], "rank " + std::to_string(r));
  }
}

TEST(RankSync, ThreeRanksMergeEveryWindowOnRankZero) {
  runRanks(3, 3);
}

TEST(RankSync, RanksTrainingThroughProcessGroupGlooMergeOnRankZero) {
#ifdef TORCH_MONITOR_TEST_GLOO
  runRanks(2, 2, /*trainWithGloo=*/true);
#else
  GTEST_SKIP() << "gloo's headers are not installed (apt-get install libgloo-dev)";
#endif
}

TEST(RankSync, DeadRankGivesPartialMergesWithinTheDeadline) {
  const auto started = std::chrono::steady_clock::now();
  runRanks(3, 2);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
}

struct RankCalls {
  std::vector<double> perWindow; // each rank's Store calls per window
  int64_t mergedWithEveryRank = 0; // rank 0's merged events with all ranks
  int64_t keysLeft = 0;
};

// `world` ranks in this process, each with its own Store client and
// `stats` Stats of one-step windows, every Stat added to at each of
// `windows` steps.
RankCalls callsOfRanks(int64_t world, int stats, int64_t windows) {
  ScopedRecorder recorder;
  auto shared = c10::make_intrusive<c10d::HashStore>();
  std::vector<c10::intrusive_ptr<CountingStore>> stores;
  std::vector<std::unique_ptr<Stat<double>>> all;
  for (int64_t r = 0; r < world; ++r) {
    stores.push_back(c10::make_intrusive<CountingStore>(shared));
    auto group = std::make_shared<RankGroup>();
    group->store = stores.back();
    group->rank = r;
    group->worldSize = world;
    for (int i = 0; i < stats; ++i) {
      all.push_back(std::make_unique<Stat<double>>(
          "s" + std::to_string(i),
          std::vector<Aggregation>{Aggregation::SUM},
          WindowSteps{1}));
      all.back()->syncRanks(group);
    }
  }
  for (int64_t step = 0; step < windows; ++step) {
    setStep(step);
    for (auto& stat : all) {
      stat->add(1.0);
    }
    // A pause as a training step makes: the sync thread runs between steps.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  all.clear(); // the last windows
  flushRankSync();
  clearStep();
  RankCalls out;
  for (const auto& store : stores) {
    out.perWindow.push_back(double(store->calls()) / double(windows));
  }
  for (const Event& e : recorder->statEvents()) {
    for (const auto& [key, value] : e.data) {
      if (key.size() > 6 && key.substr(key.size() - 6) == ".ranks" &&
          std::get<int64_t>(value) == world) {
        ++out.mergedWithEveryRank;
      }
    }
  }
  out.keysLeft = shared->getNumKeys();
  return out;
}

// Issue 28: a rank's Store traffic per pass of its sync thread does not grow
// with the number of Stats: everything it closed goes in one bundle (one
// write, one read to learn that rank 0 settled it), and rank 0 claims the
// bundles it found with one call, reads them in bulk and settles each with
// one. Before, each
// rank made a write and a read per Stat and window, and rank 0 four calls
// per Stat, window and rank.
TEST(RankSync, StoreCallsPerRankDoNotGrowWithTheNumberOfStats) {
  constexpr int64_t kWorld = 4;
  constexpr int64_t kWindows = 20;
  const RankCalls few = callsOfRanks(kWorld, 10, kWindows);
  const RankCalls many = callsOfRanks(kWorld, 100, kWindows);
  for (const RankCalls* calls : {&few, &many}) {
    const int stats = calls == &few ? 10 : 100;
    SCOPED_TRACE("stats=" + std::to_string(stats));
    EXPECT_EQ(calls->mergedWithEveryRank, stats * kWindows);
    EXPECT_EQ(calls->keysLeft, 1); // the group's claims: one key, kept
    // Two per window (measured: 2.0 on an idle machine). On a loaded one a
    // step's burst sometimes goes in two bundles (the 0.5 ms quiet gap that
    // ends a burst passes while the closing thread waits for a core;
    // measured up to 2.4): one split in two windows is allowed.
    for (int64_t r = 1; r < kWorld; ++r) {
      EXPECT_LE(calls->perWindow[size_t(r)], 3.0) << "rank " << r;
    }
    // Rank 0: a delete (or a verdict) per other rank; a check, a claim of
    // every bundle found (one compareSet) and a multiGet, and its polls (a
    // check each, every 2 ms while a window waits; more of them on a
    // loaded machine, measured up to 9).
    EXPECT_LE(calls->perWindow[0], 1.0 * (kWorld - 1) + 9.0);
  }
  // Ten times the Stats: the same calls, give or take the splits above.
  for (int64_t r = 0; r < kWorld; ++r) {
    EXPECT_LE(many.perWindow[size_t(r)], 1.5 * few.perWindow[size_t(r)])
        << "rank " << r;
  }
}

// The rank sync keeps a channel per group's Store for the process, but
// holds the Store only while the channel has work: a process group
// destroyed must not keep its Store (and its connections) alive.
TEST(RankSync, AnIdleChannelLetsItsStoreGo) {
  auto store = c10::make_intrusive<CountingStore>(
      c10::make_intrusive<c10d::HashStore>());
  {
    auto group = std::make_shared<RankGroup>();
    group->store = store;
    group->rank = 1;
    group->worldSize = 2;
    group->deadline = std::chrono::milliseconds(10);
    Stat<double> stat("idle", {Aggregation::SUM}, WindowSteps{1});
    stat.syncRanks(group);
    setStep(0);
    stat.add(1.0);
  } // the window is posted; no rank 0 takes it: stopRankSync settles it
  stopRankSync();
  clearStep();
  EXPECT_GT(store->calls(), 0); // it was posted
  EXPECT_EQ(store.use_count(), 1);
}

TEST(RankSync, DefaultGroupRejectsBadRanks) {
  auto group = std::make_shared<RankGroup>();
  expectValueError([&] { setDefaultRankGroup(group); }, {"Store"});
}

} // namespace
} // namespace torch_monitor::test
