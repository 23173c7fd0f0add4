// The hook registry of torch_monitor::nn: hooks of C++ modules, keyed by the
// module object (torch::nn::Module has no slot of its own for them).
//
// Each module's hook lists are immutable vectors replaced on every change
// (copy-on-write): call() takes a snapshot under the lock and runs it without
// the lock, so hooks may register or remove hooks, or call modules, and a
// hook being run is never destroyed under itself (the snapshot owns it).
// Removal also sets a flag on the record, which the run checks before each
// hook, so a hook removed by an earlier hook of the same call does not run.
// The lists own the hooks; handles only point at them (weakly).

#include <torch_monitor/nn/hooks.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <torch/nn/module.h>

namespace torch_monitor::nn {
namespace detail {

struct HookRecord {
  const torch::nn::Module* key = nullptr;
  // Tells this module from a later one at the same address.
  std::weak_ptr<torch::nn::Module> owner;
  bool post = false;
  ForwardPreHook pre;
  ForwardHook hook;
  std::atomic<bool> removed{false};
};

namespace {

using HookList = std::vector<std::shared_ptr<HookRecord>>;

struct ModuleHooks {
  std::weak_ptr<torch::nn::Module> owner;
  std::shared_ptr<const HookList> pre = std::make_shared<const HookList>();
  std::shared_ptr<const HookList> post = std::make_shared<const HookList>();
};

bool sameOwner(
    const std::weak_ptr<torch::nn::Module>& a,
    const std::weak_ptr<torch::nn::Module>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

// Hooks in the lists of the registry, over all modules; call() takes its
// fast path at zero. A namespace-scope atomic (constant-initialised, so
// reading it needs no guard for a function-local static).
std::atomic<size_t> gHookCount{0};

// Old hook lists, destroyed only after the registry lock is released: a
// list may hold the last reference to a hook, whose captured objects may do
// anything in their destructors (remove other hooks, take the lock).
using Garbage = std::vector<std::shared_ptr<const HookList>>;

class Registry {
 public:
  // Never destroyed: handles may remove hooks during static destruction.
  static Registry& instance() {
    static Registry* registry = new Registry();
    return *registry;
  }

  void add(const std::shared_ptr<HookRecord>& record, bool prepend) {
    Garbage garbage; // declared first: destroyed after the lock is released
    std::lock_guard<std::mutex> guard(mutex_);
    ModuleHooks& entry = modules_[record->key];
    if (!sameOwner(entry.owner, record->owner)) {
      // New, or left by a destroyed module at this address: start afresh.
      forget(entry, garbage);
      entry.owner = record->owner;
    }
    std::shared_ptr<const HookList>& list =
        record->post ? entry.post : entry.pre;
    auto updated = std::make_shared<HookList>();
    updated->reserve(list->size() + 1);
    if (prepend) {
      updated->push_back(record);
    }
    updated->insert(updated->end(), list->begin(), list->end());
    if (!prepend) {
      updated->push_back(record);
    }
    garbage.push_back(std::exchange(list, std::move(updated)));
    gHookCount.fetch_add(1, std::memory_order_release);
    maybeSweep(garbage);
  }

  void remove(HookRecord& record) {
    if (record.removed.exchange(true, std::memory_order_acq_rel)) {
      return;
    }
    Garbage garbage;
    std::lock_guard<std::mutex> guard(mutex_);
    const auto it = modules_.find(record.key);
    if (it == modules_.end() || !sameOwner(it->second.owner, record.owner)) {
      return; // its module is gone and the entry was already dropped
    }
    ModuleHooks& entry = it->second;
    std::shared_ptr<const HookList>& list = record.post ? entry.post : entry.pre;
    auto updated = std::make_shared<HookList>();
    updated->reserve(list->size());
    for (const auto& r : *list) {
      if (r.get() != &record) {
        updated->push_back(r);
      }
    }
    if (updated->size() == list->size()) {
      return;
    }
    garbage.push_back(std::exchange(list, std::move(updated)));
    gHookCount.fetch_sub(1, std::memory_order_release);
    if (entry.pre->empty() && entry.post->empty()) {
      modules_.erase(it);
    }
  }

  // The hooks of `module` now, or null when it has none.
  std::shared_ptr<const HookList> snapshot(
      const torch::nn::Module& module,
      bool post) {
    Garbage garbage;
    std::lock_guard<std::mutex> guard(mutex_);
    const auto it = modules_.find(&module);
    if (it == modules_.end()) {
      return nullptr;
    }
    // A live owner means `module` is the object the hooks were registered
    // on: its memory cannot have been reused while it is alive.
    if (it->second.owner.expired()) {
      forget(it->second, garbage);
      modules_.erase(it);
      return nullptr;
    }
    return post ? it->second.post : it->second.pre;
  }

 private:
  Registry() = default;

  // Empties an entry whose module is gone (or that is new).
  void forget(ModuleHooks& entry, Garbage& garbage) {
    const size_t n = entry.pre->size() + entry.post->size();
    if (n != 0) {
      gHookCount.fetch_sub(n, std::memory_order_release);
    }
    garbage.push_back(
        std::exchange(entry.pre, std::make_shared<const HookList>()));
    garbage.push_back(
        std::exchange(entry.post, std::make_shared<const HookList>()));
  }

  // Frees the hooks (and what they captured) of destroyed modules, amortised
  // over registrations: a module has no destructor callback to tell us.
  void maybeSweep(Garbage& garbage) {
    if (modules_.size() < sweepAt_) {
      return;
    }
    for (auto it = modules_.begin(); it != modules_.end();) {
      if (it->second.owner.expired()) {
        forget(it->second, garbage);
        it = modules_.erase(it);
      } else {
        ++it;
      }
    }
    sweepAt_ = std::max<size_t>(kMinSweep, 2 * modules_.size());
  }

  static constexpr size_t kMinSweep = 64;

  std::mutex mutex_;
  std::unordered_map<const torch::nn::Module*, ModuleHooks> modules_;
  size_t sweepAt_ = kMinSweep;
};

std::shared_ptr<HookRecord> newRecord(torch::nn::Module& module, bool post) {
  auto record = std::make_shared<HookRecord>();
  record->key = &module;
  record->owner = module.weak_from_this();
  TORCH_CHECK_VALUE(
      !record->owner.expired(),
      "torch_monitor: hooks can only be registered on a module owned by a "
      "std::shared_ptr, and this ",
      module.name(),
      " is not; create it with std::make_shared<",
      module.name(),
      ">(...) or through a module holder (torch::nn::Linear(...), a "
      "TORCH_MODULE type), or register it as a submodule");
  record->post = post;
  return record;
}

} // namespace

bool anyHooks() noexcept {
  return gHookCount.load(std::memory_order_acquire) != 0;
}

void runPreHooks(torch::nn::Module& module, const ForwardArgs& args) {
  const auto hooks = Registry::instance().snapshot(module, /*post=*/false);
  if (!hooks) {
    return;
  }
  for (const auto& record : *hooks) {
    if (!record->removed.load(std::memory_order_acquire)) {
      record->pre(module, args);
    }
  }
}

void runPostHooks(
    torch::nn::Module& module,
    const ForwardArgs& args,
    ForwardOutput& output) {
  const auto hooks = Registry::instance().snapshot(module, /*post=*/true);
  if (!hooks) {
    return;
  }
  for (const auto& record : *hooks) {
    if (!record->removed.load(std::memory_order_acquire)) {
      record->hook(module, args, output);
    }
  }
}

} // namespace detail

HookHandle::HookHandle() noexcept = default;
HookHandle::~HookHandle() = default;
HookHandle::HookHandle(const HookHandle&) = default;
HookHandle::HookHandle(HookHandle&&) noexcept = default;
HookHandle& HookHandle::operator=(const HookHandle&) = default;
HookHandle& HookHandle::operator=(HookHandle&&) noexcept = default;

HookHandle::HookHandle(std::shared_ptr<detail::HookRecord> record) {
  records_.push_back(record);
}

void HookHandle::remove() {
  for (const auto& weak : records_) {
    // Expired: already removed (and freed) or swept with its module.
    if (const auto record = weak.lock()) {
      detail::Registry::instance().remove(*record);
    }
  }
}

bool HookHandle::active() const noexcept {
  for (const auto& weak : records_) {
    const auto record = weak.lock();
    if (record && !record->removed.load(std::memory_order_acquire) &&
        !record->owner.expired()) {
      return true;
    }
  }
  return false;
}

void HookHandle::merge(const HookHandle& other) {
  records_.insert(records_.end(), other.records_.begin(), other.records_.end());
}

HookHandle registerForwardPreHook(
    torch::nn::Module& module,
    ForwardPreHook hook,
    bool prepend) {
  TORCH_CHECK_VALUE(
      static_cast<bool>(hook),
      "torch_monitor: registerForwardPreHook needs a callable, got an empty "
      "std::function");
  auto record = detail::newRecord(module, /*post=*/false);
  record->pre = std::move(hook);
  detail::Registry::instance().add(record, prepend);
  return HookHandle(std::move(record));
}

HookHandle registerForwardHook(
    torch::nn::Module& module,
    ForwardHook hook,
    bool prepend) {
  TORCH_CHECK_VALUE(
      static_cast<bool>(hook),
      "torch_monitor: registerForwardHook needs a callable, got an empty "
      "std::function");
  auto record = detail::newRecord(module, /*post=*/true);
  record->hook = std::move(hook);
  detail::Registry::instance().add(record, prepend);
  return HookHandle(std::move(record));
}

} // namespace torch_monitor::nn
