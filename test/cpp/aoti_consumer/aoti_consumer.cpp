// aoti_consumer PACKAGE.pt2 V...
//
// Registers a C++ event handler, loads an AOTInductor package with
// torch::inductor::AOTIModelPackageLoader, runs it once per V on a tensor
// filled with V (shape from the package's first input: 2 elements), closes
// every open Stat window and prints each event the handler got, one line:
//   event NAME KEY=VALUE ...
// Exit status 0 when at least one "torch.monitor.Stat" event arrived.

#include <torch_monitor/torch_monitor.h>

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <variant>
#include <vector>

namespace {

// Keeps every event it is given.
// Thread safety: handle() and events() may be called from any thread.
class Recorder : public torch_monitor::EventHandler {
 public:
  void handle(const torch_monitor::Event& event) override {
    std::lock_guard<std::mutex> guard(mutex_);
    events_.push_back(event);
  }
  std::vector<torch_monitor::Event> events() {
    std::lock_guard<std::mutex> guard(mutex_);
    return events_;
  }

 private:
  std::mutex mutex_;
  std::vector<torch_monitor::Event> events_;
};

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: aoti_consumer PACKAGE.pt2 V..." << std::endl;
    return 2;
  }
  auto recorder = std::make_shared<Recorder>();
  torch_monitor::registerEventHandler(recorder);
  {
    torch::inductor::AOTIModelPackageLoader loader(argv[1]);
    for (int i = 2; i < argc; ++i) {
      const auto outputs =
          loader.run({torch::full({2}, std::stod(argv[i]))});
      std::cout << "output " << outputs.at(0)[0].item<double>() << std::endl;
    }
  }
  torch_monitor::closeAllStats();
  bool statSeen = false;
  for (const auto& event : recorder->events()) {
    statSeen = statSeen || event.name == "torch.monitor.Stat";
    std::cout << "event " << event.name;
    for (const auto& [key, value] : event.data) {
      std::cout << ' ' << key << '=';
      std::visit([](const auto& v) { std::cout << v; }, value);
    }
    std::cout << std::endl;
  }
  torch_monitor::unregisterEventHandler(recorder);
  return statSeen ? 0 : 1;
}
