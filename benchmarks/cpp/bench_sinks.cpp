// The native TensorBoard writer against the targets of performance.md:
// >= 5 M scalars/s on one core, <= 200 ns per scalar on the calling thread.
//
//   TensorBoardWriter/handle/keys:N   handle() of a Stat event with N values,
//                                     on the calling thread, while the
//                                     background thread writes to disk;
//                                     ns_per_scalar is the calling thread's
//                                     CPU time per scalar (run it unpinned:
//                                     pinned, the flusher only gets the core
//                                     when the producer is preempted)
//   TensorBoardWriter/end_to_end      N scalars logged and then close() (the
//                                     last write and the join included): the
//                                     sustained rate, scalars_per_second; run
//                                     it pinned to one core (taskset -c 0) so
//                                     the flusher shares the producer's core
//   encode, crc32c                    the building blocks
//   JsonLinesWriter/handle            for comparison
//
// Files go to a fresh directory under $TMPDIR (removed afterwards).

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <benchmark/benchmark.h>

#include <torch_monitor/sinks/format/crc32c.h>
#include <torch_monitor/sinks/format/tensorboard.h>
#include <torch_monitor/sinks/sinks.h>

namespace {

namespace fs = std::filesystem;
using namespace torch_monitor;

class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "tm_bench_XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string path() const {
    return path_.string();
  }

 private:
  fs::path path_;
};

// What a Stat with N aggregations logs when its window closes.
Event statEvent(int keys) {
  static const char* kAggregations[] = {
      "mean", "count", "sum", "max", "min", "value", "p50", "p99"};
  Event e;
  e.name = kStatEventName;
  e.timestamp = std::chrono::system_clock::now();
  for (int i = 0; i < keys; ++i) {
    e.data["train.loss." + std::string(kAggregations[i % 8]) +
           (i >= 8 ? std::to_string(i) : "")] = 0.25 + i;
  }
  return e;
}

void handleOnCallingThread(benchmark::State& state) {
  const int keys = static_cast<int>(state.range(0));
  ScratchDir dir;
  // Room for everything a run logs: this measures the encoding path, not
  // the drop path (which a disk slower than the producer would reach).
  sinks::TensorBoardWriterOptions options;
  options.maxBufferBytes = size_t(2) << 30;
  auto writer = std::make_shared<sinks::TensorBoardWriter>(dir.path(), options);
  const Event event = statEvent(keys);
  for (auto _ : state) {
    writer->handle(event);
  }
  writer->close();
  const double scalars = static_cast<double>(state.iterations()) * keys;
  state.SetItemsProcessed(static_cast<int64_t>(scalars));
  state.counters["ns_per_scalar"] = benchmark::Counter(
      scalars, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["dropped"] = static_cast<double>(writer->dropped());
}
BENCHMARK(handleOnCallingThread)
    ->Name("TensorBoardWriter/handle")
    ->ArgName("keys")
    ->Arg(1)
    ->Arg(6);

void endToEnd(benchmark::State& state) {
  constexpr int kKeys = 6;
  constexpr int kEvents = 200000; // 1.2 M scalars per iteration
  const Event event = statEvent(kKeys);
  int64_t dropped = 0;
  for (auto _ : state) {
    ScratchDir dir;
    auto writer = std::make_shared<sinks::TensorBoardWriter>(dir.path());
    for (int i = 0; i < kEvents; ++i) {
      writer->handle(event);
    }
    writer->close(); // everything on disk, flusher joined
    dropped += writer->dropped();
    state.PauseTiming(); // removing the files is not the writer's cost
    writer.reset();
    state.ResumeTiming();
  }
  const double scalars =
      static_cast<double>(state.iterations()) * kEvents * kKeys;
  state.counters["scalars_per_second"] =
      benchmark::Counter(scalars, benchmark::Counter::kIsRate);
  state.counters["dropped"] = static_cast<double>(dropped);
}
BENCHMARK(endToEnd)
    ->Name("TensorBoardWriter/end_to_end")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void encode(benchmark::State& state) {
  const sinks::tensorboard::ScalarTag tag("train.loss.mean");
  std::string buffer;
  buffer.reserve(1 << 20);
  int64_t step = 0;
  for (auto _ : state) {
    if (buffer.size() > (1 << 20) - 128) {
      buffer.clear();
    }
    sinks::tensorboard::appendScalarRecord(buffer, 1.7e9, step++, tag, 0.25f);
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(encode)->Name("TensorBoard/encode_scalar_record");

void crc(benchmark::State& state) {
  const std::string data(static_cast<size_t>(state.range(0)), 'x');
  const bool hardware = state.range(1) != 0;
  if (hardware && !sinks::detail::hardwareCrc32cAvailable()) {
    state.SkipWithError("no SSE4.2 crc32 instruction");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        hardware ? sinks::detail::crc32cHardware(data.data(), data.size(), 0)
                 : sinks::detail::crc32cPortable(data.data(), data.size(), 0));
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(crc)
    ->Name("crc32c")
    ->ArgNames({"bytes", "hardware"})
    ->Args({48, 1})
    ->Args({48, 0})
    ->Args({4096, 1})
    ->Args({4096, 0});

void jsonLines(benchmark::State& state) {
  ScratchDir dir;
  auto writer =
      std::make_shared<sinks::JsonLinesWriter>(dir.path() + "/events.jsonl");
  const Event event = statEvent(6);
  for (auto _ : state) {
    writer->handle(event);
  }
  writer->close();
  state.SetItemsProcessed(state.iterations());
  state.counters["dropped"] = static_cast<double>(writer->dropped());
}
BENCHMARK(jsonLines)->Name("JsonLinesWriter/handle/keys:6");

} // namespace

BENCHMARK_MAIN();
