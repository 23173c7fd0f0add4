// Stat::add: torch_monitor against torch::monitor (PyTorch's own), in one binary
// so that every ratio comes from the same run. Names are "<impl>:<case>"; the
// case part pairs the two implementations (run_cpp.sh prints ours/torch).
//
// Every stat uses the typical 60 s window, so a window closes at most once a
// minute (and logs to no handler: none is registered by this binary).
// Samples come from a precomputed pseudo-random table, so the compiler cannot
// fold them and MIN/MAX branches see realistic data.

#include <benchmark/benchmark.h>

#include "bench_main.h"

#include <chrono>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/csrc/monitor/counters.h>
#include <torch_monitor/stat.h>

namespace {

constexpr std::chrono::milliseconds kWindow{60000};
constexpr size_t kNumValues = 4096; // power of two
// Finite but never reached in a run: every add is counted, on the mutex path.
constexpr int64_t kCappedMaxSamples = int64_t(1) << 50;

template <typename T>
const std::vector<T>& sampleValues() {
  static const std::vector<T> values = [] {
    std::mt19937_64 rng(12345);
    std::vector<T> out(kNumValues);
    if constexpr (std::is_floating_point_v<T>) {
      std::normal_distribution<double> loss(2.5, 0.7);
      for (auto& v : out) v = loss(rng);
    } else {
      std::uniform_int_distribution<int64_t> bytes(0, 1 << 20);
      for (auto& v : out) v = bytes(rng);
    }
    return out;
  }();
  return values;
}

struct Torch {
  template <typename T>
  using StatT = torch::monitor::Stat<T>;
  using Agg = torch::monitor::Aggregation;
  static constexpr const char* kName = "torch";
};

struct Ours {
  template <typename T>
  using StatT = torch_monitor::Stat<T>;
  using Agg = torch_monitor::Aggregation;
  static constexpr const char* kName = "ours";
};

// 1 aggregation: MEAN; 6: all of them (VALUE..MIN share the same integers in
// both enums).
template <typename Impl>
std::vector<typename Impl::Agg> aggregations(int n) {
  using Agg = typename Impl::Agg;
  if (n == 1) {
    return {Agg::MEAN};
  }
  return {Agg::VALUE, Agg::MEAN, Agg::COUNT, Agg::SUM, Agg::MAX, Agg::MIN};
}

template <typename T, typename StatT>
void addLoop(benchmark::State& state, StatT& stat) {
  const std::vector<T>& values = sampleValues<T>();
  const T* data = values.data();
  size_t i = size_t(state.thread_index()) * 977;
  for (auto _ : state) {
    T v = data[i++ & (kNumValues - 1)];
    benchmark::DoNotOptimize(v);
    stat.add(v);
  }
  state.SetItemsProcessed(state.iterations());
}

// One thread, a stat of its own, built outside the timed loop.
template <typename Impl, typename T, int NumAggs, bool Capped>
void BM_AddOwn(benchmark::State& state) {
  typename Impl::template StatT<T> stat(
      "bench.stat",
      aggregations<Impl>(NumAggs),
      kWindow,
      Capped ? kCappedMaxSamples : std::numeric_limits<int64_t>::max());
  addLoop<T>(state, stat);
}

// Every benchmark thread adds to one shared stat (created once, kept for the
// whole process so that all threads see it from their first iteration).
template <typename Impl, typename T, int NumAggs, bool Capped>
void BM_AddShared(benchmark::State& state) {
  static auto* stat = new typename Impl::template StatT<T>(
      "bench.shared",
      aggregations<Impl>(NumAggs),
      kWindow,
      Capped ? kCappedMaxSamples : std::numeric_limits<int64_t>::max());
  addLoop<T>(state, *stat);
}

template <typename T>
const char* typeName() {
  return std::is_floating_point_v<T> ? "double" : "int64_t";
}

template <typename T, int NumAggs, bool Capped>
std::string caseName(int threads) {
  std::string name = std::string("Stat<") + typeName<T>() + ">::add " +
      std::to_string(NumAggs) + (NumAggs == 1 ? " agg" : " aggs") + ", " +
      std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  if (Capped) {
    name += ", max_samples=2^50";
  }
  return name;
}

template <typename T, int NumAggs, bool Capped>
void registerPair1Thread() {
  benchmark::RegisterBenchmark(
      (std::string(Torch::kName) + ":" + caseName<T, NumAggs, Capped>(1))
          .c_str(),
      BM_AddOwn<Torch, T, NumAggs, Capped>);
  benchmark::RegisterBenchmark(
      (std::string(Ours::kName) + ":" + caseName<T, NumAggs, Capped>(1))
          .c_str(),
      BM_AddOwn<Ours, T, NumAggs, Capped>);
}

// Google Benchmark with Threads(2) and UseRealTime reports wall time divided
// by the ops of all threads: the per-op cost of the shared stat as a whole.
template <typename T, int NumAggs, bool Capped>
void registerPair2Threads() {
  benchmark::RegisterBenchmark(
      (std::string(Torch::kName) + ":" + caseName<T, NumAggs, Capped>(2))
          .c_str(),
      BM_AddShared<Torch, T, NumAggs, Capped>)
      ->Threads(2)
      ->UseRealTime();
  benchmark::RegisterBenchmark(
      (std::string(Ours::kName) + ":" + caseName<T, NumAggs, Capped>(2))
          .c_str(),
      BM_AddShared<Ours, T, NumAggs, Capped>)
      ->Threads(2)
      ->UseRealTime();
}

} // namespace

int main(int argc, char** argv) {
  registerPair1Thread<double, 1, false>();
  registerPair1Thread<double, 6, false>();
  registerPair1Thread<int64_t, 1, false>();
  registerPair1Thread<int64_t, 6, false>();
  registerPair1Thread<double, 6, true>();
  registerPair2Threads<double, 1, false>();
  registerPair2Threads<double, 6, false>();
  registerPair2Threads<int64_t, 6, false>();
  registerPair2Threads<double, 6, true>();

  return torch_monitor::bench::runRegisteredBenchmarks(argc, argv);
}
