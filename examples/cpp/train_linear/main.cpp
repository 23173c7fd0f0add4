// A pure C++ LibTorch training program monitored with torch_monitor.
//
// Trains a two-layer MLP (two torch::nn::Linear) on synthetic regression data
// with SGD and watches it two ways:
//  * a torch_monitor::Stat<double> aggregates the loss over 10 ms windows; a
//    C++ EventHandler prints every closed window;
//  * a torch_monitor::DifferenceMonitor attached to the first Linear's
//    "weight" records the update ratio ||dw|| / ||w|| of every step in a
//    PassthroughReducer, whose history is printed at the end;
//  * a second DifferenceMonitor on the nested buffer "net.block.state", a
//    running mean of the hidden activations that forward() updates in place:
//    the monitor copies the value before the call, so the change is measured.
//
// C++ modules have no hooks of their own and forward() is not virtual: the
// monitor's hooks run around calls made through torch_monitor::nn::call. The
// weight moves in the optimizer step, so the hooked call is one whole
// training step: TrainStep below, whose forward() does forward, backward and
// the SGD update. Net itself is not changed in any way.
//
//   train_linear [steps]     (default 200)
//
// Prints readable lines, then one line "summary {json}" (for tests).

#include <torch/torch.h>

#include <torch_monitor/nn.h>
#include <torch_monitor/reducers/factory.h>
#include <torch_monitor/torch_monitor.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr const char* kLossStat = "train.loss";
constexpr const char* kWatched = "net.fc1.weight";
constexpr const char* kWatchedBuffer = "net.block.state";

// Keeps a running mean of the activations passing through, in a buffer that
// forward() updates in place (like BatchNorm's running statistics).
struct ActivityImpl : torch::nn::Module {
  explicit ActivityImpl(int64_t features)
      : state(register_buffer("state", torch::zeros({features}))) {}
  torch::Tensor forward(const torch::Tensor& h) {
    torch::NoGradGuard noGrad;
    state.mul_(0.9).add_(h.detach().mean(0), 0.1);
    return h;
  }
  torch::Tensor state;
};
TORCH_MODULE(Activity);

// The model: nothing here knows about monitoring.
struct NetImpl : torch::nn::Module {
  NetImpl(int64_t in, int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        block(register_module("block", Activity(hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(block(torch::relu(fc1(x))));
  }
  torch::nn::Linear fc1;
  Activity block;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

// One SGD step as a module call, so that hooks on it see the weights just
// before and just after the update. Registers the model as "net": paths such
// as "net.fc1.weight" resolve through it.
struct TrainStepImpl : torch::nn::Module {
  TrainStepImpl(Net model, double lr)
      : net(register_module("net", model)),
        optimizer(net->parameters(), torch::optim::SGDOptions(lr)) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    optimizer.zero_grad();
    torch::Tensor loss = torch::mse_loss(net(x), y);
    loss.backward();
    optimizer.step();
    return loss.detach();
  }
  Net net;
  torch::optim::SGD optimizer;
};
TORCH_MODULE(TrainStep);

double valueOf(const torch_monitor::Event& event, const std::string& key) {
  const auto it = event.data.find(key);
  if (it == event.data.end() || !std::holds_alternative<double>(it->second)) {
    return std::nan("");
  }
  return std::get<double>(it->second);
}

// Prints every closed window of the loss stat (called on the training
// thread, inside Stat::add, when a window closes).
class LossPrinter : public torch_monitor::EventHandler {
 public:
  void handle(const torch_monitor::Event& event) override {
    if (event.name != torch_monitor::kStatEventName ||
        event.data.count(std::string(kLossStat) + ".count") == 0) {
      return;
    }
    const std::string p = std::string(kLossStat) + ".";
    const double count = valueOf(event, p + "count");
    ++windows;
    samples += static_cast<int64_t>(count);
    std::printf(
        "[event %s] window %d: loss mean %.5f  min %.5f  max %.5f  (%d steps)\n",
        event.name.c_str(), windows, valueOf(event, p + "mean"),
        valueOf(event, p + "min"), valueOf(event, p + "max"),
        static_cast<int>(count));
  }
  int windows = 0;
  int64_t samples = 0;
};

} // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 200;
  if (steps < 1) {
    std::fprintf(stderr, "usage: train_linear [steps >= 1]\n");
    return 2;
  }
  const auto started = std::chrono::steady_clock::now();
  torch::manual_seed(0);
  at::set_num_threads(1); // tiny matrices: threads would only add overhead

  // Synthetic regression data: y = x . w_true + 0.5 sin(x_0) + noise.
  const int64_t n = 1024, features = 8, batch = 64;
  const torch::Tensor x = torch::randn({n, features});
  const torch::Tensor wTrue = torch::randn({features, 1});
  const torch::Tensor y = x.mm(wTrue) + 0.5 * torch::sin(x.slice(1, 0, 1)) +
      0.05 * torch::randn({n, 1});

  Net net(features, 32);
  TrainStep step(net, /*lr=*/0.1);

  // ---- monitoring setup: these lines are all it takes --------------------
  auto printer = std::make_shared<LossPrinter>();
  torch_monitor::registerEventHandler(printer);
  auto ratios = torch_monitor::makeReducer(
      "PassthroughReducer", /*stepTime=*/1.0, /*duration=*/static_cast<double>(steps),
      /*inclusive=*/false, /*inplace=*/false, /*params=*/{}); // one row per step
  auto monitor = std::make_shared<torch_monitor::DifferenceMonitor>(
      ratios, kWatched, /*trainUpdate=*/true, /*evalUpdate=*/false);
  monitor->setOp([](const at::Tensor& after, const at::Tensor& before) {
    torch::NoGradGuard noGrad; // a statistic, not part of any graph
    return (after - before).norm() / before.norm();
  });
  torch_monitor::nn::HookHandle hooks =
      torch_monitor::nn::attach(monitor, step, kWatched);
  auto activity = torch_monitor::makeReducer("PassthroughReducer", 1.0, 10.0, false, false, {});
  hooks.merge(torch_monitor::nn::attach(
      std::make_shared<torch_monitor::DifferenceMonitor>(activity, kWatchedBuffer),
      step,
      kWatchedBuffer));
  // -------------------------------------------------------------------------

  double firstLoss = 0.0, lastLoss = 0.0, directRatio = 0.0;
  {
    torch_monitor::Stat<double> lossStat(
        kLossStat,
        {torch_monitor::Aggregation::MEAN,
         torch_monitor::Aggregation::MIN,
         torch_monitor::Aggregation::MAX,
         torch_monitor::Aggregation::COUNT},
        std::chrono::milliseconds(10));
    for (int64_t i = 0; i < steps; ++i) {
      const int64_t start = (i * batch) % n;
      const torch::Tensor xb = x.slice(0, start, start + batch);
      const torch::Tensor yb = y.slice(0, start, start + batch);
      const bool last = i + 1 == steps;
      // Computed by hand for the last step, to cross-check the monitor.
      const torch::Tensor before =
          last ? net->fc1->weight.detach().clone() : torch::Tensor();
      // Where a plain loop would write step(xb, yb): the hooks run around it.
      const torch::Tensor loss = torch_monitor::nn::call(step, xb, yb);
      const double value = loss.item<double>();
      lossStat.add(value);
      if (i == 0) {
        firstLoss = value;
      }
      lastLoss = value;
      if (last) {
        const torch::Tensor w = net->fc1->weight.detach();
        directRatio = ((w - before).norm() / before.norm()).item<double>();
      }
    }
  } // destroying the stat closes (and prints) its last window
  hooks.remove();
  torch_monitor::unregisterEventHandler(printer);

  double finalLoss = 0.0;
  {
    torch::NoGradGuard noGrad;
    net->eval();
    finalLoss = torch::mse_loss(net->forward(x), y).item<double>(); // no hooks
  }

  // ---- the update ratios, from the reducer's history ----------------------
  // dump(): every stored state, newest first; flip for step order.
  const torch::Tensor history = ratios->dump().value().flip(0).to(torch::kDouble);
  const double newest = ratios->peek().value().item<double>();
  const int64_t rows = history.size(0);
  std::printf(
      "\nweight-update ratio ||dw||/||w|| of %s per step (%lld recorded):\n",
      kWatched, static_cast<long long>(rows));
  const double maxRatio = history.max().item<double>();
  const int64_t every = std::max<int64_t>(1, rows / 10);
  for (int64_t i = 0; i < rows; ++i) {
    if (i % every == 0 || i + 1 == rows) {
      const double r = history[i].item<double>();
      const int bar = static_cast<int>(std::lround(40.0 * r / maxRatio));
      std::printf("  step %4lld  %.3e  %s\n", static_cast<long long>(i + 1), r,
                  std::string(std::max(bar, 0), '#').c_str());
    }
  }
  const double mean = history.mean().item<double>();
  const double minRatio = history.min().item<double>();
  std::printf(
      "  mean %.3e  min %.3e  max %.3e; newest (peek) %.3e, computed "
      "directly %.3e\n",
      mean, minRatio, maxRatio, newest, directRatio);
  const double stateDelta = activity->peek().value().norm().item<double>();
  std::printf(
      "in-place buffer %s moved by ||d|| = %.3e in the last step\n",
      kWatchedBuffer, stateDelta);
  std::printf(
      "loss: first step %.5f, last step %.5f, full data after training %.5f\n",
      firstLoss, lastLoss, finalLoss);
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - started)
                             .count();
  std::printf("%lld steps in %.2f s\n", static_cast<long long>(steps), seconds);

  std::printf(
      "summary {\"steps\": %lld, \"loss_first\": %.9g, \"loss_last\": %.9g, "
      "\"loss_final\": %.9g, \"stat_windows\": %d, \"stat_samples\": %lld, "
      "\"ratio_rows\": %lld, \"ratio_first\": %.9g, \"ratio_mean\": %.9g, "
      "\"ratio_min\": %.9g, \"ratio_newest\": %.9g, \"ratio_direct\": %.9g, "
      "\"state_delta\": %.9g, \"seconds\": %.3f}\n",
      static_cast<long long>(steps), firstLoss, lastLoss, finalLoss,
      printer->windows, static_cast<long long>(printer->samples),
      static_cast<long long>(rows), history[0].item<double>(), mean, minRatio,
      newest, directRatio, stateDelta, seconds);
  return 0;
}
