#include <torch_monitor/watch/watch.h>

#include <unordered_set>
#include <utility>

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <torch_monitor/nn/forward_call.h>
#include <torch_monitor/watch/plan.h>

namespace torch_monitor {

using watch::Kind;
using watch::Recorder;

Watch::Watch(torch::nn::Module& model, WatchOptions options) {
  // Every parameter and module; which are watched is planKeys' choice, as
  // for Python's watch().
  watch::Candidates candidates;
  // Parameters in the model's order, each tensor once (a tied weight under
  // its first name, as Python's named_parameters() gives it).
  std::unordered_set<const void*> seen;
  std::vector<at::Tensor> parameters;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) {
      continue;
    }
    candidates.parameters.push_back(item.key());
    candidates.trainable.push_back(item.value().requires_grad());
    candidates.stepped.push_back(true); // step() runs the whole optimizer
    parameters.push_back(item.value());
  }
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& item :
       model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    candidates.modules.push_back(item.key());
    modules.push_back(item.value());
  }
  watch::Plan plan = watch::planKeys(
      options.what,
      candidates,
      watch::Selection(options.include, options.exclude));
  // Each module's output and output-gradient keys, -1: not watched; the
  // keys observed around optimizer steps and their parameters.
  std::vector<std::pair<int64_t, int64_t>> outputKeys(
      modules.size(), std::pair<int64_t, int64_t>(-1, -1));
  std::vector<int64_t> stepKeys;
  std::vector<at::Tensor> stepParameters;
  for (size_t k = 0; k < plan.keys.size(); ++k) {
    const auto key = int64_t(k);
    if (plan.targets[k] < 0) {
      continue; // total.grad, total.update: the recorder observes them
    }
    const auto target = size_t(plan.targets[k]);
    switch (plan.keys[k].kind) {
      case Kind::Output:
        outputKeys[target].first = key;
        break;
      case Kind::OutputGrad:
        outputKeys[target].second = key;
        break;
      default: // grad, weight, update
        stepKeys.push_back(key);
        stepParameters.push_back(parameters[target]);
    }
  }
  watch::RecorderOptions ro;
  ro.windowSteps = options.windowSteps;
  ro.windowSize = options.windowSize;
  ro.every = options.every;
  ro.histogramsEvery = options.histogramsEvery;
  ro.writer = options.writer;
  ro.memory = options.memory;
  ro.syncRanks = options.syncRanks;
  ro.group = options.group;
  ro.onNonFinite = options.onNonFinite;
  ro.closeOnTime = options.closeOnTime;
  const c10::Device device = model.parameters().empty()
      ? c10::Device(c10::DeviceType::CPU)
      : model.parameters().front().device();
  recorder_ = Recorder::create(std::move(plan.keys), std::move(ro), device);
  recorder_->setNonFiniteHandler(options.onNonFiniteHandler);
  steps_ = std::make_unique<watch::StepObserver>(
      recorder_, stepKeys, stepParameters);

  const std::weak_ptr<Recorder> weak = recorder_;
  for (size_t m = 0; m < modules.size(); ++m) {
    const auto [out, grad] = outputKeys[m];
    if (out < 0 && grad < 0) {
      continue;
    }
    hooks_.push_back(nn::registerForwardHook(
        *modules[m],
        [weak, out = out, grad = grad](
            torch::nn::Module&,
            const nn::ForwardArgs&,
            nn::ForwardOutput& output) {
          auto r = weak.lock();
          const at::Tensor* y = watch::observedOutput(std::as_const(output));
          if (!r || y == nullptr) {
            return;
          }
          if (out >= 0) {
            r->observe(r->slots(), r->gate(), {*y}, {out}, {});
          }
          if (grad >= 0 && y->requires_grad()) {
            y->register_hook([weak, grad](const at::Tensor& g) {
              if (auto live = weak.lock()) {
                live->observe(live->slots(), live->gate(), {g}, {grad}, {});
              }
            });
          }
        }));
  }
}

Watch::~Watch() {
  try {
    remove();
  } catch (const std::exception& e) {
    TORCH_WARN("torch_monitor::Watch: ", e.what());
  }
}

void Watch::step(
    const std::function<void()>& optimizerStep,
    bool gradientsAfter) {
  TORCH_CHECK_VALUE(
      static_cast<bool>(optimizerStep),
      "torch_monitor::Watch::step: pass the optimizer step to run");
  if (recorder_->removed()) {
    optimizerStep();
    return;
  }
  steps_->before(gradientsAfter);
  optimizerStep();
  steps_->after();
}

void Watch::close() {
  recorder_->close();
}

void Watch::remove() {
  for (auto& hook : hooks_) {
    hook.remove();
  }
  hooks_.clear();
  if (recorder_) {
    recorder_->remove();
  }
}

std::vector<std::string> Watch::keys() const {
  std::vector<std::string> names;
  for (const auto& key : recorder_->keys()) {
    names.push_back(key.name());
  }
  return names;
}

} // namespace torch_monitor
