// torch_monitor::Watch (watch/watch.h) and its recorder (watch/recorder.h):
// every statistic of every kind checked against values computed here with
// plain torch ops on copies of the observed tensors, over windows of steps;
// the device path (forced for CPU tensors) against the host path; the
// cadence, non-finite values, tied parameters and bad input.

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <torch_monitor/event_handler.h>
#include <torch_monitor/nn.h>
#include <torch_monitor/watch/statistics.h>
#include <torch_monitor/watch/watch.h>

#include "test_support.h"

namespace torch_monitor::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The statistics of one key over a window, computed from the observed
// tensors with torch ops in float64: what the watch must log.
struct Oracle {
  double elements = 0, nonFinite = 0, zeros = 0, sum = 0, squares = 0;
  double min = kInf, max = -kInf, absMax = -kInf, normSum = 0, normMax = -kInf;
  double observations = 0;
  double ratioSum = 0, ratioCount = 0;
  int64_t firstNonFinite = -1;

  void add(const torch::Tensor& t, int64_t step) {
    const auto x = t.detach().to(torch::kDouble).flatten();
    const auto finite = torch::isfinite(x);
    const auto f = x.masked_select(finite);
    elements += double(x.numel());
    const double bad = (~finite).sum().item<double>();
    nonFinite += bad;
    zeros += (x == 0).sum().item<double>();
    sum += f.sum().item<double>();
    const double sq = (f * f).sum().item<double>();
    squares += sq;
    normSum += std::sqrt(sq);
    normMax = std::max(normMax, std::sqrt(sq));
    observations += 1;
    if (f.numel() > 0) {
      min = std::min(min, f.min().item<double>());
      max = std::max(max, f.max().item<double>());
      absMax = std::max(absMax, f.abs().max().item<double>());
    }
    if (bad > 0 && firstNonFinite < 0) {
      firstNonFinite = step;
    }
  }
  void addUpdate(const torch::Tensor& after, const torch::Tensor& before, int64_t step) {
    const auto delta = after - before; // in the weights' dtype, as torch does
    add(delta, step);
    const double d = delta.to(torch::kDouble).norm().item<double>();
    const double b = before.to(torch::kDouble).norm().item<double>();
    if (std::isfinite(b) && b > 0) {
      ratioSum += d / b;
      ratioCount += 1;
    }
  }
  std::map<std::string, double> statistics(bool withRatio) const {
    const double finite = elements - nonFinite;
    std::map<std::string, double> s{
        {"rms", std::sqrt(squares / finite)},
        {"mean", sum / finite},
        // NaN where no element is finite, as the watch logs them.
        {"min", finite > 0 ? min : std::nan("")},
        {"max", finite > 0 ? max : std::nan("")},
        {"abs_max", finite > 0 ? absMax : std::nan("")},
        {"norm", normSum / observations},
        {"norm_max", normMax},
        {"nonfinite", nonFinite},
        {"zero_frac", zeros / elements}};
    if (withRatio) {
      s["ratio"] = ratioSum / ratioCount;
    }
    return s;
  }
};

double numberOf(const data_value_t& v) {
  if (const auto* d = std::get_if<double>(&v)) {
    return *d;
  }
  return double(std::get<int64_t>(v));
}

// Every key's statistics in `event` equal the oracles' (relative `tol`;
// infinities and NaN exactly).
void expectWindow(
    const Event& event,
    const std::map<std::string, Oracle>& oracles,
    double tol) {
  size_t expectedKeys = 0;
  for (const auto& [key, oracle] : oracles) {
    const bool update = key.size() > 7 && key.substr(key.size() - 7) == ".update";
    for (const auto& [statistic, want] : oracle.statistics(update)) {
      const std::string name = key + "." + statistic;
      ++expectedKeys;
      ASSERT_TRUE(event.data.count(name)) << name;
      const double got = numberOf(event.data.at(name));
      if (std::isfinite(want)) {
        EXPECT_NEAR(got, want, tol * std::max(1.0, std::fabs(want))) << name;
      } else { // inf, or NaN where no element defines the statistic
        EXPECT_TRUE(std::isnan(want) ? std::isnan(got) : got == want)
            << name << ": " << got << ", want " << want;
      }
    }
  }
  EXPECT_EQ(event.data.size(), expectedKeys);
}

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 5));
    fc2 = register_module("fc2", torch::nn::Linear(5, 2));
  }
  // Submodules called through nn::call run their forward hooks.
  torch::Tensor forward(const torch::Tensor& x) {
    return nn::call(fc2, torch::tanh(nn::call(fc1, x)));
  }
  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};

// Runs `steps` training steps of `net` watched with windows of `window`
// steps, and checks every window against oracles fed the same tensors.
void trainAndCheck(int64_t steps, int64_t window, double tol) {
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ScopedRecorder recorder;
  WatchOptions options;
  options.what = {"grad", "weight", "update", "output", "output_grad"};
  options.windowSteps = window;
  Watch watch(net, options);

  // The oracles' inputs: outputs and their gradients through hooks of our
  // own (registered after the watch's, removed at the end).
  std::vector<std::map<std::string, Oracle>> windows(1);
  int64_t current = 0;
  std::vector<nn::HookHandle> hooks; // removed at the end (the registry is global)
  for (const auto& [path, module] : std::vector<std::pair<std::string, torch::nn::Module*>>{
           {"fc1", net->fc1.get()}, {"fc2", net->fc2.get()}}) {
    hooks.push_back(nn::registerForwardHook(
        *module,
        [&, path = path](torch::nn::Module&, const nn::ForwardArgs&, nn::ForwardOutput& out) {
          const torch::Tensor y = out.get<torch::Tensor>();
          windows.back()[path + ".output"].add(y.clone(), current);
          y.register_hook([&, path](const torch::Tensor& g) {
            windows.back()[path + ".output_grad"].add(g.clone(), current);
          });
        }));
  }
  torch::Tensor x = torch::randn({8, 4});
  torch::Tensor target = torch::randn({8, 2});
  for (int64_t step = 0; step < steps; ++step) {
    if (step > 0 && step % window == 0) {
      windows.emplace_back();
    }
    current = step;
    setStep(step);
    optimizer.zero_grad();
    torch::mse_loss(net->forward(x), target).backward();
    std::map<std::string, torch::Tensor> before;
    std::vector<torch::Tensor> grads; // total.grad: all of them, as one
    for (const auto& p : net->named_parameters()) {
      windows.back()[p.key() + ".grad"].add(p.value().grad().clone(), step);
      grads.push_back(p.value().grad().flatten());
      before[p.key()] = p.value().detach().clone();
    }
    windows.back()["total.grad"].add(torch::cat(grads), step);
    watch.step(optimizer);
    std::vector<torch::Tensor> afters, befores; // total.update: all, as one
    for (const auto& p : net->named_parameters()) {
      windows.back()[p.key() + ".weight"].add(p.value().detach().clone(), step);
      windows.back()[p.key() + ".update"].addUpdate(p.value().detach(), before[p.key()], step);
      afters.push_back(p.value().detach().flatten());
      befores.push_back(before[p.key()].flatten());
    }
    windows.back()["total.update"].addUpdate(torch::cat(afters), torch::cat(befores), step);
  }
  watch.remove(); // logs the last window
  for (auto& hook : hooks) {
    hook.remove();
  }
  const auto events = recorder->eventsNamed(watch::kEventName);
  ASSERT_EQ(events.size(), windows.size());
  for (size_t w = 0; w < windows.size(); ++w) {
    SCOPED_TRACE("window " + std::to_string(w));
    expectWindow(events[w], windows[w], tol);
    // A window closes at the step that ends it; the last one at remove(),
    // one step after the last (never on the step of the window before).
    const int64_t closedAt = w + 1 < windows.size() ? int64_t(w + 1) * window : steps;
    EXPECT_EQ(events[w].step, closedAt);
  }
  EXPECT_TRUE(recorder->eventsNamed(watch::kNonFiniteEventName).empty());
  clearStep();
}

TEST(Watch, EveryKindAndStatisticEqualsTorchOpsOverWindows) {
  trainAndCheck(/*steps=*/5, /*window=*/2, /*tol=*/1e-12);
}

TEST(Watch, AStepWithAClosureObservesTheGradientsItsLastCallLeft) {
  // LBFGS computes the gradients in its step, calling the closure several
  // times: the watch observes them as the step left them, and the update
  // across the whole step, from the first step on (before it, no
  // parameter has a gradient).
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  torch::optim::LBFGS optimizer(net->parameters(), torch::optim::LBFGSOptions(0.5).max_iter(3));
  ScopedRecorder recorder;
  WatchOptions options;
  options.what = {"grad", "update"};
  options.windowSteps = 1;
  Watch watch(net, options);
  const torch::Tensor x = torch::randn({8, 4});
  const torch::Tensor target = torch::randn({8, 2});
  std::vector<std::map<std::string, Oracle>> windows;
  for (int64_t step = 0; step < 2; ++step) {
    setStep(step);
    std::map<std::string, torch::Tensor> before;
    for (const auto& p : net->named_parameters()) {
      before[p.key()] = p.value().detach().clone();
    }
    int calls = 0;
    watch.step(optimizer, [&] {
      ++calls;
      optimizer.zero_grad();
      torch::Tensor loss = torch::mse_loss(net->forward(x), target);
      loss.backward();
      return loss;
    });
    EXPECT_GT(calls, 1);
    auto& window = windows.emplace_back();
    std::vector<torch::Tensor> grads, afters, befores;
    for (const auto& p : net->named_parameters()) {
      window[p.key() + ".grad"].add(p.value().grad().clone(), step);
      window[p.key() + ".update"].addUpdate(p.value().detach(), before[p.key()], step);
      grads.push_back(p.value().grad().flatten());
      afters.push_back(p.value().detach().flatten());
      befores.push_back(before[p.key()].flatten());
    }
    window["total.grad"].add(torch::cat(grads), step);
    window["total.update"].addUpdate(torch::cat(afters), torch::cat(befores), step);
  }
  watch.remove();
  const auto events = recorder->eventsNamed(watch::kEventName);
  ASSERT_EQ(events.size(), windows.size());
  for (size_t w = 0; w < windows.size(); ++w) {
    SCOPED_TRACE("window " + std::to_string(w));
    expectWindow(events[w], windows[w], 1e-12);
  }
  clearStep();
}

TEST(Watch, DevicePathGivesTheSameStatistics) {
  // CPU tensors through the path CUDA tensors take: rows computed with
  // ATen ops and merged under the device-side gate.
  test_hooks::setCpuTensorsTakeDevicePath(true);
  trainAndCheck(/*steps=*/5, /*window=*/2, /*tol=*/1e-9);
  test_hooks::setCpuTensorsTakeDevicePath(false);
}

// The host scan (a short pass for tensors whose elements are all finite,
// an exact rescan of a part that has one that is not) against the oracle:
// sizes around its blocks of 64 and its chunks of 65,536, every floating
// dtype, gradients and updates, non-finite elements at the start, inside
// a block and in the tail, zeros, and squares past float64's range.
TEST(Watch, TheHostScanEqualsTorchOpsAtEverySizeDtypeAndNonFiniteElement) {
  torch::manual_seed(0);
  const double kNaN = std::numeric_limits<double>::quiet_NaN();
  enum Variant { kRandom, kZeros, kNaNFirst, kInfInBlock, kNaNLast, kHuge };
  for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    for (const int64_t n : {1, 15, 16, 63, 64, 65, 1000, 65536 + 100, 3 * 65536 + 7}) {
      for (const Variant variant : {kRandom, kZeros, kNaNFirst, kInfInBlock, kNaNLast, kHuge}) {
        for (const bool update : {false, true}) {
          SCOPED_TRACE(
              std::string(c10::toString(dtype)) + " n=" + std::to_string(n) +
              " variant=" + std::to_string(int(variant)) + (update ? " update" : ""));
          auto x = torch::randn({n}, torch::kDouble);
          if (variant == kZeros) {
            x.slice(0, 0, n, 3).zero_();
          } else if (variant == kNaNFirst) {
            x[0] = kNaN;
          } else if (variant == kInfInBlock) {
            x[n / 2] = -kInf;
          } else if (variant == kNaNLast) {
            x[n - 1] = kNaN;
          } else if (variant == kHuge && dtype == torch::kDouble) {
            if (update) {
              continue; // a weight of 1e200 has no ratio here (its square is inf)
            }
            x.mul_(1e200); // squares overflow float64
          }
          const auto after = x.to(dtype);
          const auto before = (after.to(torch::kDouble) -
                               0.01 * torch::randn({n}, torch::kDouble))
                                  .to(dtype);
          double row[watch::column::kColumns];
          watch::fillIdentity(row);
          watch::observeOnHost(row, after, update ? &before : nullptr, 7);
          Oracle oracle;
          if (update) {
            oracle.addUpdate(after, before, 7);
          } else {
            oracle.add(after, 7);
          }
          Event event;
          const std::string key = update ? "k.update" : "k.grad";
          watch::appendStatistics(event.data, key, row, update);
          expectWindow(event, {{key, oracle}}, 1e-12);
          EXPECT_EQ(
              watch::firstNonFiniteStep(row),
              oracle.firstNonFinite < 0 ? watch::column::kNoStep : 7);
        }
      }
    }
  }
}

std::shared_ptr<watch::Recorder> makeRecorder(
    std::vector<std::string> paths,
    watch::Kind kind,
    int64_t windowSteps,
    int64_t every = 1) {
  std::vector<watch::Key> keys;
  for (auto& p : paths) {
    keys.push_back(watch::Key{p, kind});
  }
  watch::RecorderOptions options;
  options.windowSteps = windowSteps;
  options.every = every;
  return watch::Recorder::create(keys, options, c10::Device(c10::DeviceType::CPU));
}

void observe(watch::Recorder& r, const torch::Tensor& t, int64_t key = 0) {
  r.observe(r.slots(), r.gate(), {t}, {key}, {});
}

TEST(Watch, NonFiniteValuesAreCountedAndNamedWithTheirFirstStep) {
  for (bool devicePath : {false, true}) {
    SCOPED_TRACE(devicePath ? "device path" : "host path");
    test_hooks::setCpuTensorsTakeDevicePath(devicePath);
    ScopedRecorder recorder;
    auto r = makeRecorder({"a", "b"}, watch::Kind::Output, 10);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    setStep(0);
    observe(*r, torch::tensor({1.0, 2.0}), 0);
    observe(*r, torch::tensor({1.0, 2.0}), 1);
    setStep(3);
    observe(*r, torch::tensor({nan, 4.0, kInf}), 0);
    setStep(4);
    observe(*r, torch::tensor({-kInf, 0.0}), 0);
    observe(*r, torch::tensor({nan, nan}), 1); // no finite element at all
    setStep(10); // closes [0, 10)
    test_hooks::setCpuTensorsTakeDevicePath(false);
    const auto stats = recorder->eventsNamed(watch::kEventName);
    const auto bad = recorder->eventsNamed(watch::kNonFiniteEventName);
    ASSERT_EQ(stats.size(), 1u);
    // Each key once per window, at the step change after its first
    // non-finite step (a's at 4), or at the close if that comes first
    // (b's: the window closed at the step change after step 4).
    ASSERT_EQ(bad.size(), 2u);
    EXPECT_EQ(bad[0].step, 4);
    EXPECT_EQ(bad[0].data.size(), 1u);
    EXPECT_EQ(std::get<int64_t>(bad[0].data.at("a.output")), 3);
    EXPECT_EQ(bad[1].step, 10);
    EXPECT_EQ(bad[1].data.size(), 1u);
    EXPECT_EQ(std::get<int64_t>(bad[1].data.at("b.output")), 4);
    const auto& d = stats[0].data;
    EXPECT_EQ(std::get<int64_t>(d.at("a.output.nonfinite")), 3);
    EXPECT_DOUBLE_EQ(numberOf(d.at("a.output.mean")), (1 + 2 + 4 + 0) / 4.0);
    EXPECT_DOUBLE_EQ(numberOf(d.at("a.output.max")), 4.0);
    EXPECT_DOUBLE_EQ(numberOf(d.at("a.output.zero_frac")), 1 / 7.0);
    // norm: the mean of the observations' norms of finite elements.
    EXPECT_DOUBLE_EQ(
        numberOf(d.at("a.output.norm")), (std::sqrt(5.0) + 4.0 + 0.0) / 3.0);
    EXPECT_EQ(std::get<int64_t>(d.at("b.output.nonfinite")), 2);
    EXPECT_DOUBLE_EQ(numberOf(d.at("b.output.max")), 2.0);
    r->remove();
  }
  clearStep();
}

TEST(Watch, OnNonFiniteRaiseThrowsFromSetStepAfterEveryListenerRan) {
  struct Collect final : EventHandler {
    std::vector<Event> events;
    void handle(const Event& event) override {
      events.push_back(event);
    }
  };
  ScopedRecorder recorder;
  watch::RecorderOptions options;
  options.windowSteps = 10;
  options.onNonFinite = watch::OnNonFinite::Raise;
  auto raising = watch::Recorder::create(
      {watch::Key{"x", watch::Kind::Output}},
      options,
      c10::Device(c10::DeviceType::CPU));
  auto handler = std::make_shared<Collect>();
  raising->setNonFiniteHandler(handler);
  // Told after the raising one: its window must still close at step 5.
  auto other = makeRecorder({"y"}, watch::Kind::Output, 5);
  setStep(3);
  observe(*raising, torch::tensor({1.0, std::nan("")}));
  observe(*other, torch::tensor({1.0}));
  try {
    setStep(5);
    FAIL() << "setStep(5) did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        e.msg().find("torch_monitor.watch: NaN or inf in 1 watched tensor: "
                     "x.output (first at step 3)"),
        std::string::npos)
        << e.msg();
  }
  ASSERT_EQ(handler->events.size(), 1u);
  EXPECT_EQ(handler->events[0].step, 5);
  EXPECT_EQ(recorder->eventsNamed(watch::kNonFiniteEventName).size(), 1u);
  EXPECT_EQ(recorder->eventsNamed(watch::kEventName).size(), 1u); // y's
  setStep(6); // reported once per window
  raising->remove();
  other->remove();
  clearStep();
}

TEST(Watch, EveryObservesOnlyStepsDivisibleByIt) {
  for (bool devicePath : {false, true}) {
    test_hooks::setCpuTensorsTakeDevicePath(devicePath);
    ScopedRecorder recorder;
    auto r = makeRecorder({"x"}, watch::Kind::Output, 6, /*every=*/3);
    for (int64_t step = 0; step < 6; ++step) {
      setStep(step);
      observe(*r, torch::full({2}, double(step)));
    }
    setStep(6);
    test_hooks::setCpuTensorsTakeDevicePath(false);
    const auto events = recorder->eventsNamed(watch::kEventName);
    ASSERT_EQ(events.size(), 1u);
    // Steps 0 and 3 only: mean 1.5, max 3, two observations of norm
    // sqrt(2)*step.
    EXPECT_DOUBLE_EQ(numberOf(events[0].data.at("x.output.mean")), 1.5);
    EXPECT_DOUBLE_EQ(numberOf(events[0].data.at("x.output.max")), 3.0);
    EXPECT_DOUBLE_EQ(
        numberOf(events[0].data.at("x.output.norm")), 3.0 * std::sqrt(2.0) / 2);
    r->remove();
  }
  clearStep();
}

TEST(Watch, AWindowClosesAcrossSkippedStepsAndEmptyWindowsLogNothing) {
  ScopedRecorder recorder;
  auto r = makeRecorder({"x"}, watch::Kind::Output, 4);
  setStep(1);
  observe(*r, torch::ones({3}));
  setStep(13); // jumps over windows [4, 8) and [8, 12)
  observe(*r, torch::full({3}, 2.0));
  r->remove();
  const auto events = recorder->eventsNamed(watch::kEventName);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].step, 13);
  EXPECT_DOUBLE_EQ(numberOf(events[0].data.at("x.output.mean")), 1.0);
  EXPECT_EQ(events[1].step, 14); // closed by remove(): one after the last step
  EXPECT_DOUBLE_EQ(numberOf(events[1].data.at("x.output.mean")), 2.0);
  clearStep();
}

struct Tied : torch::nn::Module {
  Tied() {
    a = register_module("a", torch::nn::Linear(torch::nn::LinearOptions(3, 3).bias(false)));
    // The same tensor under a second name; the root's own parameters come
    // first in named_parameters(), so "tied" is its first name.
    tied = register_parameter("tied", a->weight);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::matmul(a->forward(x), tied.t());
  }
  torch::nn::Linear a{nullptr};
  torch::Tensor tied;
};

TEST(Watch, TiedParametersAreWatchedOnceUnderTheirFirstName) {
  auto net = std::make_shared<Tied>();
  WatchOptions options;
  options.what = {"grad"};
  options.windowSteps = 10;
  Watch watch(net, options);
  EXPECT_EQ(watch.keys(), (std::vector<std::string>{"tied.grad", "total.grad"}));
  ScopedRecorder recorder;
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  setStep(0);
  net->forward(torch::randn({2, 3})).sum().backward();
  const auto grad = net->tied.grad().clone(); // both uses, summed
  watch.step(optimizer);
  watch.remove();
  const auto events = recorder->eventsNamed(watch::kEventName);
  ASSERT_EQ(events.size(), 1u);
  Oracle o;
  o.add(grad, 0);
  // The total of one gradient is that gradient.
  std::map<std::string, Oracle> want{{"tied.grad", o}, {"total.grad", o}};
  expectWindow(events[0], want, 1e-12);
  clearStep();
}

// The default, as Python's: gradients only, the kind cheap enough to leave
// on (docs/watch.md, "Cost"); updates are asked for.
TEST(Watch, TheDefaultWatchesGradientsOnly) {
  auto net = std::make_shared<Net>();
  WatchOptions options;
  options.windowSteps = 10;
  Watch watch(net, options);
  EXPECT_EQ(
      watch.keys(),
      (std::vector<std::string>{
          "fc1.weight.grad", "fc1.bias.grad", "fc2.weight.grad", "fc2.bias.grad", "total.grad"}));
}

TEST(Watch, CppOptionsForNonFiniteValuesAndTimedWindowsReachTheRecorder) {
  struct Collect final : EventHandler {
    std::vector<Event> events;
    void handle(const Event& event) override {
      events.push_back(event);
    }
  };
  auto net = std::make_shared<Tied>();
  auto handler = std::make_shared<Collect>();
  WatchOptions options;
  options.what = {"grad"};
  options.windowSteps = 10;
  options.onNonFinite = watch::OnNonFinite::Raise;
  options.onNonFiniteHandler = handler;
  Watch watch(net, options);
  ScopedRecorder recorder;
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  setStep(0);
  net->forward(torch::full({2, 3}, std::nan(""))).sum().backward();
  watch.step(optimizer);
  EXPECT_THROW(setStep(1), c10::Error);
  ASSERT_EQ(handler->events.size(), 1u);
  EXPECT_EQ(std::get<int64_t>(handler->events[0].data.at("tied.grad")), 0);
  watch.remove();
  clearStep();

  WatchOptions timed;
  timed.what = {"grad"};
  timed.windowSize = std::chrono::seconds(1);
  timed.closeOnTime = true;
  EXPECT_TRUE(Watch(net, timed).recorder()->options().closeOnTime);
  timed.windowSize = std::chrono::milliseconds(0);
  timed.windowSteps = 10;
  try {
    Watch refused(net, timed);
    FAIL() << "close_on_time with window_steps was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(
        std::string(e.what_without_backtrace()).find("close_on_time closes time windows"),
        std::string::npos);
  }
}

TEST(Watch, BadInputIsRefusedNamingTheProblem) {
  auto net = std::make_shared<Net>();
  auto message = [&](WatchOptions o) -> std::string {
    try {
      Watch w(net, o);
    } catch (const c10::ValueError& e) {
      return e.what_without_backtrace();
    }
    return "";
  };
  WatchOptions o;
  o.windowSteps = 10;
  o.what = {"grads"};
  EXPECT_NE(message(o).find("unknown kind 'grads'"), std::string::npos);
  o.what = {"grad"};
  o.include = "conv";
  EXPECT_NE(message(o).find("include='conv' matches no parameter path"), std::string::npos);
  o.include.reset();
  o.exclude = "nothing";
  EXPECT_NE(message(o).find("exclude='nothing' matches no"), std::string::npos);
  o.exclude.reset();
  o.windowSteps = 0;
  EXPECT_NE(message(o).find("exactly one window"), std::string::npos);
  o.windowSteps = 5;
  o.windowSize = std::chrono::seconds(1);
  EXPECT_NE(message(o).find("both"), std::string::npos);
  o.windowSize = std::chrono::milliseconds(0);
  o.histogramsEvery = 10;
  EXPECT_NE(message(o).find("needs a writer"), std::string::npos);
}

TEST(Watch, PathsMustBeTextAndEachKeyIsGivenOnce) {
  // A NUL would reach every sink (a C API truncates there), and a key given
  // twice would have two observers write one row.
  const auto output = watch::Kind::Output;
  expectValueError(
      [&] { makeRecorder({"fc1", std::string("fc\0x", 4)}, output, 10); },
      {"the path of key 1", "NUL byte at index 2"});
  expectValueError(
      [&] { makeRecorder({"fc\xff"}, output, 10); }, {"not valid UTF-8"});
  expectValueError(
      [&] { makeRecorder({""}, output, 10); }, {"the path of key 0 is empty"});
  expectValueError(
      [&] { makeRecorder({"fc1", "fc2", "fc1"}, output, 10); },
      {"'fc1.output' is given twice (keys 0 and 2)"});
  // One path under two kinds is two keys.
  watch::RecorderOptions options;
  options.windowSteps = 10;
  auto r = watch::Recorder::create(
      {watch::Key{"fc1", watch::Kind::Output},
       watch::Key{"fc1", watch::Kind::OutputGrad}},
      options,
      c10::Device(c10::DeviceType::CPU));
  r->remove();
  expectValueError(
      [&] {
        watch::Recorder::create(
            {watch::Key{"fc1", output}}, options, c10::Device("meta"));
      },
      {"meta device"});
}

TEST(Watch, ItsShapeNamesEverythingRanksMustShare) {
  // What rank 0 compares before it merges a rank's windows (and prints
  // when it refuses them): the keys, the window, the cadence, memory=.
  auto a = makeRecorder({"fc1", "fc2"}, watch::Kind::Output, 4);
  auto b = makeRecorder({"fc1", "fc2"}, watch::Kind::Output, 8);
  auto c = makeRecorder({"fc1", "fc2"}, watch::Kind::Output, 4, /*every=*/2);
  auto d = makeRecorder({"fc1", "fc3"}, watch::Kind::Output, 4);
  auto same = makeRecorder({"fc1", "fc2"}, watch::Kind::Output, 4);
  EXPECT_EQ(a->shape(), same->shape());
  for (const auto& other : {b, c, d}) {
    EXPECT_NE(a->shape(), other->shape());
  }
  EXPECT_NE(a->shape().find("window_steps=4, every=1"), std::string::npos)
      << a->shape();
  EXPECT_NE(b->shape().find("window_steps=8"), std::string::npos);
  EXPECT_NE(c->shape().find("every=2"), std::string::npos);
  watch::RecorderOptions timed;
  timed.windowSize = std::chrono::seconds(2);
  timed.memory = true;
  auto t = watch::Recorder::create(
      {watch::Key{"fc1", watch::Kind::Output}},
      timed,
      c10::Device(c10::DeviceType::CPU));
  EXPECT_NE(t->shape().find("window_size=2000 ms"), std::string::npos);
  EXPECT_NE(t->shape().find("memory=True"), std::string::npos);
  for (const auto& r : {a, b, c, d, same, t}) {
    r->remove();
  }
}

TEST(Watch, IncludeAndExcludeSelectKeysByPath) {
  auto net = std::make_shared<Net>();
  WatchOptions o;
  o.windowSteps = 10;
  o.what = {"grad", "output"};
  o.include = "fc2";
  o.exclude = "bias";
  Watch w(net, o);
  EXPECT_EQ(
      w.keys(),
      (std::vector<std::string>{"fc2.weight.grad", "total.grad", "fc2.output"}));
}

TEST(Watch, FrozenParametersAreNotWatchedAsInPython) {
  auto net = std::make_shared<Net>();
  net->fc1->weight.set_requires_grad(false);
  WatchOptions o;
  o.windowSteps = 10;
  o.what = {"update", "grad"}; // slots in kind order whatever the order here
  Watch w(net, o);
  EXPECT_EQ(
      w.keys(),
      (std::vector<std::string>{
          "fc1.bias.grad", "fc2.weight.grad", "fc2.bias.grad", "total.grad",
          "fc1.bias.update", "fc2.weight.update", "fc2.bias.update",
          "total.update"}));
  o.include = "fc1.weight";
  try {
    Watch frozen(net, o);
    ADD_FAILURE() << "a watch of frozen parameters only was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(
        std::string(e.what_without_backtrace())
            .find("no parameter is selected that requires grad"),
        std::string::npos)
        << e.what_without_backtrace();
  }
}

// A model whose submodules return tuples, as nn::LSTM (tuple<Tensor,
// tuple<Tensor, Tensor>>) and nn::MultiheadAttention (a pair) do, and one
// whose output is an integer tensor: the same model as Python's
// test_outputs_of_tuples_observe_their_first_tensor.
struct Sequence : torch::nn::Module {
  Sequence() {
    lstm = register_module("lstm", torch::nn::LSTM(3, 4));
    attention = register_module(
        "attention", torch::nn::MultiheadAttention(4, 2));
    argmax = register_module("argmax", torch::nn::Functional([](const torch::Tensor& x) {
      return x.argmax(-1);
    }));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto [out, state] = nn::call(lstm, x);
    auto [attended, weights] = nn::call(attention, out, out, out);
    nn::call(argmax, attended);
    return attended;
  }
  torch::nn::LSTM lstm{nullptr};
  torch::nn::MultiheadAttention attention{nullptr};
  torch::nn::Functional argmax{nullptr};
};

TEST(Watch, OutputsOfTuplesObserveTheirFirstTensor) {
  torch::manual_seed(0);
  auto model = std::make_shared<Sequence>();
  ScopedRecorder recorder;
  WatchOptions o;
  o.windowSteps = 1;
  o.what = {"output"};
  Watch w(model, o);
  setStep(0);
  const torch::Tensor x = torch::randn({5, 2, 3});
  auto [out, state] = model->lstm->forward(x);
  auto [attended, weights] = model->attention->forward(out, out, out);
  model->forward(x);
  setStep(1); // closes the window
  const auto events = recorder->eventsNamed(watch::kEventName);
  ASSERT_EQ(events.size(), 1u);
  const auto& data = events[0].data;
  // The first element of each tuple; nothing of an integer output.
  EXPECT_NEAR(
      std::get<double>(data.at("lstm.output.max")),
      out.max().item<double>(),
      1e-12);
  EXPECT_NEAR(
      std::get<double>(data.at("attention.output.max")),
      attended.max().item<double>(),
      1e-12);
  EXPECT_EQ(data.count("argmax.output.max"), 0u);
  clearStep();
}

} // namespace
} // namespace torch_monitor::test
