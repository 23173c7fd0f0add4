// What thread safety costs on the DifferenceMonitor hook path: the
// uncontended lock every monitor and reducer call takes (against a plain
// std::mutex and against no lock), and one whole monitored step in C++
// (before() + after() feeding a PassthroughReducer) on a 64x64 tensor, the
// size of the Linear weight in the Python benchmark.

#include <benchmark/benchmark.h>

#include <memory>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <torch_monitor/detail/blocking_lock.h>
#include <torch_monitor/monitors/difference_monitor.h>
#include <torch_monitor/reducers/factory.h>

namespace {

void BM_NoLock(benchmark::State& state) {
  int counter = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(++counter);
  }
}
BENCHMARK(BM_NoLock);

void BM_StdMutexLockUnlock(benchmark::State& state) {
  std::mutex mutex;
  int counter = 0;
  for (auto _ : state) {
    std::lock_guard<std::mutex> guard(mutex);
    benchmark::DoNotOptimize(++counter);
  }
}
BENCHMARK(BM_StdMutexLockUnlock);

// The lock of monitors and reducers: fork generation check + try_lock of a
// recursive mutex.
void BM_BlockingLockUnlock(benchmark::State& state) {
  torch_monitor::detail::ForkSafeMutex mutex;
  int counter = 0;
  for (auto _ : state) {
    torch_monitor::detail::BlockingLock guard(mutex);
    benchmark::DoNotOptimize(++counter);
  }
}
BENCHMARK(BM_BlockingLockUnlock);

// One forward() worth of monitor work: capture, difference, reducer step.
void BM_DifferenceMonitorStep64x64(benchmark::State& state) {
  at::set_num_threads(1);
  auto reducer = torch_monitor::makeReducer("PassthroughReducer", 1.0, 8.0, false, false, {});
  torch_monitor::DifferenceMonitor monitor(reducer, "weight");
  const at::Tensor weight = at::randn({64, 64});
  for (auto _ : state) {
    monitor.before(weight, true);
    monitor.after(weight, true);
  }
}
BENCHMARK(BM_DifferenceMonitorStep64x64);

} // namespace

BENCHMARK_MAIN();
