// monitorsOf() and silentMonitors() on TorchScript modules built here: the
// C++ way to find a loaded model's monitors and to notice that a model run
// with module.forward(inputs) (which skips TorchScript's hooks) fed none.

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <torch_monitor/reducers/factory.h>
#include <torch_monitor/script/difference_monitor.h>
#include <torch_monitor/script/monitors_of.h>

namespace torch_monitor::script {
namespace {

c10::IValue newMonitor(
    const std::string& name,
    const std::string& kind = ScriptDifferenceMonitor::kDefaultKind) {
  auto reducer = c10::make_intrusive<ScriptReducer>(
      makeReducer("PassthroughReducer", 1.0, 2.0, false, false, {}));
  return c10::IValue(c10::make_intrusive<ScriptDifferenceMonitor>(
      c10::IValue(reducer), name, true, true, false, kind));
}

const c10::ClassTypePtr& monitorType() {
  static const c10::ClassTypePtr type =
      c10::getCustomClassType<c10::intrusive_ptr<ScriptDifferenceMonitor>>();
  return type;
}

// parent (one monitor) -> child (one monitor), as a scripted model holding
// DifferenceMonitors on itself and on a submodule; forward() does not run
// the hooks, like a loaded model called with module.forward(inputs).
torch::jit::Module monitoredModel() {
  torch::jit::Module child("__torch__.Child");
  child.register_attribute(
      "_torch_monitor_state_7", monitorType(), newMonitor("state", "StateMonitor"));
  child.register_attribute("state", c10::TensorType::get(), at::zeros({2}));
  child.define("def forward(self, x):\n  return x\n");
  torch::jit::Module parent("__torch__.Parent");
  parent.register_attribute("plain", c10::IntType::get(), int64_t{3});
  parent.register_attribute("_torch_monitor_difference_2", monitorType(), newMonitor("weight"));
  parent.register_module("block", child);
  parent.define("def forward(self, x):\n  return self.block.forward(x)\n");
  return parent;
}

TEST(MonitorsOf, ListsEveryMonitorWithItsPath) {
  const torch::jit::Module model = monitoredModel();
  const std::vector<MonitorEntry> found = monitorsOf(model);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].path, "_torch_monitor_difference_2");
  EXPECT_EQ(found[0].kind, "DifferenceMonitor");
  EXPECT_EQ(found[1].path, "block._torch_monitor_state_7");
  // One TorchScript class serves every monitor; the kind says which.
  EXPECT_EQ(found[1].kind, "StateMonitor");
  EXPECT_EQ(
      found[1].monitor.toCustomClass<ScriptDifferenceMonitor>()->monitor().name(),
      "state");
  EXPECT_TRUE(monitorsOf(torch::jit::Module("__torch__.Empty")).empty());
  EXPECT_EQ(monitorKind(c10::IValue(int64_t{1})), "");
}

TEST(MonitorsOf, SilentMonitorsNamesThoseThatRecordedNothing) {
  torch::jit::Module model = monitoredModel();
  model.forward({at::ones({2})}); // skips the hooks: nothing recorded
  std::vector<MonitorEntry> silent = silentMonitors(model, /*warn=*/false);
  ASSERT_EQ(silent.size(), 2u);

  // What module(inputs) would have done for the child's monitor.
  auto monitor = monitorsOf(model)[1].monitor.toCustomClass<ScriptDifferenceMonitor>();
  monitor->monitor().before(at::zeros({2}), true);
  monitor->monitor().after(at::ones({2}), true);
  silent = silentMonitors(model, /*warn=*/false);
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].path, "_torch_monitor_difference_2");
}

TEST(MonitorsOf, SilentMonitorsWarnsNamingThem) {
  const torch::jit::Module model = monitoredModel();
  std::string warned;
  {
    struct Recorder : c10::WarningHandler {
      std::string* out;
      explicit Recorder(std::string* o) : out(o) {}
      void process(const c10::Warning& warning) override {
        *out += warning.msg();
      }
    } recorder(&warned);
    c10::WarningUtils::WarningHandlerGuard use(&recorder);
    silentMonitors(model);
  }
  EXPECT_NE(warned.find("module.forward(inputs)"), std::string::npos) << warned;
  EXPECT_NE(warned.find("block._torch_monitor_state_7"), std::string::npos);
}

} // namespace
} // namespace torch_monitor::script
