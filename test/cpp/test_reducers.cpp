// GoogleTest of the C++ reducers: the spec's oracle values, the ring buffer
// (wrap, resize, clear), view() with scalar and tensor times, dtype/device
// handling, the saved state, and the errors users can run into.

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <torch_monitor/reducers/reducers.h>
#include <torch_monitor/script/reducer.h>

#include "test_support.h"

namespace torch_monitor::test {
namespace {

using script::ScriptReducer;

constexpr double kInf = std::numeric_limits<double>::infinity();

at::Tensor scalar(double v) {
  return at::scalar_tensor(v, at::kFloat);
}

at::Tensor vec(std::vector<float> values) {
  return at::tensor(values, at::kFloat);
}

at::Tensor boolVec(std::vector<bool> values) {
  std::vector<float> f(values.begin(), values.end());
  return at::tensor(f, at::kFloat).to(at::kBool);
}

// Element-wise closeness with inf/nan in the same places.
void expectClose(
    const at::Tensor& actual,
    const at::Tensor& expected,
    double rtol = 1e-5,
    double atol = 1e-6) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(at::allclose(
      actual.to(at::kDouble),
      expected.to(at::kDouble),
      rtol,
      atol,
      /*equal_nan=*/true))
      << "actual:\n"
      << actual << "\nexpected:\n"
      << expected;
}

void expectTypeError(
    const std::function<void()>& fn,
    const std::string& fragment) {
  try {
    fn();
  } catch (const c10::TypeError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(fragment), std::string::npos)
        << e.what_without_backtrace();
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected c10::TypeError, got: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected c10::TypeError, nothing was thrown";
}

TEST(ReducerHistorySize, DoublePrecisionCeilAndInclusive) {
  // 2.1 / 0.3 is 7.000000000000001 in double: 8 rows.
  EXPECT_EQ(historySize(0.3, 2.1, false), 8);
  EXPECT_EQ(historySize(0.3, 2.1, true), 9);
  EXPECT_EQ(historySize(1.0, 3.0, false), 3);
  EXPECT_EQ(historySize(1.0, 3.0, true), 4);
  EXPECT_EQ(historySize(1.0, 0.0, false), 1);
  EXPECT_EQ(historySize(1.0, 0.0, true), 1);
  EXPECT_EQ(historySize(0.5, 0.2, false), 1);
}

TEST(ReducerHistorySize, RejectsInvalidTiming) {
  expectValueError([] { historySize(0.0, 1.0, false); }, {"step_time", "0"});
  expectValueError([] { historySize(-1.0, 1.0, false); }, {"step_time"});
  expectValueError([] { historySize(1.0, -0.5, false); }, {"duration"});
  expectValueError([] { historySize(NAN, 1.0, false); }, {"step_time"});
  expectValueError([] { historySize(1e-300, 1e300, false); }, {"more recorded states"});
  expectValueError([] { makeReducer("EMAReducer", 0.0, 0.0, false, false, {{"alpha", 0.5}}); }, {"step_time"});
  expectValueError([] { makeReducer("EMAReducer", 1.0, -1.0, false, false, {{"alpha", 0.5}}); }, {"duration"});
}

TEST(ReducerOracle, EMA) {
  FoldReducer r(reducerKind("EMAReducer"), 1.0, /*duration=*/2.0, false, false, {{"alpha", 0.5}});
  EXPECT_FALSE(r.peek().has_value());
  EXPECT_FALSE(r.dump().has_value());
  EXPECT_FALSE(r.view(0.0).has_value());
  std::vector<double> expected{2, 3, 5.5};
  std::vector<double> inputs{2, 4, 8};
  for (size_t i = 0; i < inputs.size(); ++i) {
    r.forward({scalar(inputs[i])});
    EXPECT_DOUBLE_EQ(r.peek()->item<double>(), expected[i]);
  }
  EXPECT_DOUBLE_EQ(r.view(0.25)->item<double>(), 4.875);
  expectClose(*r.dump(), vec({5.5, 3}));
}

TEST(ReducerOracle, CA) {
  FoldReducer r(reducerKind("CAReducer"), 1.0, 2.0, false, false);
  std::vector<double> inputs{1, 2, 6};
  std::vector<double> expected{1, 1.5, 3};
  for (size_t i = 0; i < inputs.size(); ++i) {
    r.forward({scalar(inputs[i])});
    EXPECT_DOUBLE_EQ(r.peek()->item<double>(), expected[i]);
  }
  EXPECT_EQ(r.steps(), 3);
  r.clear();
  r.forward({scalar(10)});
  r.forward({scalar(20)});
  EXPECT_DOUBLE_EQ(r.peek()->item<double>(), 15.0); // the count restarted
}

TEST(ReducerOracle, Event) {
  FoldReducer r(reducerKind("EventReducer"), 0.5, /*duration=*/1.0, false, false, {}, Criterion::builtin("gt", 0.0));
  const std::vector<std::vector<bool>> criteria{
      {false, true}, {false, false}, {true, false}, {false, false}};
  const std::vector<at::Tensor> expected{
      vec({INFINITY, 0}), vec({INFINITY, .5}), vec({0, 1}), vec({.5, 1.5})};
  for (size_t i = 0; i < criteria.size(); ++i) {
    r.forward({boolVec(criteria[i]).to(at::kFloat)});
    expectClose(*r.peek(), expected[i]);
  }
  expectClose(*r.view(0.25), vec({.25, 1.25}));
  // Rows never written hold the initial value.
  FoldReducer fresh(reducerKind("EventReducer"), 1.0, 3.0, false, false, {{"initial", NAN}}, Criterion::builtin("nonzero"));
  fresh.forward({vec({1, 0})});
  expectClose(*fresh.dump(), at::stack({vec({0, NAN}), vec({NAN, NAN}), vec({NAN, NAN})}));
}

TEST(ReducerOracle, NearestTrace) {
  FoldReducer r(reducerKind("NearestTraceReducer"), 1.0, 0.0, false, false, {{"time_constant", 2.0}, {"amplitude", 1.0}, {"target", 1.0}});
  const std::vector<double> inputs{1, 0, 0, 1};
  const std::vector<double> expected{1, std::exp(-0.5), std::exp(-1.0), 1};
  for (size_t i = 0; i < inputs.size(); ++i) {
    r.forward({scalar(inputs[i])});
    EXPECT_NEAR(r.peek()->item<double>(), expected[i], 1e-6);
  }
  EXPECT_NEAR(r.peek()->item<double>(), 1.0, 0.0);
  EXPECT_NEAR(std::exp(-0.5), 0.6065, 1e-4);
}

TEST(ReducerTraces, CumulativeScaledAndConditional) {
  const double decay = std::exp(-1.0 / 2.0);
  FoldReducer cumulative(reducerKind("CumulativeTraceReducer"), 1.0, 0.0, false, false, {{"time_constant", 2.0}, {"amplitude", 1.0}, {"target", 1.0}, {"tolerance", 0.1}});
  cumulative.forward({vec({1.05, 0})});
  cumulative.forward({vec({1.0, 0.95})});
  expectClose(*cumulative.peek(), vec({float(decay + 1), 1}));

  const std::map<std::string, double> scaled{{"time_constant", 2.0}, {"amplitude", 0.5}, {"scale", 2.0}};
  FoldReducer scaledNearest(reducerKind("ScaledNearestTraceReducer"), 1.0, 0.0, false, false, scaled, Criterion::builtin("gt", 0.0));
  scaledNearest.forward({vec({3, -1})});
  expectClose(*scaledNearest.peek(), vec({6.5, 0}));
  scaledNearest.forward({vec({0, 1})});
  expectClose(*scaledNearest.peek(), vec({float(6.5 * decay), 2.5}));

  FoldReducer scaledCumulative(reducerKind("ScaledCumulativeTraceReducer"), 1.0, 0.0, false, false, scaled, Criterion::builtin("gt", 0.0));
  scaledCumulative.forward({vec({3, -1})});
  scaledCumulative.forward({vec({1, 1})});
  expectClose(*scaledCumulative.peek(), vec({float(6.5 * decay + 2.5), 2.5}));

  FoldReducer conditional(reducerKind("ConditionalNearestTraceReducer"), 1.0, 0.0, false, false, scaled);
  EXPECT_EQ(conditional.arity(), 2u);
  conditional.forward({vec({3, 4}), boolVec({true, false})});
  expectClose(*conditional.peek(), vec({6.5, 0}));
  // A non-bool condition counts its nonzero elements.
  conditional.forward({vec({1, 1}), vec({0, 2})});
  expectClose(*conditional.peek(), vec({float(6.5 * decay), 2.5}));

  FoldReducer conditionalCumulative(reducerKind("ConditionalCumulativeTraceReducer"), 1.0, 0.0, false, false, scaled);
  conditionalCumulative.forward({vec({3, 4}), boolVec({true, false})});
  conditionalCumulative.forward({vec({1, 1}), boolVec({true, true})});
  expectClose(*conditionalCumulative.peek(), vec({float(6.5 * decay + 2.5), 2.5}));
}

TEST(ReducerRing, WrapsAroundAndDumpsNewestFirst) {
  FoldReducer r(reducerKind("PassthroughReducer"), 1.0, /*duration=*/2.0, /*inclusive=*/true, false); // N = 3
  EXPECT_EQ(r.historySize(), 3);
  for (int i = 1; i <= 7; ++i) {
    r.forward({scalar(i)});
    EXPECT_DOUBLE_EQ(r.peek()->item<double>(), i);
  }
  expectClose(*r.dump(), vec({7, 6, 5}));
  EXPECT_DOUBLE_EQ(r.view(0.0)->item<double>(), 7);
  EXPECT_DOUBLE_EQ(r.view(1.0)->item<double>(), 6);
  EXPECT_DOUBLE_EQ(r.view(2.0)->item<double>(), 5);
  // Previous-value interpolation takes the older neighbour.
  EXPECT_DOUBLE_EQ(r.view(0.5)->item<double>(), 6);
  EXPECT_DOUBLE_EQ(r.view(1.9)->item<double>(), 5);
  // Within the tolerance of a step: that step exactly.
  EXPECT_DOUBLE_EQ(r.view(1.0 + 5e-8)->item<double>(), 6);
  EXPECT_DOUBLE_EQ(r.view(2.0 + 5e-8)->item<double>(), 5);
}

TEST(ReducerView, ExactAndInterpolatedScalarTimes) {
  FoldReducer r(reducerKind("EMAReducer"), 0.5, /*duration=*/1.5, false, false, {{"alpha", 1.0}}); // alpha 1: records inputs; N = 3
  for (float v : {1.f, 2.f, 4.f, 8.f}) {
    r.forward({vec({v, -v})});
  }
  // States newest first: 8, 4, 2 (dt = 0.5).
  expectClose(*r.view(0.0), vec({8, -8}));
  expectClose(*r.view(0.5), vec({4, -4}));
  expectClose(*r.view(1.0), vec({2, -2}));
  // Linear: 0.125 after the state at 0.5 (4) towards 8 -> 4 + 4 * 0.25.
  expectClose(*r.view(0.375), vec({5, -5}));
  expectClose(*r.view(0.75), vec({3, -3}));
}

TEST(ReducerView, TensorTimesPerElementAndTrailing) {
  FoldReducer r(reducerKind("EMAReducer"), 1.0, /*duration=*/3.0, false, false, {{"alpha", 1.0}}); // N = 3, records inputs
  r.forward({vec({1, 10})});
  r.forward({vec({2, 20})});
  r.forward({vec({4, 40})});
  // One time per element.
  expectClose(*r.view(at::tensor({0.0f, 1.0f})), vec({4, 20}));
  expectClose(*r.view(at::tensor({0.5f, 1.5f})), vec({3, 15}));
  // Several times per element along a trailing dimension.
  const at::Tensor times = at::tensor({0.0f, 0.5f, 2.0f, 1.0f, 1.5f, 2.0f}).view({2, 3});
  expectClose(*r.view(times), at::tensor({4.0f, 3.0f, 1.0f, 20.0f, 15.0f, 10.0f}).view({2, 3}));
  // A 0-dim tensor is one time for every element, like the double overload.
  expectClose(*r.view(at::scalar_tensor(0.5)), *r.view(0.5));
  // Times broadcast over the elements.
  expectClose(*r.view(at::tensor({1.0f, 2.0f}).view({1, 2})), at::tensor({2.0f, 1.0f, 20.0f, 10.0f}).view({2, 2}));
  // Integer times are steps.
  expectClose(*r.view(at::tensor({2, 0}, at::kLong)), vec({1, 40}));
}

TEST(ReducerView, OutOfRangeAndBadTimes) {
  FoldReducer r(reducerKind("PassthroughReducer"), 0.5, 1.0, false, false); // N = 2: times in [0, 0.5]
  r.forward({vec({1, 2})});
  expectValueError([&] { r.view(0.6); }, {"outside", "0.5"});
  expectValueError([&] { r.view(-0.1); }, {"outside"});
  expectValueError([&] { r.view(NAN); }, {"outside"});
  expectValueError([&] { r.view(at::tensor({0.0f, 0.7f})); }, {"min", "max"});
  expectValueError([&] { r.view(at::zeros({2, 2, 2})); }, {"dimensions"});
  expectValueError([&] { r.view(at::zeros({3})); }, {"[3]", "[2]"});
  EXPECT_NO_THROW(r.view(0.5 + 5e-8));
  EXPECT_NO_THROW(r.view(-5e-8));
}

TEST(ReducerResize, DurationKeepsNewestAndPadsWithFill) {
  FoldReducer r(reducerKind("EventReducer"), 1.0, /*duration=*/2.0, false, false, {}, Criterion::builtin("nonzero"));
  r.forward({vec({1})}); // 0
  r.forward({vec({0})}); // 1
  r.forward({vec({0})}); // 2
  expectClose(r.dump()->flatten(), vec({2, 1}));
  r.setDuration(4.0); // the FIX: duration changes, step time stays
  EXPECT_DOUBLE_EQ(r.duration(), 4.0);
  EXPECT_DOUBLE_EQ(r.stepTime(), 1.0);
  EXPECT_EQ(r.historySize(), 4);
  expectClose(r.dump()->flatten(), vec({2, 1, INFINITY, INFINITY}));
  r.forward({vec({0})});
  expectClose(r.dump()->flatten(), vec({3, 2, 1, INFINITY}));
  r.setDuration(1.0);
  EXPECT_EQ(r.historySize(), 1);
  expectClose(r.dump()->flatten(), vec({3}));
  r.forward({vec({1})});
  expectClose(r.dump()->flatten(), vec({0}));
}

TEST(ReducerResize, StepTimeResizesAndUpdatesDecay) {
  FoldReducer r(reducerKind("NearestTraceReducer"), 1.0, /*duration=*/2.0, false, false, {{"time_constant", 2.0}, {"amplitude", 1.0}, {"target", 1.0}});
  r.forward({scalar(1)});
  r.setStepTime(0.5);
  EXPECT_EQ(r.historySize(), 4);
  expectClose(*r.dump(), vec({1, 0, 0, 0}));
  r.forward({scalar(0)});
  EXPECT_NEAR(r.peek()->item<double>(), std::exp(-0.25), 1e-6);
  expectValueError([&] { r.setStepTime(0.0); }, {"step_time"});
  expectValueError([&] { r.setDuration(-1.0); }, {"duration"});
  EXPECT_DOUBLE_EQ(r.stepTime(), 0.5); // unchanged by the failed calls
  r.setInclusive(true);
  EXPECT_EQ(r.historySize(), 5);
}

TEST(ReducerClear, KeepshapeRefillsAndForgets) {
  FoldReducer r(reducerKind("EventReducer"), 1.0, 2.0, false, false, {{"initial", 0.0}}, Criterion::builtin("nonzero"));
  r.forward({vec({1, 0, 0})});
  r.forward({vec({0, 0, 1})});
  r.clear(/*keepshape=*/true);
  EXPECT_FALSE(r.peek().has_value());
  EXPECT_TRUE(r.snapshot().allocated);
  expectClose(r.storage(), at::zeros({2, 3}));
  expectValueError([&] { r.forward({vec({1, 2})}); }, {"expected [3]", "got [2]"});
  r.clear();
  EXPECT_FALSE(r.snapshot().allocated);
  r.forward({vec({1, 2})});
  EXPECT_EQ(r.peek()->sizes(), at::IntArrayRef({2}));
}

TEST(ReducerErrors, InputsShapeDeviceAndCount) {
  FoldReducer r(reducerKind("EMAReducer"), 1.0, 0.0, false, false, {{"alpha", 0.5}});
  expectValueError([&] { r.forward({}); }, {"one tensor", "got 0"});
  expectValueError([&] { r.forward({vec({1}), vec({1})}); }, {"got 2"});
  expectValueError([&] { r.forward({at::Tensor()}); }, {"undefined"});
  expectValueError(
      [&] { r.forward({at::empty({2}, at::TensorOptions().device(at::kMeta))}); },
      {"meta", "cpu", ".to("});
  r.forward({at::ones({2, 3})});
  expectValueError(
      [&] { r.forward({at::ones({3, 2})}); },
      {"expected [2, 3]", "got [3, 2]", "clear()"});
  FoldReducer c(reducerKind("ConditionalNearestTraceReducer"), 1.0, 0.0, false, false, {{"time_constant", 1.0}, {"amplitude", 1.0}, {"scale", 1.0}});
  expectValueError([&] { c.forward({vec({1})}); }, {"two tensors", "got 1"});
}

TEST(ReducerErrors, ParametersAndCriteria) {
  expectValueError([] { makeReducer("EMAReducer", 1.0, 0.0, false, false, {{"alpha", 1.5}}); }, {"alpha", "[0, 1]"});
  expectValueError([] { makeReducer("NearestTraceReducer", 1.0, 0.0, false, false, {{"time_constant", 0.0}, {"amplitude", 1.0}, {"target", 1.0}}); }, {"NearestTraceReducer", "time_constant"});
  expectValueError([] { makeReducer("CumulativeTraceReducer", 1.0, 0.0, false, false, {{"time_constant", 1.0}, {"amplitude", 0.0}, {"target", 1.0}}); }, {"amplitude"});
  expectValueError([] { makeReducer("NearestTraceReducer", 1.0, 0.0, false, false, {{"time_constant", 1.0}, {"amplitude", 1.0}, {"target", 1.0}, {"tolerance", -0.1}}); }, {"tolerance"});
  expectValueError([] { makeReducer("EventReducer", 1.0, 0.0, false, false, {{"initial", 1.0}}, Criterion::builtin("gt")); }, {"initial", "inf, 0 or nan"});
  expectValueError([] { Criterion::builtin("between"); }, {"between", "nonzero"});
  expectValueError([] { makeReducer("EventReducer", 1.0, 0.0, false, false, {}); }, {"criterion"});
  FoldReducer bad(reducerKind("EventReducer"), 1.0, 0.0, false, false, {}, Criterion::custom([](const at::Tensor& x) { return x; }, "identity"));
  expectTypeError([&] { bad.forward({vec({1})}); }, "identity");
  EXPECT_EQ(bad.steps(), 0); // a failed step does not count
  FoldReducer ema(reducerKind("EMAReducer"), 1.0, 0.0, false, false, {{"alpha", 0.5}});
  expectValueError([&] { ema.setParam("beta", 1.0); }, {"beta", "alpha"});
  expectValueError([&] { ema.setCriterion(Criterion::builtin("gt")); }, {"no criterion"});
  ema.setParam("alpha", 0.25);
  EXPECT_DOUBLE_EQ(ema.params().at("alpha"), 0.25);
}

TEST(ReducerFactory, BuildsEveryKindAndChecksParams) {
  for (const std::string& kind : reducerKinds()) {
    std::map<std::string, double> params;
    Criterion criterion;
    if (kind == "EMAReducer") {
      params = {{"alpha", 0.5}};
    } else if (kind.find("Scaled") != std::string::npos || kind.find("Conditional") != std::string::npos) {
      params = {{"time_constant", 2.0}, {"amplitude", 1.0}, {"scale", 0.5}};
    } else if (kind.find("Trace") != std::string::npos) {
      params = {{"time_constant", 2.0}, {"amplitude", 1.0}, {"target", 1.0}};
    }
    if (kind == "EventReducer" || kind.find("Scaled") != std::string::npos) {
      criterion = Criterion::builtin("gt", 0.0);
    }
    auto r = makeReducer(kind, 1.0, 2.0, false, false, params, criterion);
    EXPECT_EQ(r->kind(), kind);
    std::vector<at::Tensor> inputs{vec({1, 0})};
    if (r->arity() == 2) {
      inputs.push_back(boolVec({true, false}));
    }
    r->forward(inputs);
    r->forward(inputs);
    EXPECT_EQ(r->dump()->sizes(), at::IntArrayRef({2, 2})) << kind;
  }
  EXPECT_EQ(reducerKinds().size(), 10u);
  expectValueError([] { makeReducer("MaxReducer", 1.0, 0.0, false, false, {}); }, {"MaxReducer", "EMAReducer"});
  expectValueError([] { makeReducer("EMAReducer", 1.0, 0.0, false, false, {}); }, {"alpha"});
  expectValueError([] { makeReducer("EMAReducer", 1.0, 0.0, false, false, {{"alpha", 0.5}, {"alfa", 1}}); }, {"alfa"});
  expectValueError([] { makeReducer("EventReducer", 1.0, 0.0, false, false, {}); }, {"criterion"});
  expectValueError([] { makeReducer("CAReducer", 1.0, 0.0, false, false, {}, Criterion::builtin("gt")); }, {"no criterion"});
}

TEST(ReducerTensors, DtypeCastAndMove) {
  FoldReducer r(reducerKind("PassthroughReducer"), 1.0, 1.0, false, false);
  r.to(std::nullopt, at::kDouble);
  r.forward({at::tensor({1, 2}, at::kInt)});
  EXPECT_EQ(r.peek()->scalar_type(), at::kDouble);
  EXPECT_EQ(r.dump()->scalar_type(), at::kDouble);
  r.to(std::nullopt, at::kFloat);
  EXPECT_EQ(r.storage().scalar_type(), at::kFloat);
  expectClose(*r.peek(), vec({1, 2}));
  expectTypeError([&] { r.to(std::nullopt, at::kLong); }, "floating");
  expectValueError([&] { r.setStorage(at::zeros({3, 2})); }, {"[1, 2]", "[3, 2]"});
}

TEST(ReducerTensors, OutOfPlaceKeepsHandedOutViewsInPlaceDoesNot) {
  // inplace=false: a peek() taken earlier survives the ring wrapping over
  // its row, as with inferno's out-of-place writes.
  FoldReducer outOfPlace(reducerKind("PassthroughReducer"), 1.0, 2.0, false, false); // N = 2
  outOfPlace.forward({scalar(1)});
  const at::Tensor kept = *outOfPlace.peek();
  outOfPlace.forward({scalar(2)});
  outOfPlace.forward({scalar(3)}); // overwrites the row of 1
  EXPECT_DOUBLE_EQ(kept.item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(outOfPlace.peek()->item<double>(), 3.0);

  FoldReducer inPlace(reducerKind("PassthroughReducer"), 1.0, 2.0, false, /*inplace=*/true);
  inPlace.forward({scalar(1)});
  const at::Tensor alias = *inPlace.peek();
  inPlace.forward({scalar(2)});
  inPlace.forward({scalar(3)});
  EXPECT_DOUBLE_EQ(alias.item<double>(), 3.0);
}

TEST(ReducerTensors, WritesInPlaceWhenNothingSeesTheDifference) {
  // inplace=false, but no view of the history is alive and no autograd is
  // involved: the push writes into the existing storage instead of copying
  // all N rows.
  FoldReducer r(reducerKind("EMAReducer"), 1.0, /*duration=*/8.0, false, false, {{"alpha", 0.5}});
  r.forward({at::ones({4})});
  r.forward({at::ones({4})});
  const void* before = r.storage().data_ptr();
  for (int i = 0; i < 10; ++i) {
    r.forward({at::ones({4})});
  }
  EXPECT_EQ(r.storage().data_ptr(), before);
}

TEST(ReducerTensors, AutogradFlowsThroughOutOfPlaceHistory) {
  FoldReducer r(reducerKind("EMAReducer"), 1.0, 1.0, false, false, {{"alpha", 0.5}});
  const at::Tensor x = at::ones({2}).requires_grad_(true);
  r.forward({x * 2});
  r.forward({x * 4});
  const at::Tensor s = *r.peek();
  ASSERT_TRUE(s.requires_grad());
  s.sum().backward();
  // s = 0.5 * 4x + 0.5 * 2x = 3x
  expectClose(x.grad(), vec({3, 3}));
}

TEST(ReducerScriptState, RoundTripKeepsHistoryAndConfig) {
  auto holder = c10::make_intrusive<ScriptReducer>(makeReducer(
      "EventReducer", 0.5, 1.0, true, false, {{"initial", kInf}}, Criterion::builtin("ge", 1.0)));
  FoldReducer& r = holder->fold();
  for (float v : {0.f, 1.f, 0.f, 0.f}) {
    r.forward({vec({v, 1 - v})});
  }
  const auto restored = ScriptReducer::fromState(holder->state(/*forSaving=*/true));
  FoldReducer& back = restored->fold();
  EXPECT_STREQ(back.kind(), "EventReducer");
  EXPECT_EQ(back.criterion()->repr(), "ge(1)");
  EXPECT_TRUE(back.inclusive());
  expectClose(*back.dump(), *r.dump());
  expectClose(*back.view(0.75), *r.view(0.75));
  back.forward({vec({1, 0})});
  r.forward({vec({1, 0})});
  expectClose(*back.dump(), *r.dump());

  // In place into an existing reducer of the same kind.
  auto other = c10::make_intrusive<ScriptReducer>(makeReducer(
      "EventReducer", 1.0, 0.0, false, false, {}, Criterion::builtin("gt")));
  other->loadState(holder->state(false));
  expectClose(*other->fold().dump(), *r.dump());
  EXPECT_DOUBLE_EQ(other->fold().stepTime(), 0.5);

  auto ema = c10::make_intrusive<ScriptReducer>(makeReducer("EMAReducer", 1.0, 0.0, false, false, {{"alpha", 0.5}}));
  expectValueError([&] { ema->loadState(holder->state(false)); }, {"EventReducer", "EMAReducer"});
}

TEST(ReducerScriptState, CustomCriterionCannotBeSaved) {
  auto holder = c10::make_intrusive<ScriptReducer>(makeReducer(
      "EventReducer", 1.0, 0.0, false, false, {},
      Criterion::custom([](const at::Tensor& x) { return x > 0; }, "<lambda>")));
  expectValueError([&] { holder->state(/*forSaving=*/true); }, {"callable", "built-in"});
  const auto state = holder->state(/*forSaving=*/false);
  EXPECT_EQ(std::get<7>(state), "custom");
  expectValueError([&] { ScriptReducer::fromState(state); }, {"custom"});
}

TEST(ReducerScriptState, ToleranceUnsetOnLoad) {
  const std::map<std::string, double> params{{"time_constant", 1.0}, {"amplitude", 1.0}, {"target", 1.0}};
  auto exact = c10::make_intrusive<ScriptReducer>(makeReducer("NearestTraceReducer", 1.0, 0.0, false, false, params));
  auto withTolerance = params;
  withTolerance["tolerance"] = 0.5;
  auto tolerant = c10::make_intrusive<ScriptReducer>(makeReducer("NearestTraceReducer", 1.0, 0.0, false, false, withTolerance));
  tolerant->loadState(exact->state(false));
  EXPECT_EQ(tolerant->fold().params().count("tolerance"), 0u);
}

} // namespace
} // namespace torch_monitor::test
