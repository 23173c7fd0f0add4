#include <torch_monitor/detail/lifecycle.h>

#include <atomic>
#include <cstdlib>

#include <pthread.h>

namespace torch_monitor::detail {
namespace {

constexpr int kForkStages = static_cast<int>(ForkStage::kCount);
constexpr int kExitStages = static_cast<int>(ExitStage::kCount);

// Constant-initialised: usable by the parts' own static initialisers,
// whatever the order in which the library's files are initialised.
std::atomic<const ForkHooks*> forkHooks[kForkStages] = {};
std::atomic<void (*)()> exitHooks[kExitStages] = {};
std::atomic<uint64_t> generation{0};
std::atomic<bool> atExitInstalled{false};

// The hooks the fork under way prepared, for its parent and child hooks: a
// stage registered after prepare() ran has nothing to undo. Only the forking
// thread touches it (glibc runs one fork's handlers at a time).
const ForkHooks* prepared[kForkStages] = {};

void prepare() {
  for (int i = 0; i < kForkStages; ++i) {
    prepared[i] = forkHooks[i].load(std::memory_order_acquire);
    if (prepared[i] != nullptr && prepared[i]->prepare != nullptr) {
      prepared[i]->prepare();
    }
  }
}

void inParent() {
  for (int i = kForkStages - 1; i >= 0; --i) {
    if (prepared[i] != nullptr && prepared[i]->inParent != nullptr) {
      prepared[i]->inParent();
    }
  }
}

void inChild() {
  generation.fetch_add(1, std::memory_order_relaxed);
  for (int i = kForkStages - 1; i >= 0; --i) {
    if (prepared[i] != nullptr && prepared[i]->inChild != nullptr) {
      prepared[i]->inChild();
    }
  }
}

// The one pthread_atfork() call, made when the library is loaded.
const bool kForkHooksInstalled =
    pthread_atfork(&prepare, &inParent, &inChild) == 0;

void runExitHook(ExitStage stage) {
  if (auto* hook = exitHooks[static_cast<int>(stage)].exchange(nullptr)) {
    hook();
  }
}

// A hook registered by another one (rank sync's closes the live Stats,
// which may register theirs) still runs if its stage is later.
void runAtExit() {
  for (int i = 0; i < static_cast<int>(ExitStage::kFileWriters); ++i) {
    runExitHook(static_cast<ExitStage>(i));
  }
}

// Destroyed with the library's static objects: after every atexit hook
// registered, and every static object built, after the library was loaded.
struct RunAtUnload {
  ~RunAtUnload() {
    runExitHook(ExitStage::kFileWriters);
  }
} runAtUnload;

} // namespace

void onFork(ForkStage stage, const ForkHooks& hooks) noexcept {
  forkHooks[static_cast<int>(stage)].store(&hooks, std::memory_order_release);
}

uint64_t forkGeneration() noexcept {
  return generation.load(std::memory_order_relaxed);
}

void onExit(ExitStage stage, void (*hook)()) noexcept {
  exitHooks[static_cast<int>(stage)].store(hook);
  // Installed by the first stage that runs at exit, not when the library is
  // loaded: the hook then runs before the library's static objects (and the
  // program's built before that first use) are destroyed.
  if (stage != ExitStage::kFileWriters &&
      !atExitInstalled.exchange(true)) {
    std::atexit(&runAtExit);
  }
}

} // namespace torch_monitor::detail
