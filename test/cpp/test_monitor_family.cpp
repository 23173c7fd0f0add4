// The one-hook monitors for C++ modules (torch_monitor/nn/observe.h):
// attachInput, attachOutput, attachState and attachMultiState feeding
// DifferenceMonitor::observe(). The expected histories are inferno's
// (inferno-ai 0.0.5, InputMonitor/OutputMonitor/StateMonitor/
// MultiStateMonitor with the same reducers), written out by hand; the
// Python suite (test/python/test_monitor_family.py) compares with inferno
// itself.

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <torch_monitor/nn.h>
#include <torch_monitor/reducers/factory.h>

#include "test_nn_support.h"
#include "test_support.h"

namespace torch_monitor {
namespace {

namespace tnn = torch_monitor::nn;
using test::expectValueError;
using test::ScopedHook;

// A leaky neuron: v <- 0.6 v + x; where v > 1 it spikes and resets to 0.
// Returns v before the reset. Updates its buffers in place.
struct NeuronImpl : torch::nn::Module {
  NeuronImpl() {
    v = register_buffer("v", at::zeros({2}));
    spike = register_buffer("spike", at::zeros({2}, at::kBool));
  }
  at::Tensor forward(const at::Tensor& x) {
    v.mul_(0.6).add_(x);
    const at::Tensor out = v.clone();
    spike.copy_(v > 1.0);
    v.masked_fill_(spike, 0.0);
    return out;
  }
  at::Tensor v, spike;
};
TORCH_MODULE(Neuron);

struct LayerImpl : torch::nn::Module {
  LayerImpl() {
    neuron = register_module("neuron", Neuron());
  }
  at::Tensor forward(const at::Tensor& x, double gain) {
    return neuron(x * gain);
  }
  Neuron neuron{nullptr};
};
TORCH_MODULE(Layer);

// A forward() whose argument no monitor can take.
struct TextImpl : torch::nn::Module {
  at::Tensor forward(const std::string& text) {
    return at::ones({static_cast<int64_t>(text.size())});
  }
};
TORCH_MODULE(Text);

std::shared_ptr<DifferenceMonitor> passthrough(const std::string& name, double duration = 2.0) {
  return std::make_shared<DifferenceMonitor>(
      makeReducer("PassthroughReducer", 1.0, duration, false, false, {}), name);
}

at::Tensor t(std::vector<double> values) {
  return at::tensor(values, at::kDouble).to(at::kFloat);
}

void expectClose(const std::optional<at::Tensor>& actual, const at::Tensor& expected) {
  ASSERT_TRUE(actual.has_value());
  EXPECT_TRUE(at::allclose(*actual, expected, 0.0, 1e-6))
      << *actual << "\nexpected\n" << expected;
}

TEST(MonitorFamily, InputMonitorFeedsTheArgumentsAsTheReducersInputs) {
  Layer layer;
  // (x, gain): the conditional trace takes an observation and a condition;
  // here a Passthrough on the first argument via map.
  auto monitor = passthrough("layer input");
  monitor->setMap([](const c10::IValue& inputs, const c10::IValue& none) {
    EXPECT_TRUE(none.isNone()); // nothing captured by a one-hook monitor
    const auto& args = inputs.toTupleRef().elements();
    return std::vector<at::Tensor>{args[0].toTensor() * args[1].toDouble()};
  });
  ScopedHook h{tnn::attachInput(monitor, layer)};
  tnn::call(layer, t({0.5, 1.0}), 2.0);
  tnn::call(layer, t({0.25, 0.0}), 4.0);
  expectClose(monitor->reducer()->dump(), at::stack({t({1.0, 0.0}), t({1.0, 2.0})}));
}

TEST(MonitorFamily, OutputAndStateMonitorsSeeWhatInfernoSees) {
  Neuron neuron;
  auto output = passthrough("output", 3.0);
  auto before = passthrough("v before", 3.0);
  auto after = passthrough("v after", 3.0);
  ScopedHook h1{tnn::attachOutput(output, neuron)};
  ScopedHook h2{tnn::attachState(before, neuron, "v", /*asPrehook=*/true)};
  ScopedHook h3{tnn::attachState(after, neuron, "v")};
  for (double x : {0.5, 0.8, 0.2}) {
    tnn::call(neuron, t({x, 2 * x}));
  }
  // v: 0 -> [0.5, 1.0] -> [1.1, 2.2] (both spike, reset to 0) -> [0.2, 0.4]
  expectClose(output->reducer()->dump(), at::stack({t({0.2, 0.4}), t({1.1, 2.2}), t({0.5, 1.0})}));
  expectClose(after->reducer()->dump(), at::stack({t({0.2, 0.4}), t({0.0, 0.0}), t({0.5, 1.0})}));
  expectClose(before->reducer()->dump(), at::stack({t({0.0, 0.0}), t({0.5, 1.0}), t({0.0, 0.0})}));
}

TEST(MonitorFamily, MultiStateMonitorFeedsSeveralInputsInOrder) {
  Layer layer;
  // ConditionalNearestTrace(tau=2, A=1, k=0.5): where(cond, k x + A, decay s)
  auto monitor = std::make_shared<DifferenceMonitor>(
      makeReducer(
          "ConditionalNearestTraceReducer", 1.0, 0.0, false, false,
          {{"time_constant", 2.0}, {"amplitude", 1.0}, {"scale", 0.5}}),
      "neuron.v,neuron.spike");
  ScopedHook h{tnn::attachMultiState(monitor, layer, {"neuron.v", "neuron.spike"})};
  tnn::call(layer, t({0.5, 1.2}), 1.0); // v after: [0.5, 0], spike [F, T]
  expectClose(monitor->reducer()->peek(), t({0.0, 1.0}));
  tnn::call(layer, t({0.9, 0.1}), 1.0); // v: [1.2 -> 0, 0.1], spike [T, F]
  expectClose(monitor->reducer()->peek(), t({1.0, std::exp(-0.5)}));
}

TEST(MonitorFamily, GatingRemovalAndErrors) {
  Neuron neuron;
  auto monitor = passthrough("output");
  monitor->setEvalUpdate(false);
  ScopedHook h{tnn::attachOutput(monitor, neuron)};
  neuron->eval();
  tnn::call(neuron, t({0.1, 0.1}));
  EXPECT_FALSE(monitor->reducer()->peek().has_value());
  neuron->train();
  tnn::call(neuron, t({0.1, 0.1}));
  EXPECT_TRUE(monitor->reducer()->peek().has_value());
  h.handle.remove();
  monitor->clear();
  tnn::call(neuron, t({0.1, 0.1}));
  EXPECT_FALSE(monitor->reducer()->peek().has_value());
  EXPECT_EQ(monitor.use_count(), 1); // the hook let go of it

  Text text;
  ScopedHook h2{tnn::attachInput(passthrough("text"), text)};
  try {
    tnn::call(text, std::string("abc"));
    ADD_FAILURE() << "a std::string argument was accepted";
  } catch (const c10::TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("forward argument 0"), std::string::npos) << e.what();
  }
  expectValueError(
      [&] { tnn::attachMultiState(passthrough("none"), neuron, {}); },
      {"at least one attribute path"});
  expectValueError(
      [&] { tnn::attachOutput(std::shared_ptr<DifferenceMonitor>(), neuron); },
      {"null pointer"});
}

} // namespace
} // namespace torch_monitor
