// logEvent with 0 / 1 / 3 no-op C++ handlers: torch_monitor against
// torch::monitor (PyTorch's own), in one binary. Names are "<impl>:<case>";
// run_cpp.sh pairs them and prints ours/torch.
//
// Handlers are registered just before the timed loop and unregistered right
// after it, so no other benchmark ever runs with a handler registered.

#include <benchmark/benchmark.h>

#include "bench_main.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/monitor/events.h>
#include <torch_monitor/event_handler.h>

namespace {

struct Torch {
  using Event = torch::monitor::Event;
  using Handler = torch::monitor::EventHandler;
  static void log(const Event& e) {
    torch::monitor::logEvent(e);
  }
  static void add(std::shared_ptr<Handler> h) {
    torch::monitor::registerEventHandler(std::move(h));
  }
  static void remove(const std::shared_ptr<Handler>& h) {
    torch::monitor::unregisterEventHandler(h);
  }
  static constexpr const char* kName = "torch";
};

struct Ours {
  using Event = torch_monitor::Event;
  using Handler = torch_monitor::EventHandler;
  static void log(const Event& e) {
    torch_monitor::logEvent(e);
  }
  static void add(std::shared_ptr<Handler> h) {
    torch_monitor::registerEventHandler(std::move(h));
  }
  static void remove(const std::shared_ptr<Handler>& h) {
    torch_monitor::unregisterEventHandler(h);
  }
  static constexpr const char* kName = "ours";
};

template <typename Impl>
struct NoOpHandler final : Impl::Handler {
  void handle(const typename Impl::Event& e) override {
    benchmark::DoNotOptimize(&e);
  }
};

// Registers `n` no-op handlers for the lifetime of the object.
template <typename Impl>
class ScopedHandlers {
 public:
  explicit ScopedHandlers(int n) {
    for (int i = 0; i < n; ++i) {
      handlers_.push_back(std::make_shared<NoOpHandler<Impl>>());
      Impl::add(handlers_.back());
    }
  }
  ~ScopedHandlers() {
    for (const auto& h : handlers_) {
      Impl::remove(h);
    }
  }

 private:
  std::vector<std::shared_ptr<typename Impl::Handler>> handlers_;
};

template <typename Impl>
void BM_LogEvent(benchmark::State& state) {
  typename Impl::Event event;
  event.name = "bench.event";
  event.timestamp = std::chrono::system_clock::now();
  event.data["loss"] = 0.25;
  ScopedHandlers<Impl> handlers(int(state.range(0)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(&event);
    Impl::log(event);
  }
  state.SetItemsProcessed(state.iterations());
}

template <typename Impl>
void registerImpl() {
  benchmark::RegisterBenchmark(
      (std::string(Impl::kName) + ":logEvent").c_str(), BM_LogEvent<Impl>)
      ->ArgName("handlers")
      ->Arg(0)
      ->Arg(1)
      ->Arg(3);
}

} // namespace

int main(int argc, char** argv) {
  registerImpl<Torch>();
  registerImpl<Ours>();
  return torch_monitor::bench::runRegisteredBenchmarks(argc, argv);
}
