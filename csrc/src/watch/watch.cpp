#include <torch_monitor/watch/watch.h>

#include <unordered_set>
#include <utility>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <torch_monitor/nn/forward_call.h>
#include <torch_monitor/watch/plan.h>

namespace torch_monitor {

using watch::Kind;
using watch::Recorder;

struct Watch::Parameter {
  std::string path;
  at::Tensor tensor;
  at::Tensor before; // "update": the weight before the step, made at the first
};


Watch::Watch(torch::nn::Module& model, WatchOptions options) {
  // Every parameter and module; which are watched is planKeys' choice, as
  // for Python's watch().
  watch::Candidates candidates;
  // Parameters in the model's order, each tensor once (a tied weight under
  // its first name, as Python's named_parameters() gives it).
  std::unordered_set<const void*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) {
      continue;
    }
    auto p = std::make_shared<Parameter>();
    p->path = item.key();
    p->tensor = item.value();
    candidates.parameters.push_back(p->path);
    candidates.trainable.push_back(p->tensor.requires_grad());
    candidates.stepped.push_back(true); // step() runs the whole optimizer
    parameters_.push_back(std::move(p));
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
  // Each module's output and output-gradient keys, -1: not watched.
  std::vector<std::pair<int64_t, int64_t>> outputKeys(
      modules.size(), std::pair<int64_t, int64_t>(-1, -1));
  for (size_t k = 0; k < plan.keys.size(); ++k) {
    const auto key = int64_t(k);
    if (plan.targets[k] < 0) {
      continue; // total.grad, total.update: the recorder observes them
    }
    const auto target = size_t(plan.targets[k]);
    switch (plan.keys[k].kind) {
      case Kind::Grad:
        grads_.emplace_back(key, target);
        break;
      case Kind::Weight:
        weights_.emplace_back(key, target);
        break;
      case Kind::Update:
        updates_.emplace_back(key, target);
        break;
      case Kind::Output:
        outputKeys[target].first = key;
        break;
      case Kind::OutputGrad:
        outputKeys[target].second = key;
        break;
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
  const c10::Device device = model.parameters().empty()
      ? c10::Device(c10::DeviceType::CPU)
      : model.parameters().front().device();
  recorder_ = Recorder::create(std::move(plan.keys), std::move(ro), device);

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

void Watch::step(const std::function<void()>& optimizerStep) {
  TORCH_CHECK_VALUE(
      static_cast<bool>(optimizerStep),
      "torch_monitor::Watch::step: pass the optimizer step to run");
  if (recorder_->removed()) {
    optimizerStep();
    return;
  }
  // What the optimizer will change: the parameters that have a gradient
  // (torch's optimizers skip the others).
  std::vector<at::Tensor> grads;
  std::vector<at::Tensor> stepped;
  std::vector<at::Tensor> before;
  std::vector<int64_t> gradKeys;
  std::vector<int64_t> updateKeys;
  {
    at::NoGradGuard noGrad;
    for (const auto& [key, i] : grads_) {
      const at::Tensor& g = parameters_[i]->tensor.grad();
      if (g.defined()) {
        grads.push_back(g);
        gradKeys.push_back(key);
      }
    }
    for (const auto& [key, i] : updates_) {
      Parameter& p = *parameters_[i];
      if (!p.tensor.grad().defined()) {
        continue;
      }
      if (!p.before.defined() || p.before.sizes() != p.tensor.sizes() ||
          p.before.options().dtype() != p.tensor.options().dtype() ||
          p.before.device() != p.tensor.device()) {
        p.before = at::empty_like(p.tensor);
      }
      p.before.copy_(p.tensor);
      stepped.push_back(p.tensor);
      before.push_back(p.before);
      updateKeys.push_back(key);
    }
  }
  if (!grads.empty()) {
    recorder_->observe(
        recorder_->slots(), recorder_->gate(), grads, gradKeys, {});
  }
  optimizerStep();
  if (!weights_.empty()) {
    std::vector<at::Tensor> weights;
    std::vector<int64_t> weightKeys;
    for (const auto& [key, i] : weights_) {
      weights.push_back(parameters_[i]->tensor);
      weightKeys.push_back(key);
    }
    recorder_->observe(
        recorder_->slots(), recorder_->gate(), weights, weightKeys, {});
  }
  if (!stepped.empty()) {
    recorder_->observe(
        recorder_->slots(), recorder_->gate(), stepped, updateKeys, before);
  }
  recorder_->optimizerStepped();
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
