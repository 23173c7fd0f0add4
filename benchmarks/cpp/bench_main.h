#pragma once

// The end of main() for the benchmarks that compare with PyTorch's
// torch::monitor, shared so that every binary measures under the same
// threading conditions.

#include <thread>

#include <benchmark/benchmark.h>

namespace torch_monitor::bench {

// Runs the benchmarks registered so far with the command line's options;
// returns main()'s exit status.
inline int runRegisteredBenchmarks(int argc, char** argv) {
  // A PyTorch program always has more than one thread. Once a thread has
  // existed, glibc's __libc_single_threaded stays false and libstdc++ uses
  // atomic (lock-prefixed) shared_ptr reference counts; without this, the
  // result would depend on whether a threaded case happened to run first.
  std::thread([] {}).join();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

} // namespace torch_monitor::bench
