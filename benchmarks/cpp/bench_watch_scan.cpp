// watch's host scan of one CPU tensor (watch::observeOnHost: every
// statistic of a gradient, or of an update with its ratio, in one pass)
// against the same statistics computed with ATen ops, as the hand-written
// hooks of benchmarks/python/bench_watch.py compute them, in one binary.
// 262,144 floats (4 x Linear(256, 256)'s weights), one thread, the tensors
// hot in cache. Names are "<impl>:<case>"; run_cpp.sh pairs them and prints
// ours/torch. Also, for scale, torch's norm and copy of the same tensor
// ("reference:" cases, in Google Benchmark's own table).

#include <benchmark/benchmark.h>

#include "bench_main.h"

#include <limits>

#include <ATen/Parallel.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/square.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/where.h>

#include <torch_monitor/watch/statistics.h>

namespace {

constexpr int64_t kElements = 4 * 256 * 256;

struct Tensors {
  at::Tensor grad = at::randn({kElements});
  at::Tensor weight = at::randn({kElements});
  at::Tensor before = at::sub(weight, at::randn({kElements}), 1e-3);
};

Tensors& tensors() {
  static Tensors t;
  return t;
}

void ours(benchmark::State& state, bool update) {
  at::set_num_threads(1);
  const Tensors& t = tensors();
  double row[torch_monitor::watch::column::kColumns];
  torch_monitor::watch::fillIdentity(row);
  for (auto _ : state) {
    if (update) {
      torch_monitor::watch::observeOnHost(row, t.weight, &t.before, 1);
    } else {
      torch_monitor::watch::observeOnHost(row, t.grad, nullptr, 1);
    }
    benchmark::DoNotOptimize(row);
  }
}

// The reference: the statistics of one observation with ATen ops in
// float64 (non-finite count, zeros, sum, sum of squares, min, max, |max|;
// for an update the difference first and the weight's norm).
void aten(benchmark::State& state, bool update) {
  at::set_num_threads(1);
  const Tensors& t = tensors();
  for (auto _ : state) {
    const at::Tensor x = update ? at::sub(t.weight, t.before) : t.grad;
    const at::Tensor finite = at::isfinite(x);
    const at::Tensor kept = at::where(finite, x, 0.0);
    const double inf = std::numeric_limits<double>::infinity();
    at::Tensor all = at::stack(
        {at::logical_not(finite).sum(at::kDouble),
         at::eq(x, 0).sum(at::kDouble),
         kept.sum(at::kDouble),
         at::square(kept).sum(at::kDouble),
         at::where(finite, at::neg(x), -inf).amax().to(at::kDouble),
         at::where(finite, x, -inf).amax().to(at::kDouble),
         at::abs(kept).amax().to(at::kDouble)});
    if (update) {
      all = at::cat({all, at::linalg_vector_norm(t.before, 2, {}, false, at::kDouble).reshape({1})});
    }
    benchmark::DoNotOptimize(all);
  }
}

void norm(benchmark::State& state) {
  at::set_num_threads(1);
  for (auto _ : state) {
    benchmark::DoNotOptimize(at::linalg_vector_norm(tensors().grad));
  }
}

void copy(benchmark::State& state) {
  at::set_num_threads(1);
  at::Tensor into = at::empty_like(tensors().weight);
  for (auto _ : state) {
    into.copy_(tensors().weight);
    benchmark::DoNotOptimize(into);
  }
}

BENCHMARK_CAPTURE(ours, "watch scan of a gradient (262,144 floats)", false)
    ->Name("ours:watch scan of a gradient (262,144 floats)")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(aten, "", false)
    ->Name("torch:watch scan of a gradient (262,144 floats)")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(ours, "", true)
    ->Name("ours:watch scan of an update (262,144 floats)")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(aten, "", true)
    ->Name("torch:watch scan of an update (262,144 floats)")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(norm)
    ->Name("reference:linalg_vector_norm (262,144 floats)")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(copy)
    ->Name("reference:copy_ (262,144 floats)")
    ->Unit(benchmark::kMicrosecond);

} // namespace

int main(int argc, char** argv) {
  return torch_monitor::bench::runRegisteredBenchmarks(argc, argv);
}
