// c10 wait-counter backends, one start/stop each: torch_monitor's (with a
// capture running, and with none) against PyTorch's own control-plane
// backend (torch.distributed.debug's /wait_counters), in one binary. Each
// backend is made by its own factory from c10's registry, for a key of its
// own, and called as c10 calls it: start(now), then stop(now, ctx). c10 reads
// the clock once for start and once for stop whatever the backends, so the
// times passed are fixed (a 1 us unit) and the figures are the backends'
// own cost. Names are "<impl>:<case>"; run_cpp.sh pairs them and prints
// ours/torch.

#include <benchmark/benchmark.h>

#include "bench_main.h"

#include <chrono>
#include <memory>
#include <string>

#include <c10/util/WaitCounter.h>
#include <torch_monitor/pytorch_counters.h>

namespace {

using c10::monitor::detail::getRegisteredWaitCounterBackends;
using c10::monitor::detail::WaitCounterBackendIf;

// The control-plane factory is registered when libtorch loads, ours when
// libtorch_monitor does (after it): the first and the last.
std::unique_ptr<WaitCounterBackendIf> backendOf(bool ours, const char* key) {
  auto factories = getRegisteredWaitCounterBackends();
  if (factories.size() < 2) {
    return nullptr;
  }
  return (ours ? factories.back() : factories.front())->create(key);
}

void startStop(benchmark::State& state, WaitCounterBackendIf* backend) {
  if (backend == nullptr) {
    state.SkipWithError("fewer than two wait-counter backends are registered");
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto stop = start + std::chrono::microseconds(1);
  for (auto _ : state) {
    const auto ctx = backend->start(start);
    benchmark::DoNotOptimize(ctx);
    backend->stop(stop, ctx);
  }
}

void torchControlPlane(benchmark::State& state) {
  auto backend = backendOf(false, "bench.control_plane");
  startStop(state, backend.get());
}

void oursCapturing(benchmark::State& state) {
  auto backend = backendOf(true, "bench.ours");
  torch_monitor::PytorchCounterOptions options;
  options.windowSize = std::chrono::hours(1);
  auto capture = torch_monitor::capturePytorchCounters(options);
  startStop(state, backend.get());
}

void oursIdle(benchmark::State& state) {
  auto backend = backendOf(true, "bench.ours.idle");
  startStop(state, backend.get());
}

} // namespace

BENCHMARK(torchControlPlane)->Name("torch:WaitCounter backend start/stop");
BENCHMARK(oursCapturing)->Name("ours:WaitCounter backend start/stop");
BENCHMARK(oursIdle)->Name("ours:WaitCounter backend start/stop, no capture");

int main(int argc, char** argv) {
  return torch_monitor::bench::runRegisteredBenchmarks(argc, argv);
}
