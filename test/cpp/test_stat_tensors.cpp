// Stat::add(const at::Tensor&) from C++ (both tensor paths, against adding
// the elements as numbers) and windows measured in training steps.
//
// The accelerator path (summaries kept as device tensors until the window
// closes) runs here on CPU tensors through
// test_hooks::setCpuTensorsTakeDevicePath; the Python tests run it on CUDA when
// a GPU is present.

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_support.h"

namespace torch_monitor {
namespace {

using namespace std::chrono_literals;
using test::expectValueError;
using test::kAllAggregations;
using test::valueOf;

// The device path for the scope.
struct DevicePath {
  DevicePath() {
    test_hooks::setCpuTensorsTakeDevicePath(true);
  }
  ~DevicePath() {
    test_hooks::setCpuTensorsTakeDevicePath(false);
  }
};

// Forgets the training step at the end of the scope.
struct StepReset {
  ~StepReset() {
    clearStep();
  }
};

// Both stats' last windows, closed now, must agree (NaN with NaN).
void expectSameWindows(
    const test::ScopedRecorder& recorder,
    const std::string& a,
    const std::string& b) {
  closeAllStats();
  const std::vector<Event> events = recorder->statEvents();
  const Event* ea = nullptr;
  const Event* eb = nullptr;
  for (const Event& e : events) {
    if (e.data.count(a + ".sum")) {
      ea = &e;
    }
    if (e.data.count(b + ".sum")) {
      eb = &e;
    }
  }
  ASSERT_NE(ea, nullptr);
  ASSERT_NE(eb, nullptr);
  for (Aggregation agg : kAllAggregations) {
    const std::string name = aggregationName(agg);
    const double x = valueOf<double>(*ea, a + "." + name);
    const double y = valueOf<double>(*eb, b + "." + name);
    if (std::isnan(y)) {
      EXPECT_TRUE(std::isnan(x)) << name;
    } else {
      EXPECT_NEAR(x, y, 1e-9 * std::max(1.0, std::abs(y))) << name;
    }
  }
}

class StatTensors : public ::testing::TestWithParam<bool> {
 protected:
  test::ScopedRecorder recorder;
};

TEST_P(StatTensors, ElementsAreSamplesInOrderMixedWithNumbers) {
  std::optional<DevicePath> devicePath;
  if (GetParam()) {
    devicePath.emplace();
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Stat<double> tensors("cpp.tensors", kAllAggregations, 1h);
  Stat<double> numbers("cpp.numbers", kAllAggregations, 1h);
  const std::vector<at::Tensor> values = {
      at::tensor({nan, 2.0, -7.5}),
      at::arange(6, at::kFloat).reshape({2, 3}).t(), // non-contiguous
      at::tensor(int64_t(4)),
      at::empty({0}),
  };
  tensors.add(1.5);
  numbers.add(1.5);
  for (const at::Tensor& t : values) {
    tensors.add(t);
    const at::Tensor flat = t.contiguous().reshape({-1}).to(at::kDouble);
    for (int64_t i = 0; i < flat.numel(); ++i) {
      numbers.add(flat[i].item<double>());
    }
  }
  EXPECT_EQ(tensors.count(), numbers.count());
  expectSameWindows(recorder, "cpp.tensors", "cpp.numbers");
}

TEST_P(StatTensors, IntStatTakesIntegerTensorsOnly) {
  std::optional<DevicePath> devicePath;
  if (GetParam()) {
    devicePath.emplace();
  }
  Stat<int64_t> s("cpp.ints", {Aggregation::SUM, Aggregation::MAX}, 1h);
  s.add(at::tensor({int64_t(3), int64_t(-9)}));
  s.add(at::ones({2}, at::kBool));
  EXPECT_EQ(s.count(), 4);
  try {
    s.add(at::ones({2}));
    FAIL() << "a float tensor was accepted";
  } catch (const c10::TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("takes integer tensors"), std::string::npos);
  }
  closeAllStats();
  const auto got = s.get();
  EXPECT_EQ(got.at(Aggregation::SUM), -4);
  EXPECT_EQ(got.at(Aggregation::MAX), 3);
}

INSTANTIATE_TEST_SUITE_P(
    HostAndDevicePath,
    StatTensors,
    ::testing::Values(false, true),
    [](const auto& info) { return info.param ? "DevicePath" : "HostPath"; });

TEST(StatWindowSteps, WindowsCloseWhenTheStepCrossesAMultiple) {
  test::ScopedRecorder recorder;
  StepReset reset;
  Stat<double> loss("cpp.steps", {Aggregation::MEAN, Aggregation::COUNT}, WindowSteps{10});
  EXPECT_EQ(loss.windowSteps(), 10);
  EXPECT_EQ(loss.windowSize(), 0ms);
  for (int64_t step = 0; step < 25; ++step) {
    setStep(step);
    loss.add(double(step));
  }
  // Steps 0..9 and 10..19 closed; 20..24 are open.
  const std::vector<Event> events = recorder->statEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(valueOf<double>(events[0], "cpp.steps.mean"), 4.5);
  EXPECT_EQ(valueOf<double>(events[1], "cpp.steps.mean"), 14.5);
  EXPECT_EQ(valueOf<double>(events[1], "cpp.steps.count"), 10.0);
  EXPECT_EQ(loss.count(), 5);
}

TEST(StatWindowSteps, StepsBeforeAnySetStepReadZeroAndTimeDoesNotMatter) {
  test::ScopedRecorder recorder;
  test::FakeClock clock{0};
  StepReset reset;
  clearStep();
  Stat<int64_t> s("cpp.steps.unset", {Aggregation::SUM}, WindowSteps{3});
  s.add(1);
  clock.advance(10 * 3600 * 1000); // time windows would close here
  s.add(2);
  EXPECT_TRUE(recorder->statEvents().empty());
  setStep(3);
  s.add(4);
  ASSERT_EQ(recorder->statEvents().size(), 1u);
  EXPECT_EQ(valueOf<int64_t>(recorder->statEvents()[0], "cpp.steps.unset.sum"), 3);
}

TEST(StatWindowSteps, RejectsWindowsUnderOneStepAndNegativeSteps) {
  expectValueError(
      [] { Stat<double>("bad.steps", {Aggregation::SUM}, WindowSteps{0}); },
      {"'bad.steps'", "window_steps must be at least 1", "got 0"});
  expectValueError([] { setStep(-1); }, {"[0, 2**63-1]", "got -1"});
}

} // namespace
} // namespace torch_monitor
