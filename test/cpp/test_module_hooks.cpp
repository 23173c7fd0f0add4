// Forward hooks for C++ modules (torch_monitor/nn.h): order, arguments and
// output, removal (also from inside a hook), module lifetime, train/eval
// gating, attribute paths, and DifferenceMonitors attached to a Linear's
// weight and to a nested buffer that forward() updates in place.
//
// The hook registry is process-global: every test removes what it registers
// (Scoped guards do it even when an assertion fails), and checks are made
// against hooks of the test's own modules only.

#include <atomic>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <torch_monitor/nn.h>

#include "test_nn_support.h"
#include "test_support.h"

namespace torch_monitor {
namespace {

namespace tnn = torch_monitor::nn;
using test::expectValueError;
using test::ScopedHook;

// forward() with several arguments of different types, a default argument
// and an overload; records every call into a shared log.
struct LoggingImpl : torch::nn::Module {
  explicit LoggingImpl(std::shared_ptr<std::vector<std::string>> log)
      : log(std::move(log)) {}
  at::Tensor forward(const at::Tensor& x, double scale = 2.0) {
    this->log->push_back("forward");
    return x * scale;
  }
  std::string forward(const std::string& a, std::string&& b, int n) {
    this->log->push_back("forward(str)");
    return a + b + std::to_string(n);
  }
  std::shared_ptr<std::vector<std::string>> log;
};

// Nothing in, nothing out.
struct VoidImpl : torch::nn::Module {
  void forward() {
    ++calls;
  }
  int calls = 0;
};

struct ThrowingImpl : torch::nn::Module {
  int forward(int) {
    throw std::out_of_range("forward failed");
  }
};

// A submodule with a registered state buffer, updated in place by forward().
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    state = register_buffer("state", at::zeros({3}));
    lin = register_module("lin", torch::nn::Linear(3, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    state.mul_(0.5).add_(x.sum(0)); // leaky integration, in place
    return lin(x);
  }
  at::Tensor state;
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(Block);

// A model with a nested buffer "block.state", a parameter "gain", a buffer
// "count", a Linear "fc" whose weight forward() moves in place (a local
// learning rule, no optimizer), and an undefined buffer "pending" (which
// torch::nn::Module does not list).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    gain = register_parameter("gain", at::ones({1}));
    count = register_buffer("count", at::zeros({}));
    pending = register_buffer("pending", at::Tensor());
    block = register_module("block", Block());
    fc = register_module("fc", torch::nn::Linear(3, 2));
  }
  at::Tensor forward(const at::Tensor& x) {
    count.add_(1);
    const at::Tensor h = block(x) * gain;
    const at::Tensor y = fc(h);
    if (learn) {
      at::NoGradGuard noGrad;
      // delta = lr * y^T h: a Hebbian step, deterministic given the inputs.
      lastDelta = 0.01 * y.t().mm(h);
      fc->weight.add_(lastDelta);
    }
    return y;
  }
  at::Tensor gain, count, pending, lastDelta;
  Block block{nullptr};
  torch::nn::Linear fc{nullptr};
  bool learn = true;
};
TORCH_MODULE(Net);

std::shared_ptr<std::vector<std::string>> newLog() {
  return std::make_shared<std::vector<std::string>>();
}

// ------------------------------------------------------------ call()

TEST(ModuleHooks, CallWithoutHooksIsForward) {
  auto log = newLog();
  auto m = std::make_shared<LoggingImpl>(log);
  const at::Tensor x = at::arange(3, at::kFloat);
  EXPECT_TRUE(at::equal(tnn::call(m, x), x * 2.0));
  EXPECT_TRUE(at::equal(tnn::call(m, x, 3.0), x * 3.0));
  EXPECT_EQ(tnn::call(m, std::string("a"), std::string("b"), 7), "ab7");
  EXPECT_EQ(*log, (std::vector<std::string>{"forward", "forward", "forward(str)"}));
}

TEST(ModuleHooks, PreAndPostHooksRunInOrderAroundForward) {
  auto log = newLog();
  auto m = std::make_shared<LoggingImpl>(log);
  auto pre = [log](const std::string& name) {
    return [log, name](torch::nn::Module&, const tnn::ForwardArgs&) {
      log->push_back(name);
    };
  };
  auto post = [log](const std::string& name) {
    return [log, name](
               torch::nn::Module&, const tnn::ForwardArgs&, tnn::ForwardOutput&) {
      log->push_back(name);
    };
  };
  ScopedHook a{tnn::registerForwardPreHook(m, pre("pre1"))};
  ScopedHook b{tnn::registerForwardHook(m, post("post1"))};
  ScopedHook c{tnn::registerForwardPreHook(m, pre("pre2"))};
  ScopedHook d{tnn::registerForwardHook(m, post("post2"))};
  ScopedHook e{tnn::registerForwardPreHook(m, pre("pre0"), /*prepend=*/true)};
  ScopedHook f{tnn::registerForwardHook(m, post("post0"), /*prepend=*/true)};

  tnn::call(m, at::ones({2}));
  EXPECT_EQ(
      *log,
      (std::vector<std::string>{
          "pre0", "pre1", "pre2", "forward", "post0", "post1", "post2"}));

  // forward() called directly bypasses the hooks (C++ forward is not
  // virtual): that is why call() exists.
  log->clear();
  m->forward(at::ones({2}));
  EXPECT_EQ(*log, (std::vector<std::string>{"forward"}));
}

TEST(ModuleHooks, HooksSeeArgumentsAndMayChangeTheOutput) {
  auto log = newLog();
  auto m = std::make_shared<LoggingImpl>(log);
  std::vector<std::string> seen;
  ScopedHook pre{tnn::registerForwardPreHook(
      m, [&](torch::nn::Module& mod, const tnn::ForwardArgs& args) {
        EXPECT_EQ(&mod, m.get());
        seen.push_back(std::to_string(args.size()));
        if (const auto* s = args.getIf<std::string>(0)) {
          seen.push_back(*s + args.get<std::string>(1) +
                         std::to_string(args.get<int>(2)));
        } else {
          EXPECT_EQ(args.type(0), typeid(at::Tensor));
          seen.push_back(std::to_string(args.get<at::Tensor>(0).sum().item<float>()));
          EXPECT_EQ(args.getIf<double>(0), nullptr);
          EXPECT_EQ(args.getIf<at::Tensor>(5), nullptr);
        }
      })};
  ScopedHook post{tnn::registerForwardHook(
      m,
      [&](torch::nn::Module&, const tnn::ForwardArgs& args,
          tnn::ForwardOutput& out) {
        ASSERT_TRUE(out.hasValue());
        if (auto* t = out.getIf<at::Tensor>()) {
          *t = *t + 100; // replaces what call() returns
          if (args.size() == 2) {
            seen.push_back("scale " + std::to_string(args.get<double>(1)));
          }
        } else {
          out.get<std::string>() += "!";
        }
      })};

  const at::Tensor x = at::ones({2});
  EXPECT_TRUE(at::equal(tnn::call(m, x), x * 2 + 100));
  EXPECT_TRUE(at::equal(tnn::call(m, x, 0.5), x * 0.5 + 100));
  std::string a = "a";
  EXPECT_EQ(tnn::call(m, a, std::string("b"), 3), "ab3!");
  EXPECT_EQ(
      seen,
      (std::vector<std::string>{
          "1", "2.000000", "2", "2.000000", "scale 0.500000", "3", "ab3"}));
}

TEST(ModuleHooks, WrongArgumentTypeOrIndexIsAClearError) {
  auto m = std::make_shared<LoggingImpl>(newLog());
  ScopedHook pre{tnn::registerForwardPreHook(
      m, [](torch::nn::Module&, const tnn::ForwardArgs& args) {
        EXPECT_THROW(args.get<double>(0), c10::TypeError);
        EXPECT_THROW(args.get<at::Tensor>(1), c10::IndexError);
        try {
          args.get<double>(0);
        } catch (const c10::TypeError& e) {
          const std::string msg = e.what_without_backtrace();
          EXPECT_NE(msg.find("forward argument 0 is a at::Tensor, not a double"),
                    std::string::npos)
              << msg;
        }
      })};
  ScopedHook post{tnn::registerForwardHook(
      m,
      [](torch::nn::Module&, const tnn::ForwardArgs&, tnn::ForwardOutput& out) {
        EXPECT_THROW(out.get<std::string>(), c10::TypeError);
        EXPECT_EQ(out.type(), typeid(at::Tensor));
      })};
  tnn::call(m, at::ones({1}));
}

TEST(ModuleHooks, VoidForwardWithoutArguments) {
  auto m = std::make_shared<VoidImpl>();
  int pre = 0;
  int post = 0;
  ScopedHook a{tnn::registerForwardPreHook(
      m, [&](torch::nn::Module&, const tnn::ForwardArgs& args) {
        EXPECT_EQ(args.size(), 0u);
        EXPECT_EQ(m->calls, 0);
        ++pre;
      })};
  ScopedHook b{tnn::registerForwardHook(
      m,
      [&](torch::nn::Module&, const tnn::ForwardArgs&, tnn::ForwardOutput& out) {
        EXPECT_FALSE(out.hasValue());
        EXPECT_THROW(out.type(), c10::ValueError);
        EXPECT_EQ(m->calls, 1);
        ++post;
      })};
  tnn::call(*m); // a reference to a shared-owned module works too
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post, 1);
}

TEST(ModuleHooks, HolderSharedPtrAndReferenceReachTheSameHooks) {
  torch::nn::Linear linear(2, 2);
  int calls = 0;
  ScopedHook h{tnn::registerForwardPreHook(
      linear, [&](torch::nn::Module& mod, const tnn::ForwardArgs&) {
        EXPECT_EQ(&mod, linear.get());
        ++calls;
      })};
  const at::Tensor x = at::ones({1, 2});
  const torch::nn::Linear& constHolder = linear;
  std::shared_ptr<torch::nn::LinearImpl> ptr = linear.ptr();
  const at::Tensor expected = linear->forward(x);
  EXPECT_TRUE(at::equal(tnn::call(linear, x), expected));
  EXPECT_TRUE(at::equal(tnn::call(constHolder, x), expected));
  EXPECT_TRUE(at::equal(tnn::call(ptr, x), expected));
  EXPECT_TRUE(at::equal(tnn::call(*ptr, x), expected));
  EXPECT_EQ(calls, 4);
  // Registered through a base-class reference: the same module.
  torch::nn::Module& base = *linear;
  ScopedHook h2{tnn::registerForwardPreHook(
      base, [&](torch::nn::Module&, const tnn::ForwardArgs&) { calls += 10; })};
  tnn::call(linear, x);
  EXPECT_EQ(calls, 15);
}

TEST(ModuleHooks, SequentialWithItsTemplateForward) {
  torch::nn::Sequential seq(torch::nn::Linear(2, 3), torch::nn::ReLU());
  std::vector<int64_t> outShape;
  ScopedHook h{tnn::registerForwardHook(
      seq,
      [&](torch::nn::Module&, const tnn::ForwardArgs& args,
          tnn::ForwardOutput& out) {
        EXPECT_EQ(args.size(), 1u);
        outShape = out.get<at::Tensor>().sizes().vec();
      })};
  const at::Tensor y = tnn::call(seq, at::ones({4, 2}));
  EXPECT_EQ(y.sizes(), at::IntArrayRef({4, 3}));
  EXPECT_EQ(outShape, (std::vector<int64_t>{4, 3}));
}

TEST(ModuleHooks, HooksAreKeyedByModuleNotByType) {
  torch::nn::Linear a(2, 2);
  torch::nn::Linear b(2, 2);
  int calls = 0;
  ScopedHook h{tnn::registerForwardPreHook(
      a, [&](torch::nn::Module&, const tnn::ForwardArgs&) { ++calls; })};
  tnn::call(b, at::ones({1, 2}));
  EXPECT_EQ(calls, 0);
  tnn::call(a, at::ones({1, 2}));
  EXPECT_EQ(calls, 1);
}

TEST(ModuleHooks, ModuleNotOwnedBySharedPtrIsRejected) {
  torch::nn::LinearImpl onStack(2, 2);
  expectValueError(
      [&] {
        tnn::registerForwardPreHook(
            onStack, [](torch::nn::Module&, const tnn::ForwardArgs&) {});
      },
      {"owned by a std::shared_ptr", "std::make_shared<torch::nn::Linear"});
  // call() still works on it (nothing to run).
  EXPECT_EQ(tnn::call(onStack, at::ones({1, 2})).sizes(), at::IntArrayRef({1, 2}));
  auto m = std::make_shared<VoidImpl>();
  expectValueError(
      [&] { tnn::registerForwardPreHook(m, tnn::ForwardPreHook()); },
      {"needs a callable"});
  std::shared_ptr<VoidImpl> null;
  expectValueError([&] { tnn::call(null); }, {"module pointer is null"});
}

TEST(ModuleHooks, ExceptionsPropagateAndStopTheCall) {
  auto log = newLog();
  auto m = std::make_shared<LoggingImpl>(log);
  bool fail = true;
  int post = 0;
  ScopedHook a{tnn::registerForwardPreHook(
      m, [&](torch::nn::Module&, const tnn::ForwardArgs&) {
        if (fail) {
          throw std::runtime_error("pre-hook failed");
        }
      })};
  ScopedHook b{tnn::registerForwardHook(
      m,
      [&](torch::nn::Module&, const tnn::ForwardArgs&, tnn::ForwardOutput&) {
        ++post;
      })};
  EXPECT_THROW(tnn::call(m, at::ones({1})), std::runtime_error);
  EXPECT_TRUE(log->empty()); // forward() did not run
  EXPECT_EQ(post, 0);
  fail = false;
  tnn::call(m, at::ones({1}));
  EXPECT_EQ(post, 1);
  // forward() itself throwing: no post-hook.
  auto thrower = std::make_shared<ThrowingImpl>();
  int throwerPost = 0;
  ScopedHook c{tnn::registerForwardHook(
      thrower,
      [&](torch::nn::Module&, const tnn::ForwardArgs&, tnn::ForwardOutput&) {
        ++throwerPost;
      })};
  EXPECT_THROW(tnn::call(thrower, 1), std::out_of_range);
  EXPECT_EQ(throwerPost, 0);
}

// ------------------------------------------------------------ removal

TEST(ModuleHooks, RemovedHooksDoNotRun) {
  auto m = std::make_shared<VoidImpl>();
  int pre = 0;
  int post = 0;
  tnn::HookHandle a = tnn::registerForwardPreHook(
      m, [&](torch::nn::Module&, const tnn::ForwardArgs&) { ++pre; });
  tnn::HookHandle b = tnn::registerForwardHook(
      m,
      [&](torch::nn::Module&, const tnn::ForwardArgs&, tnn::ForwardOutput&) {
        ++post;
      });
  EXPECT_TRUE(a.active());
  EXPECT_TRUE(tnn::detail::anyHooks());
  tnn::call(m);
  a.remove();
  EXPECT_FALSE(a.active());
  tnn::call(m);
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post, 2);
  tnn::HookHandle copy = b; // copies remove the same hook
  copy.remove();
  EXPECT_FALSE(b.active());
  b.remove(); // idempotent
  a.remove();
  tnn::call(m);
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post, 2);
  EXPECT_EQ(m->calls, 3);
  EXPECT_FALSE(tnn::HookHandle().active());
  tnn::HookHandle().remove(); // an empty handle is a no-op
}

TEST(ModuleHooks, HookRemovesItselfFromInside) {
  auto m = std::make_shared<VoidImpl>();
  int once = 0;
  int always = 0;
  tnn::HookHandle self;
  self = tnn::registerForwardPreHook(
      m, [&](torch::nn::Module&, const tnn::ForwardArgs&) {
        ++once;
        self.remove(); // removing the running hook is safe
        EXPECT_FALSE(self.active());
      });
  ScopedHook other{tnn::registerForwardPreHook(
      m, [&](torch::nn::Module&, const tnn::ForwardArgs&) { ++always; })};
  tnn::call(m);
  tnn::call(m);
  EXPECT_EQ(once, 1);
  EXPECT_EQ(always, 2); // the other hook still ran in the first call
}

TEST(ModuleHooks, HookRemovesLaterHooksOfTheSameCall) {
  auto m = std::make_shared<VoidImpl>();
  std::vector<std::string> ran;
  tnn::HookHandle laterPre;
  tnn::HookHandle post;
  ScopedHook first{tnn::registerForwardPreHook(
      m, [&](torch::nn::Module&, const tnn::ForwardArgs&) {
        ran.push_back("first");
        laterPre.remove();
        post.remove();
      })};
  laterPre = tnn::registerForwardPreHook(
      m, [&](torch::nn::Module&, const tnn::ForwardArgs&) {
        ran.push_back("laterPre");
      });
  post = tnn::registerForwardHook(
      m,
      [&](torch::nn::Module&, const tnn::ForwardArgs&, tnn::ForwardOutput&) {
        ran.push_back("post");
      });
  tnn::call(m);
  EXPECT_EQ(ran, (std::vector<std::string>{"first"}));
  EXPECT_EQ(m->calls, 1);
}

TEST(ModuleHooks, HookRegistersHooksDuringACall) {
  auto m = std::make_shared<VoidImpl>();
  std::vector<std::string> ran;
  std::vector<tnn::HookHandle> added;
  ScopedHook adder{tnn::registerForwardPreHook(
      m, [&](torch::nn::Module& mod, const tnn::ForwardArgs&) {
        ran.push_back("adder");
        if (added.empty()) {
          // A post-hook added now runs in this call (post-hooks are read
          // after forward(), as in PyTorch); a pre-hook from the next call.
          added.push_back(tnn::registerForwardHook(
              mod,
              [&](torch::nn::Module&, const tnn::ForwardArgs&,
                  tnn::ForwardOutput&) { ran.push_back("post"); }));
          added.push_back(tnn::registerForwardPreHook(
              mod, [&](torch::nn::Module&, const tnn::ForwardArgs&) {
                ran.push_back("pre");
              }));
        }
      })};
  tnn::call(m);
  tnn::call(m);
  for (auto& h : added) {
    h.remove();
  }
  EXPECT_EQ(
      ran,
      (std::vector<std::string>{"adder", "post", "adder", "pre", "post"}));
}

TEST(ModuleHooks, HooksGoAwayWithTheirModule) {
  auto token = std::make_shared<int>(0);
  tnn::HookHandle handle;
  {
    auto m = std::make_shared<VoidImpl>();
    handle = tnn::registerForwardPreHook(
        m, [token](torch::nn::Module&, const tnn::ForwardArgs&) {});
    EXPECT_TRUE(handle.active());
  }
  EXPECT_FALSE(handle.active()); // its module is gone
  EXPECT_EQ(token.use_count(), 2); // captured until swept
  // Registrations on many short-lived modules sweep the dead ones; the
  // captured token is then released.
  for (int i = 0; i < 200; ++i) {
    auto m = std::make_shared<VoidImpl>();
    tnn::registerForwardPreHook(m, [](torch::nn::Module&, const tnn::ForwardArgs&) {});
  }
  EXPECT_EQ(token.use_count(), 1);
  handle.remove(); // removing after the module died is a no-op
  // A new module (perhaps at the same address) starts without hooks.
  auto fresh = std::make_shared<VoidImpl>();
  int calls = 0;
  ScopedHook h{tnn::registerForwardHook(
      fresh,
      [&](torch::nn::Module&, const tnn::ForwardArgs&, tnn::ForwardOutput&) {
        ++calls;
      })};
  tnn::call(fresh);
  EXPECT_EQ(calls, 1);
}

TEST(ModuleHooks, ConcurrentCallsAndRegistrations) {
  // Calls on one thread while another registers and removes hooks on the
  // same module: no crash, no lost call, every hook run is a live one.
  auto m = std::make_shared<VoidImpl>();
  std::atomic<int> counter{0};
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    while (!stop.load()) {
      auto h = tnn::registerForwardPreHook(
          m, [&](torch::nn::Module&, const tnn::ForwardArgs&) { ++counter; });
      h.remove();
    }
  });
  for (int i = 0; i < 20000; ++i) {
    tnn::call(m);
  }
  stop = true;
  churn.join();
  EXPECT_EQ(m->calls, 20000);
  EXPECT_LE(counter.load(), 20000);
}

// ------------------------------------------------------------ attribute paths

TEST(AttributePath, ResolvesParametersBuffersAndNestedPaths) {
  Net net;
  const auto weight = tnn::resolveAttribute(*net, "fc.weight");
  ASSERT_TRUE(weight.isTensor());
  EXPECT_TRUE(weight.toTensor().is_same(net->fc->weight));
  EXPECT_TRUE(tnn::resolveAttribute(*net, "gain").toTensor().is_same(net->gain));
  EXPECT_TRUE(tnn::resolveAttribute(*net, "count").toTensor().is_same(net->count));
  EXPECT_TRUE(
      tnn::resolveAttribute(*net, "block.state").toTensor().is_same(net->block->state));
  EXPECT_TRUE(tnn::resolveAttribute(*net, "block.lin.bias")
                  .toTensor()
                  .is_same(net->block->lin->bias));
  // torch::nn::Module hides undefined tensors from named_buffers(): the
  // error says so.
  expectValueError(
      [&] { tnn::resolveAttribute(*net, "pending"); },
      {"no parameter or buffer named 'pending'", "undefined"});
  const tnn::AttributePath path("block.state");
  EXPECT_EQ(path.str(), "block.state");
  EXPECT_EQ(path.parts(), (std::vector<std::string>{"block", "state"}));
}

TEST(AttributePath, IsResolvedAgainAtEveryUse) {
  Net net;
  const tnn::AttributePath path("block.state");
  const at::Tensor old = path.resolve(*net).toTensor();
  Block replacement;
  net->block = net->replace_module("block", replacement);
  const at::Tensor now = path.resolve(*net).toTensor();
  EXPECT_TRUE(now.is_same(replacement->state));
  EXPECT_FALSE(now.is_same(old));
}

TEST(AttributePath, UnknownPartsAreNamed) {
  Net net;
  expectValueError(
      [&] { tnn::resolveAttribute(*net, "block.stat"); },
      {"'block.stat'", "the submodule 'block' (", "BlockImpl)",
       "no parameter or buffer named 'stat'", "buffers: state",
       "submodules: lin", "register_buffer"});
  expectValueError(
      [&] { tnn::resolveAttribute(*net, "blok.state"); },
      {"'blok.state'", "the module itself (", "NetImpl)",
       "no submodule named 'blok'", "submodules: block, fc"});
  expectValueError(
      [&] { tnn::resolveAttribute(*net, "fc.bias.x"); },
      {"'fc.bias.x'", "'fc.bias' is a parameter", "'x' cannot follow it"});
  expectValueError(
      [&] { tnn::resolveAttribute(*net, "count.x"); },
      {"'count' is a buffer"});
  expectValueError(
      [&] { tnn::resolveAttribute(*net, "block.lin"); },
      {"'block.lin' names a submodule", "'block.lin.weight'"});
  expectValueError(
      [&] { tnn::resolveAttribute(*net, "weight"); },
      {"the module itself (", "NetImpl) has no parameter or buffer named 'weight'",
       "parameters: gain;", "buffers: count;"});
  for (const char* bad : {"", ".a", "a.", "a..b"}) {
    expectValueError([&] { tnn::AttributePath p(bad); }, {"empty part"});
  }
}

// ------------------------------------------------------------ attach()

// Records what its hooks hand over, and gates itself like DifferenceMonitor.
struct RecordingMonitor {
  bool train = true;
  bool eval = true;
  bool trainUpdate() const {
    return train;
  }
  bool evalUpdate() const {
    return eval;
  }
  void before(const c10::IValue& v, bool training) {
    events.push_back(std::string("before ") + (training ? "train" : "eval"));
    pre = v.isTensor() ? v.toTensor().clone() : at::Tensor();
  }
  void after(const c10::IValue& v, bool training) {
    events.push_back(std::string("after ") + (training ? "train" : "eval"));
    if (v.isTensor() && pre.defined()) {
      diffs.push_back(v.toTensor() - pre);
    }
  }
  // Called by the hooks instead of before()/after() when gated off.
  void forget() {
    ++forgets;
    pre = at::Tensor();
  }
  std::vector<std::string> events;
  std::vector<at::Tensor> diffs;
  at::Tensor pre;
  int forgets = 0;
};

// No mode flags: it is told the mode and decides itself.
struct UngatedMonitor {
  void before(const c10::IValue&, bool training) {
    modes.push_back(training);
  }
  void after(const c10::IValue&, bool training) {
    modes.push_back(training);
  }
  std::vector<bool> modes;
};

TEST(Attach, HandsTheResolvedValueAndTheModeToTheMonitor) {
  Net net;
  auto monitor = std::make_shared<RecordingMonitor>();
  ScopedHook h{tnn::attach(monitor, net, "block.state")};
  const at::Tensor x = at::ones({2, 3});
  tnn::call(net, x); // state: 0 -> 2
  tnn::call(net, x); // state: 2 -> 3
  ASSERT_EQ(monitor->diffs.size(), 2u);
  EXPECT_TRUE(at::allclose(monitor->diffs[0], at::full({3}, 2.0)));
  EXPECT_TRUE(at::allclose(monitor->diffs[1], at::full({3}, 1.0)));
  net->eval();
  tnn::call(net, x);
  EXPECT_EQ(
      monitor->events,
      (std::vector<std::string>{
          "before train", "after train", "before train", "after train",
          "before eval", "after eval"}));
  EXPECT_EQ(monitor.use_count(), 2); // the hooks share it
  h.handle.remove();
  EXPECT_EQ(monitor.use_count(), 1);
  tnn::call(net, x);
  EXPECT_EQ(monitor->events.size(), 6u);
}

TEST(Attach, TrainEvalGatingSkipsBeforeResolving) {
  Net net;
  auto monitor = std::make_shared<RecordingMonitor>();
  monitor->eval = false;
  // A path that does not resolve: only an error where the monitor records.
  ScopedHook h{tnn::attach(monitor, net, "block.missing")};
  net->eval();
  tnn::call(net, at::ones({1, 3}));
  EXPECT_TRUE(monitor->events.empty());
  EXPECT_EQ(monitor->forgets, 2); // pre and post each dropped the capture
  net->train();
  expectValueError(
      [&] { tnn::call(net, at::ones({1, 3})); },
      {"'block.missing'", "no parameter or buffer named 'missing'"});
  // Mode flags are read at every call.
  monitor->train = false;
  tnn::call(net, at::ones({1, 3}));
  EXPECT_TRUE(monitor->events.empty());
  EXPECT_EQ(monitor->forgets, 4);
}

TEST(Attach, MonitorWithoutFlagsIsToldTheMode) {
  Net net;
  auto monitor = std::make_shared<UngatedMonitor>();
  ScopedHook h{tnn::attach(monitor, net.ptr(), "gain")};
  tnn::call(net, at::ones({1, 3}));
  net->eval();
  tnn::call(net, at::ones({1, 3}));
  EXPECT_EQ(monitor->modes, (std::vector<bool>{true, true, false, false}));
}

TEST(Attach, PrependAndMalformedPath) {
  Net net;
  std::vector<std::string> order;
  ScopedHook first{tnn::registerForwardPreHook(
      net, [&](torch::nn::Module&, const tnn::ForwardArgs&) {
        order.push_back("hook");
      })};
  struct OrderMonitor {
    std::vector<std::string>* order;
    void before(const c10::IValue&, bool) {
      order->push_back("monitor");
    }
    void after(const c10::IValue&, bool) {}
  };
  ScopedHook second{tnn::attach(
      std::make_shared<OrderMonitor>(OrderMonitor{&order}), net, "gain",
      /*prepend=*/true)};
  tnn::call(net, at::ones({1, 3}));
  EXPECT_EQ(order, (std::vector<std::string>{"monitor", "hook"}));
  expectValueError(
      [&] { tnn::attach(std::make_shared<UngatedMonitor>(), net, "a..b"); },
      {"empty part"});
  std::shared_ptr<UngatedMonitor> none;
  expectValueError([&] { tnn::attach(none, net, "gain"); }, {"null pointer"});
}

// Keeps every step's inputs (the reducers proper are tested elsewhere).
class HistoryReducer : public Reducer {
 public:
  void forward(const std::vector<at::Tensor>& inputs) override {
    ASSERT_EQ(inputs.size(), 1u);
    history.push_back(inputs[0].detach().clone());
  }
  std::optional<at::Tensor> peek() const override {
    if (history.empty()) {
      return std::nullopt;
    }
    return history.back();
  }
  std::optional<at::Tensor> dump() const override {
    if (history.empty()) {
      return std::nullopt;
    }
    std::vector<at::Tensor> rows(history.rbegin(), history.rend());
    return at::stack(rows);
  }
  std::optional<at::Tensor> view(const at::Tensor&, double) const override {
    return peek();
  }
  void clear(bool) override {
    history.clear();
  }
  std::vector<at::Tensor> history;
};

TEST(DifferenceMonitorAttach, MeasuresInPlaceWeightUpdateOfALinear) {
  at::manual_seed(0);
  Net net;
  auto reducer = std::make_shared<HistoryReducer>();
  auto monitor =
      std::make_shared<DifferenceMonitor>(reducer, "fc.weight");
  ScopedHook h{tnn::attach(monitor, net, "fc.weight")};
  const at::Tensor x = at::randn({4, 3});
  for (int step = 0; step < 3; ++step) {
    const at::Tensor before = net->fc->weight.detach().clone();
    tnn::call(net, x);
    ASSERT_EQ(reducer->history.size(), static_cast<size_t>(step + 1));
    const at::Tensor delta = reducer->history.back();
    // The in-place add_ inside forward() is measured (a reference to the
    // weight taken before forward() would give zero).
    EXPECT_TRUE(at::allclose(delta, net->lastDelta)) << delta << net->lastDelta;
    EXPECT_TRUE(at::allclose(delta, net->fc->weight.detach() - before));
    EXPECT_GT(delta.abs().max().item<float>(), 0.0f);
  }
  // Without an update the difference is zero.
  net->learn = false;
  tnn::call(net, x);
  EXPECT_TRUE(at::equal(reducer->history.back(), at::zeros({2, 3})));
}

TEST(DifferenceMonitorAttach, OnALinearItselfWithAnUpdatingHook) {
  // Attached to a torch::nn::Linear holder directly; another hook (after
  // the monitor's pre-hook) moves the weight in place inside the call.
  torch::nn::Linear linear(3, 2);
  auto reducer = std::make_shared<HistoryReducer>();
  ScopedHook monitor{tnn::attach(
      std::make_shared<DifferenceMonitor>(reducer, "weight"), linear, "weight")};
  ScopedHook updater{tnn::registerForwardPreHook(
      linear, [](torch::nn::Module& m, const tnn::ForwardArgs&) {
        at::NoGradGuard noGrad;
        static_cast<torch::nn::LinearImpl&>(m).weight.add_(0.25);
      })};
  tnn::call(linear, at::ones({1, 3}));
  ASSERT_EQ(reducer->history.size(), 1u);
  EXPECT_TRUE(at::allclose(reducer->history[0], at::full({2, 3}, 0.25)));
}

TEST(DifferenceMonitorAttach, MeasuresNestedBufferUpdatedInPlace) {
  Net net;
  auto reducer = std::make_shared<HistoryReducer>();
  auto monitor = std::make_shared<DifferenceMonitor>(
      reducer, "block.state", /*trainUpdate=*/true, /*evalUpdate=*/false);
  ScopedHook h{tnn::attach(monitor, net, "block.state")};
  const at::Tensor x = at::ones({2, 3});
  tnn::call(net, x); // state 0 -> 2
  tnn::call(net, x); // state 2 -> 3
  ASSERT_EQ(reducer->history.size(), 2u);
  EXPECT_TRUE(at::allclose(reducer->history[0], at::full({3}, 2.0)));
  EXPECT_TRUE(at::allclose(reducer->history[1], at::full({3}, 1.0)));
  // Eval: gated off (evalUpdate=false), the state still moves.
  net->eval();
  tnn::call(net, x);
  EXPECT_EQ(reducer->history.size(), 2u);
  EXPECT_TRUE(at::allclose(net->block->state, at::full({3}, 3.5)));
  net->train();
  tnn::call(net, x); // 3.5 -> 3.75
  ASSERT_EQ(reducer->history.size(), 3u);
  EXPECT_TRUE(at::allclose(reducer->history[2], at::full({3}, 0.25)));
  ASSERT_TRUE(monitor->reducer()->peek().has_value());
}

} // namespace
} // namespace torch_monitor
