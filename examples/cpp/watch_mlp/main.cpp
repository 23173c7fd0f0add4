// A C++ LibTorch training program watched by torch_monitor::Watch.
//
// Trains a two-layer MLP with SGD (momentum) on synthetic regression data.
// One Watch observes every parameter's gradient and weight update and both
// Linear layers' outputs, over windows of 20 training steps; a C++
// EventHandler prints a few of each window's "torch_monitor.Watch" numbers.
//
// Two things differ from Python, both because of C++ itself:
//  * C++ optimizers have no hooks: the program wraps its optimizer step in
//    watch.step(optimizer), which observes the gradients before the step and
//    the weights' change across it;
//  * forward() is not virtual: the submodules are called through
//    torch_monitor::nn::call, which runs the watch's forward hooks.
//
// For the last window the program also computes "fc1.weight.grad.norm" by
// hand (the mean of the steps' gradient norms) to cross-check the watch.
//
//   watch_mlp [steps]     (default 100)
//
// Prints readable lines, then one line "summary {json}" (for tests).

#include <torch/torch.h>

#include <torch_monitor/nn.h>
#include <torch_monitor/torch_monitor.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr int64_t kWindow = 20;

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t in, int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 1))) {}
  // Through nn::call: the watch's forward hooks see fc1's and fc2's outputs.
  torch::Tensor forward(const torch::Tensor& x) {
    return torch_monitor::nn::call(fc2, torch::relu(torch_monitor::nn::call(fc1, x)));
  }
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

double number(const torch_monitor::Event& e, const std::string& key) {
  const auto it = e.data.find(key);
  if (it == e.data.end()) {
    return std::nan("");
  }
  if (const auto* d = std::get_if<double>(&it->second)) {
    return *d;
  }
  if (const auto* i = std::get_if<int64_t>(&it->second)) {
    return double(*i);
  }
  return std::nan("");
}

// Prints each closed window of the watch (on the thread that set the step
// that closed it).
class WatchPrinter : public torch_monitor::EventHandler {
 public:
  void handle(const torch_monitor::Event& e) override {
    if (e.name != torch_monitor::watch::kEventName) {
      return;
    }
    events.push_back(e);
    std::printf(
        "[watch] step %4lld: fc1.weight.grad norm %.5f rms %.6f | "
        "fc1.weight.update ratio %.6f | fc1.output abs_max %.4f zero_frac %.3f\n",
        static_cast<long long>(e.step.value_or(-1)),
        number(e, "fc1.weight.grad.norm"),
        number(e, "fc1.weight.grad.rms"),
        number(e, "fc1.weight.update.ratio"),
        number(e, "fc1.output.abs_max"),
        number(e, "fc1.output.zero_frac"));
  }
  std::vector<torch_monitor::Event> events;
};

} // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 100;
  if (steps < 1) {
    std::fprintf(stderr, "usage: watch_mlp [steps >= 1]\n");
    return 2;
  }
  const auto started = std::chrono::steady_clock::now();
  torch::manual_seed(0);
  at::set_num_threads(1); // tiny matrices: threads would only add overhead
  const int64_t n = 1024, features = 8, batch = 64;
  const torch::Tensor x = torch::randn({n, features});
  const torch::Tensor y = x.mm(torch::randn({features, 1})) + 0.05 * torch::randn({n, 1});

  Net net(features, 32);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  // ---- monitoring: these lines are all it takes ----------------------------
  auto printer = std::make_shared<WatchPrinter>();
  torch_monitor::registerEventHandler(printer);
  torch_monitor::WatchOptions options;
  options.what = {"grad", "update", "output"};
  options.windowSteps = kWindow;
  torch_monitor::Watch watch(net, options);
  // -----------------------------------------------------------------------------

  double handNormSum = 0.0;
  int64_t handSteps = 0;
  double firstLoss = 0.0, lastLoss = 0.0;
  for (int64_t step = 0; step < steps; ++step) {
    torch_monitor::setStep(step); // closes a window every kWindow steps
    const int64_t start = (step * batch) % n;
    optimizer.zero_grad();
    const torch::Tensor loss =
        torch::mse_loss(net->forward(x.slice(0, start, start + batch)), y.slice(0, start, start + batch));
    loss.backward();
    if (step / kWindow == (steps - 1) / kWindow) { // the last window, by hand
      handNormSum += net->fc1->weight.grad().norm().item<double>();
      ++handSteps;
    }
    watch.step(optimizer); // optimizer.step(), observed
    const double value = loss.item<double>();
    firstLoss = step == 0 ? value : firstLoss;
    lastLoss = value;
  }
  watch.remove(); // logs the last window
  torch_monitor::unregisterEventHandler(printer);

  const auto& last = printer->events.back();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf(
      "%zu keys watched (%s, ...), %zu windows of %lld steps\n",
      watch.keys().size(), watch.keys().front().c_str(), printer->events.size(),
      static_cast<long long>(kWindow));
  std::printf(
      "summary {\"steps\": %lld, \"windows\": %zu, \"keys\": %zu, \"statistics\": %zu, "
      "\"last_step\": %lld, \"grad_norm\": %.17g, \"grad_norm_by_hand\": %.17g, "
      "\"ratio\": %.17g, \"loss_first\": %.17g, \"loss_last\": %.17g, \"seconds\": %.3f}\n",
      static_cast<long long>(steps), printer->events.size(), watch.keys().size(),
      last.data.size(), static_cast<long long>(last.step.value_or(-1)),
      number(last, "fc1.weight.grad.norm"), handNormSum / double(handSteps),
      number(last, "fc1.weight.update.ratio"), firstLoss, lastLoss, seconds);
  return 0;
}
