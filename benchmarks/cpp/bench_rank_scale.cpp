// The cross-rank merge at scale, simulated in one process (issue 28): rank 0
// is the library's own rank sync with S Stats synced over a TCPStore it
// hosts; ranks 1..N-1 are threads, each with its own TCPStore client and
// rank, doing per window what a rank's sync thread does: post everything it
// closed as one bundle (the library's encodings), and at the next window
// read the previous bundle's key to learn that rank 0 settled it. A window
// closes every --period-ms (one step per window). Prints, per (N, S): rank
// 0's merge time per window (from the close to its last merged event),
// Store calls and bytes per window (rank 0's, and each other rank's), the
// lag to the last merged window, and whether every window merged with all
// N ranks.
//
// Usage: bench_rank_scale [--ranks 8,64,512,4096] [--stats 10,100]
//                         [--windows 5] [--period-ms 1000]
// (setup: about N / 600 s for the clients, on top of windows x period).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <torch_monitor/engine/accumulator.h>
#include <torch_monitor/event_handler.h>
#include <torch_monitor/rank_sync.h>
#include <torch_monitor/rank_sync/stat_share.h>
#include <torch_monitor/rank_sync/store_io.h>
#include <torch_monitor/stat.h>
#include <torch_monitor/step.h>

#include "counting_store.h"

namespace {

using Clock = std::chrono::steady_clock;
using torch_monitor::Aggregation;
namespace detail = torch_monitor::detail;

const std::vector<Aggregation> kAggregations{
    Aggregation::MEAN, Aggregation::COUNT, Aggregation::SUM};

std::vector<int> listOf(const char* text) {
  std::vector<int> out;
  for (const char* p = text; *p != '\0';) {
    out.push_back(std::atoi(p));
    p = std::strchr(p, ',');
    p = p == nullptr ? "" : p + 1;
  }
  return out;
}

// What a Stat of one-step windows with kAggregations is on every rank.
detail::WindowShape shapeOfStats() {
  detail::WindowShape shape;
  shape.steps = true;
  shape.length = 1;
  for (Aggregation a : kAggregations) {
    shape.aggregations |= uint8_t(1u << static_cast<int>(a));
  }
  return shape;
}

// Rank 0's handler: when each window's merged events came, and with how
// many ranks.
class Arrivals : public torch_monitor::EventHandler {
 public:
  void handle(const torch_monitor::Event& event) override {
    int64_t ranks = 0;
    for (const auto& [key, value] : event.data) {
      if (key.size() > 6 && key.compare(key.size() - 6, 6, ".ranks") == 0) {
        ranks = std::get<int64_t>(value);
      }
    }
    std::lock_guard<std::mutex> guard(mutex);
    Window& w = windows[event.step.value_or(0) - 1]; // closed at the step after it
    w.last = Clock::now();
    ++w.events;
    w.complete += ranks == worldSize ? 1 : 0;
  }
  struct Window {
    Clock::time_point last;
    int64_t events = 0;
    int64_t complete = 0;
  };
  std::mutex mutex;
  std::map<int64_t, Window> windows;
  int64_t worldSize = 0;
};

// The ranks' clock: generation g means "window g - 1 closed".
struct Signal {
  std::mutex mutex;
  std::condition_variable changed;
  int64_t generation = 0;

  void advance() {
    std::lock_guard<std::mutex> guard(mutex);
    ++generation;
    changed.notify_all();
  }
  void waitFor(int64_t g) {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return generation >= g; });
  }
};

// A rank other than 0: posts each window's bundle, settles the previous.
void simulatedRank(
    int64_t rank,
    int stats,
    int64_t windows,
    c10d::Store& store,
    Signal& signal,
    std::atomic<int64_t>& unsettled) {
  const detail::WindowShape shape = shapeOfStats();
  const std::string shapeText = shape.describe();
  std::string previous;
  for (int64_t window = 0; window <= windows; ++window) {
    signal.waitFor(window + 1);
    if (!previous.empty()) {
      const auto value = detail::peekKey(store, previous);
      if (value == detail::kAbsentKey) {
        // settled: every entry merged
      } else if (detail::decodeVerdicts(value)) {
        detail::deleteKey(store, previous);
        ++unsettled;
      } else {
        ++unsettled;
      }
    }
    detail::Accumulator<double> values;
    values.add(double(rank), 0);
    const auto share = detail::RankShare::of(values, window + 1, shape);
    std::vector<detail::BundleEntry> bundle;
    for (int i = 0; i < stats; ++i) {
      bundle.push_back(detail::BundleEntry{
          "s" + std::to_string(i),
          window + 1, // a step window's index: its end step over its length
          shapeText,
          detail::encodeShare(share)});
    }
    previous = detail::postKey(rank, window + 1);
    detail::writeKey(store, previous, detail::encodeBundle(bundle));
  }
}

struct Result {
  double mergeMedianMs = 0;
  double mergeMaxMs = 0;
  double lastLagMs = 0;
  double rootCalls = 0;
  double rootKiB = 0;
  double rankCalls = 0;
  double rankKiB = 0;
  int64_t complete = 0;
  int64_t expected = 0;
  int64_t unsettled = 0;
};

Result run(int worldSize, int stats, int64_t windows, int periodMs) {
  c10d::TCPStoreOptions serverOptions;
  serverOptions.port = 0;
  serverOptions.isServer = true;
  serverOptions.waitWorkers = false;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", serverOptions);
  c10d::TCPStoreOptions clientOptions;
  clientOptions.port = server->getPort();
  clientOptions.waitWorkers = false;

  auto rootStore = c10::make_intrusive<torch_monitor::test::CountingStore>(server);
  // A TCPStore client takes about 200 ms to connect, mostly waiting:
  // made 128 at a time.
  std::vector<c10::intrusive_ptr<torch_monitor::test::CountingStore>> stores(
      size_t(worldSize - 1));
  {
    std::atomic<size_t> nextClient{0};
    std::vector<std::thread> makers;
    for (int t = 0; t < 128; ++t) {
      makers.emplace_back([&] {
        for (size_t i = nextClient++; i < stores.size(); i = nextClient++) {
          stores[i] = c10::make_intrusive<torch_monitor::test::CountingStore>(
              c10::make_intrusive<c10d::TCPStore>("127.0.0.1", clientOptions));
        }
      });
    }
    for (auto& t : makers) {
      t.join();
    }
  }
  auto arrivals = std::make_shared<Arrivals>();
  arrivals->worldSize = worldSize;
  torch_monitor::registerEventHandler(arrivals);
  auto group = std::make_shared<torch_monitor::RankGroup>();
  group->store = rootStore;
  group->worldSize = worldSize;
  std::vector<std::unique_ptr<torch_monitor::Stat<double>>> rootStats;
  for (int i = 0; i < stats; ++i) {
    rootStats.push_back(std::make_unique<torch_monitor::Stat<double>>(
        "s" + std::to_string(i), kAggregations, torch_monitor::WindowSteps{1}));
    rootStats.back()->syncRanks(group);
  }

  Signal signal;
  std::atomic<int64_t> unsettled{0};
  std::vector<std::thread> ranks;
  for (int r = 1; r < worldSize; ++r) {
    ranks.emplace_back([&, r] {
      simulatedRank(r, stats, windows, *stores[size_t(r - 1)], signal, unsettled);
    });
  }
  // Window w is step w; it closes at the first add of step w + 1.
  std::vector<Clock::time_point> closedAt(static_cast<size_t>(windows));
  const auto start = Clock::now() + std::chrono::milliseconds(periodMs);
  int64_t callsBefore = 0;
  int64_t bytesBefore = 0;
  int64_t rankCallsBefore = 0;
  int64_t rankBytesBefore = 0;
  const auto rankTotals = [&](int64_t& calls, int64_t& bytes) {
    calls = bytes = 0;
    for (const auto& s : stores) {
      calls += s->calls();
      bytes += s->bytes();
    }
  };
  for (int64_t step = 0; step <= windows; ++step) {
    std::this_thread::sleep_until(start + step * std::chrono::milliseconds(periodMs));
    torch_monitor::setStep(step);
    if (step == 1) {
      callsBefore = rootStore->calls();
      bytesBefore = rootStore->bytes();
      rankTotals(rankCallsBefore, rankBytesBefore);
    }
    for (auto& stat : rootStats) {
      stat->add(1.0);
    }
    if (step > 0) {
      closedAt[size_t(step - 1)] = Clock::now();
        signal.advance(); // the other ranks post window step - 1
    }
  }
  // The last measured window has a period to merge before the next closes.
  std::this_thread::sleep_until(
      start + (windows + 1) * std::chrono::milliseconds(periodMs));
  Result result;
  {
    std::lock_guard<std::mutex> guard(arrivals->mutex);
    std::vector<double> merge;
    for (int64_t w = 0; w < windows; ++w) {
      const auto& got = arrivals->windows[w];
      result.complete += got.complete;
      if (got.events > 0) {
        merge.push_back(
            std::chrono::duration<double, std::milli>(got.last - closedAt[size_t(w)])
                .count());
      }
    }
    std::sort(merge.begin(), merge.end());
    if (!merge.empty()) {
      result.mergeMedianMs = merge[merge.size() / 2];
      result.mergeMaxMs = merge.back();
    }
    const auto& last = arrivals->windows[windows - 1];
    result.lastLagMs = last.events == stats
        ? std::chrono::duration<double, std::milli>(
              last.last - closedAt[size_t(windows - 1)])
              .count()
        : -1;
  }
  result.expected = int64_t(stats) * windows;
  const double perWindow = double(windows);
  result.rootCalls = double(rootStore->calls() - callsBefore) / perWindow;
  result.rootKiB = double(rootStore->bytes() - bytesBefore) / 1024 / perWindow;
  int64_t rankCalls = 0;
  int64_t rankBytes = 0;
  rankTotals(rankCalls, rankBytes);
  const double others = std::max(1, worldSize - 1);
  result.rankCalls = double(rankCalls - rankCallsBefore) / perWindow / others;
  result.rankKiB = double(rankBytes - rankBytesBefore) / 1024 / perWindow / others;

  signal.advance(); // the other ranks post the window left open, and stop
  for (auto& t : ranks) {
    t.join();
  }
  rootStats.clear(); // rank 0's open window, merged with theirs
  torch_monitor::flushRankSync();
  torch_monitor::unregisterEventHandler(arrivals);
  result.unsettled = unsettled.load();
  return result;
}

} // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks{8, 64, 512, 4096};
  std::vector<int> stats{10, 100};
  int64_t windows = 5;
  int periodMs = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ranks") {
      ranks = listOf(argv[i + 1]);
    } else if (flag == "--stats") {
      stats = listOf(argv[i + 1]);
    } else if (flag == "--windows") {
      windows = std::atoll(argv[i + 1]);
    } else if (flag == "--period-ms") {
      periodMs = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  // Two sockets per simulated rank (its client and the server's end).
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);

  std::printf(
      "| ranks | Stats | merge per window, median [max] | lag to the last "
      "window | rank 0: Store calls, KiB per window | each other rank: calls, "
      "KiB per window | windows merged with every rank |\n"
      "| --- | --- | --- | --- | --- | --- | --- |\n");
  for (int n : ranks) {
    for (int s : stats) {
      const Result r = run(n, s, windows, periodMs);
      std::printf(
          "| %d | %d | %.1f ms [%.1f] | %.1f ms | %.0f, %.0f | %.1f, %.1f | "
          "%lld of %lld%s |\n",
          n,
          s,
          r.mergeMedianMs,
          r.mergeMaxMs,
          r.lastLagMs,
          r.rootCalls,
          r.rootKiB,
          r.rankCalls,
          r.rankKiB,
          static_cast<long long>(r.complete),
          static_cast<long long>(r.expected),
          r.unsettled > 0 ? " (some bundles unsettled)" : "");
      std::fflush(stdout);
    }
  }
  return 0;
}
