// Stats synced across ranks (rank_sync.h): forked processes, one per rank,
// each with its own c10d FileStore client on one file, as a C++ training
// program would create them. Where gloo's headers are installed (the torch
// wheel ships none; Debian's libgloo-dev has them, the symbols are in
// libtorch_cpu), each rank also trains through a ProcessGroupGloo made on
// that Store: an all-reduce per step beside the synced Stat, as in DDP.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#ifdef TORCH_MONITOR_TEST_GLOO
#include <ATen/ops/full.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <torch_monitor/rank_sync.h>

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

TEST(RankSync, DefaultGroupRejectsBadRanks) {
  auto group = std::make_shared<RankGroup>();
  expectValueError([&] { setDefaultRankGroup(group); }, {"Store"});
}

} // namespace
} // namespace torch_monitor::test
