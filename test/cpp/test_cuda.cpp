// The core on a CUDA device, from C++: tensor samples and reducers give what
// the same values give on the host, and neither synchronises with the GPU.
// "No synchronisation" is checked the way torch.cuda.set_sync_debug_mode
// ("error") checks it in Python: c10's sync debug mode turns every
// synchronising call into an exception.
//
// Built only against a CUDA build of torch (test/cpp/CMakeLists.txt); every
// test skips when no device is visible. scripts/test_gpu.sh runs it
// (ctest -L cuda).

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <torch_monitor/reducers/factory.h>

#include "test_support.h"

namespace torch_monitor {
namespace {

using namespace std::chrono_literals;
using test::kAllAggregations;
using test::valueOf;

// Every synchronising CUDA call in the scope throws.
struct NoSync {
  NoSync() {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~NoSync() {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
};

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device";
    }
  }
};

// The event of `name`'s last closed window.
const Event& lastWindowOf(const std::vector<Event>& events, const std::string& name) {
  const Event* found = nullptr;
  for (const Event& e : events) {
    if (e.data.count(name + ".count")) {
      found = &e;
    }
  }
  EXPECT_NE(found, nullptr) << name;
  return *found;
}

TEST_F(Cuda, TensorSamplesMatchTheNumbersWithoutSynchronising) {
  test::ScopedRecorder recorder;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  at::manual_seed(3);
  std::vector<at::Tensor> host;
  for (int i = 0; i < 200; ++i) {
    host.push_back(at::randn({1 + i % 7}));
  }
  host.push_back(at::tensor({nan, 1.0, -inf}));
  host.push_back(at::tensor(2.5)); // 0-d: the last sample, VALUE
  std::vector<at::Tensor> device;
  for (const at::Tensor& t : host) {
    device.push_back(t.to(at::kCUDA));
  }
  torch::cuda::synchronize();

  Stat<double> onDevice("cuda.tensors", kAllAggregations, 1h);
  Stat<double> numbers("cuda.numbers", kAllAggregations, 1h);
  {
    NoSync noSync;
    for (const at::Tensor& t : device) {
      onDevice.add(t);
      onDevice.add(t.to(at::kHalf));
    }
  }
  for (const at::Tensor& t : host) {
    for (const at::Tensor& v : {t, t.to(at::kHalf)}) {
      const at::Tensor flat = v.reshape({-1}).to(at::kDouble);
      for (int64_t i = 0; i < flat.numel(); ++i) {
        numbers.add(flat[i].item<double>());
      }
    }
  }
  closeAllStats();
  const std::vector<Event> events = recorder->statEvents();
  const Event& a = lastWindowOf(events, "cuda.tensors");
  const Event& b = lastWindowOf(events, "cuda.numbers");
  for (Aggregation agg : kAllAggregations) {
    const std::string name = aggregationName(agg);
    const double x = valueOf<double>(a, "cuda.tensors." + name);
    const double y = valueOf<double>(b, "cuda.numbers." + name);
    if (std::isnan(y)) {
      EXPECT_TRUE(std::isnan(x)) << name;
    } else if (std::isinf(y)) {
      EXPECT_EQ(x, y) << name;
    } else {
      EXPECT_NEAR(x, y, 1e-6 * std::max(1.0, std::abs(y))) << name;
    }
  }
}

TEST_F(Cuda, IntStatTakesIntegerTensors) {
  Stat<int64_t> s("cuda.ints", {Aggregation::SUM, Aggregation::MAX, Aggregation::MIN}, 1h);
  const at::Tensor ints = at::tensor({int64_t(3), int64_t(-9), int64_t(40)}).to(at::kCUDA);
  const at::Tensor bools = at::ones({2}, at::kBool).to(at::kCUDA);
  torch::cuda::synchronize();
  {
    NoSync noSync;
    s.add(ints);
    s.add(bools);
  }
  closeAllStats();
  const auto got = s.get();
  EXPECT_EQ(got.at(Aggregation::SUM), 36);
  EXPECT_EQ(got.at(Aggregation::MAX), 40);
  EXPECT_EQ(got.at(Aggregation::MIN), -9);
}

TEST_F(Cuda, ReducerOnTheDeviceEqualsTheHostOneWithoutSynchronising) {
  auto onDevice = makeReducer("EMAReducer", 1.0, 3.0, false, false, {{"alpha", 0.3}});
  auto onHost = makeReducer("EMAReducer", 1.0, 3.0, false, false, {{"alpha", 0.3}});
  onDevice->to(at::Device(at::kCUDA), std::nullopt);
  at::manual_seed(4);
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < 6; ++i) {
    inputs.push_back(at::randn({4, 5}));
  }
  std::vector<at::Tensor> deviceInputs;
  for (const at::Tensor& t : inputs) {
    deviceInputs.push_back(t.to(at::kCUDA));
  }
  torch::cuda::synchronize();
  {
    NoSync noSync;
    for (const at::Tensor& t : deviceInputs) {
      onDevice->forward({t});
    }
  }
  for (const at::Tensor& t : inputs) {
    onHost->forward({t});
  }
  const at::Tensor got = onDevice->dump().value();
  EXPECT_TRUE(got.is_cuda());
  EXPECT_TRUE(at::allclose(got.cpu(), onHost->dump().value(), 1e-5, 1e-6));
}

} // namespace
} // namespace torch_monitor
