#include <torch_monitor/watch/step_observer.h>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>

namespace torch_monitor::watch {

StepObserver::StepObserver(
    std::shared_ptr<Recorder> recorder,
    const std::vector<int64_t>& keys,
    const std::vector<at::Tensor>& parameters)
    : recorder_(std::move(recorder)) {
  TORCH_CHECK_VALUE(
      keys.size() == parameters.size(),
      "torch_monitor.watch: one parameter per key, got ",
      keys.size(),
      " keys and ",
      parameters.size(),
      " parameters");
  const std::vector<Key>& all = recorder_->keys();
  for (size_t i = 0; i < keys.size(); ++i) {
    TORCH_CHECK_VALUE(
        keys[i] >= 0 && static_cast<size_t>(keys[i]) < all.size(),
        "torch_monitor.watch: no key ",
        keys[i],
        " (the watch has ",
        all.size(),
        ")");
    const Kind kind = all[keys[i]].kind;
    TORCH_CHECK_VALUE(
        kind == Kind::Grad || kind == Kind::Weight || kind == Kind::Update,
        "torch_monitor.watch: key '",
        all[keys[i]].name(),
        "' is not observed around optimizer steps (only grad, weight and "
        "update keys are)");
    Watched& watched = kind == Kind::Grad ? grads_
        : kind == Kind::Weight            ? weights_
                                          : updates_;
    watched.emplace_back(keys[i], parameters[i]);
  }
  copies_.resize(updates_.size());
}

void StepObserver::observeGradients() {
  std::vector<at::Tensor> grads;
  std::vector<int64_t> gradKeys;
  for (const auto& [key, p] : grads_) {
    if (p.grad().defined()) {
      grads.push_back(p.grad());
      gradKeys.push_back(key);
    }
  }
  if (!grads.empty()) {
    recorder_->observe(recorder_->slots(), recorder_->gate(), grads, gradKeys, {});
  }
}

void StepObserver::forgetStep() {
  stepped_.clear();
  before_.clear();
  steppedKeys_.clear();
}

void StepObserver::before(bool gradientsAfter) {
  gradientsAfter_ = gradientsAfter;
  if (!gradientsAfter) {
    observeGradients();
  }
  forgetStep();
  for (size_t i = 0; i < updates_.size(); ++i) {
    const auto& [key, p] = updates_[i];
    // A closure may give a gradient to a parameter that has none yet (its
    // first step): every one is copied, and after() keeps those it has.
    if (!gradientsAfter && !p.grad().defined()) {
      continue;
    }
    at::Tensor& copy = copies_[i];
    if (!copy.defined() || copy.sizes() != p.sizes() ||
        copy.dtype() != p.dtype() || copy.device() != p.device()) {
      copy = at::empty_like(p, at::MemoryFormat::Contiguous);
    }
    stepped_.push_back(p);
    before_.push_back(copy);
    steppedKeys_.push_back(key);
  }
  if (!stepped_.empty()) {
    // One fused copy (a handful of kernel launches for any number of
    // tensors, where a loop of copy_ launches one per tensor): the
    // optimizers' own op.
    at::NoGradGuard noGrad;
    at::_foreach_copy_(before_, stepped_);
  }
}

void StepObserver::after(bool skipped) {
  if (skipped) {
    forgetStep();
    return;
  }
  if (gradientsAfter_) {
    observeGradients();
    // The optimizer skipped the parameters the closure left without one.
    size_t kept = 0;
    for (size_t i = 0; i < stepped_.size(); ++i) {
      if (stepped_[i].grad().defined()) {
        stepped_[kept] = stepped_[i];
        before_[kept] = before_[i];
        steppedKeys_[kept] = steppedKeys_[i];
        ++kept;
      }
    }
    stepped_.resize(kept);
    before_.resize(kept);
    steppedKeys_.resize(kept);
  }
  if (!weights_.empty()) {
    std::vector<at::Tensor> weights;
    std::vector<int64_t> keys;
    for (const auto& [key, p] : weights_) {
      weights.push_back(p);
      keys.push_back(key);
    }
    recorder_->observe(recorder_->slots(), recorder_->gate(), weights, keys, {});
  }
  if (!stepped_.empty()) {
    recorder_->observe(
        recorder_->slots(), recorder_->gate(), stepped_, steppedKeys_, before_);
    forgetStep();
  }
  recorder_->optimizerStepped();
}

} // namespace torch_monitor::watch
