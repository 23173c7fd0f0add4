#include <torch_monitor/pytorch_counters.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <thread>

#include <c10/util/DynamicCounter.h>
#include <c10/util/Exception.h>
#include <c10/util/WaitCounter.h>

#include <torch_monitor/background_warnings.h>
#include <torch_monitor/detail/fork_safe_locks.h>
#include <torch_monitor/detail/lifecycle.h>
#include <torch_monitor/detail/pattern.h>
#include <torch_monitor/detail/text.h>
#include <torch_monitor/detail/thread_slots.h>
#include <torch_monitor/engine/gauge_windows.h>
#include <torch_monitor/rank_sync.h>
#include <torch_monitor/stat.h>

namespace torch_monitor {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSlots = PytorchCounterCapture::kMaxCaptures;

int64_t nanosecondsOf(Clock::time_point t) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             t.time_since_epoch())
      .count();
}

} // namespace

// One key of one capture: its Stat, freed by whoever drops the last
// reference: the capture (remove()) or a unit still being added to it, so
// that remove() never waits for a unit whose window close runs event
// handlers (a Python one may wait for the GIL that remove()'s caller holds).
// Thread safety: refs is atomic; the Stat is thread-safe.
struct CapturedKey {
  explicit CapturedKey(std::unique_ptr<Stat<double>> s) : stat(std::move(s)) {}
  std::unique_ptr<Stat<double>> stat;
  std::atomic<int64_t> refs{1}; // the capture's, plus one per unit adding

  void release() noexcept {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Logs the open window (a throwing handler is a warning there).
      delete this;
    }
  }
};

// What a capture holds: the slot readers find it in, and one CapturedKey
// per key it has taken.
struct PytorchCounterCapture::State {
  int slot = -1;
  int64_t startNs = 0; // units that started before are not the capture's
  PytorchCounterOptions options;
  std::optional<std::regex> include;
  std::optional<std::regex> exclude;
  // Guards keys; rebuilt in a child of fork() (a thread of the parent may
  // have held it there, making a key's Stat).
  detail::ForkSafeMutex mutex;
  // Every key asked about; nullptr for those the capture does not take.
  std::map<std::string, CapturedKey*> keys;
  // The ".active" counts and dynamic counters, read at each window's close.
  std::shared_ptr<detail::GaugeWindows> gauges;
  // The keys with units running at the last close: each is logged 0 at the
  // next close that finds none, so that no sink keeps the last count as if
  // they still ran. Only the gauges' reads touch it, one at a time.
  std::set<std::string> runningAtLastClose;

  bool takes(const std::string& key) const {
    return (!include || std::regex_search(key, *include)) &&
        !(exclude && std::regex_search(key, *exclude));
  }
  // The CapturedKey of `key`, made now if needed; nullptr when the capture
  // does not take the key (or its Stat cannot be made: warned once).
  CapturedKey* keyOf(const std::string& key) {
    std::lock_guard<std::recursive_mutex> lock(mutex.current());
    auto found = keys.find(key);
    if (found != keys.end()) {
      return found->second;
    }
    CapturedKey* captured = nullptr;
    if (takes(key)) {
      try {
        captured = new CapturedKey(makeStat(key));
      } catch (const std::exception& e) {
        TORCH_WARN(
            "torch_monitor: PyTorch's counter '",
            key,
            "' cannot be captured: ",
            detail::errorMessage(e));
      }
    }
    // nullptr is kept too: the key is asked about once per capture.
    return keys.emplace(key, captured).first->second;
  }

 private:
  std::unique_ptr<Stat<double>> makeStat(const std::string& key) const {
    std::vector<Aggregation> aggregations{
        Aggregation::COUNT, Aggregation::SUM, Aggregation::MAX, Aggregation::MEAN};
    auto stat = options.windowSteps > 0
        ? std::make_unique<Stat<double>>(
              key, std::move(aggregations), WindowSteps{options.windowSteps})
        : std::make_unique<Stat<double>>(
              key,
              std::move(aggregations),
              options.windowSize,
              Stat<double>::kUnlimitedSamples,
              options.closeOnTime ? WindowClose::ON_TIME : WindowClose::LAZY);
    if (options.syncRanks) {
      stat->syncRanks(options.group);
    }
    return stat;
  }
};

namespace {

using CaptureState = PytorchCounterCapture::State;

class KeyState;

// How many captures are running: the whole of start()'s work when none is
// (a global, so that the test is one load, with no guard of a lazily made
// object before it).
std::atomic<int> runningCaptures{0};

// The process-wide registry the backends read. Captures sit in slots;
// stop() reads them inside a read section, which runs no event handler, and
// a removed capture's slot is reused only once every read section that
// could have seen it has ended. A thread with a thread slot marks its own
// cell, with plain stores (c10's hot path pays no atomic read-modify-write);
// the removal's heavyBarrier() pairs with the section's lightBarrier(), the
// handshake of a Stat's shards (thread_shard.h). Threads beyond the slots
// count themselves in shared counters of two epochs, so that neither a
// stream of new readers nor a reader that read the epoch long ago is missed.
struct Registry {
  std::mutex slotsMutex; // serialises adding and removing captures
  std::array<std::atomic<CaptureState*>, kSlots> slots{};
  std::atomic<int> slotsEnd{0}; // 1 + the highest slot in use
  // Per thread slot, a cache line each: bumped by its thread on entering
  // (odd: inside) and on leaving a read section.
  struct alignas(64) SectionCell {
    std::atomic<uint64_t> count{0};
  };
  std::array<SectionCell, detail::kMaxThreadSlots> sections{};
  std::atomic<uint64_t> epoch{0}; // the overflow threads'
  std::array<std::atomic<int64_t>, 2> readers{};
  // Every key's state, newest first. Never freed (c10 keeps a key's counter
  // for the process), so the list only grows. Lock-free, so that a window's
  // close can walk it under any lock.
  std::atomic<KeyState*> keys{nullptr};
  // slotsMutex waits for readers (a child starts it unlocked).
  detail::ForkSafeLocks slowLocks{
      detail::ForkLockMode::kResetInChild, {&slotsMutex}};
};

// Leaked: c10 calls the backends until the process ends. Made when the
// library loads, before kRegistered below registers the backends; a plain
// pointer, so that c10's hot path reads it without a guard.
Registry* const theRegistry = new Registry;

Registry& registry() noexcept {
  return *theRegistry;
}

class ReadSection {
 public:
  ReadSection() noexcept : registry_(registry()), slot_(detail::threadSlot()) {
    if (slot_ != detail::kOverflowSlot) {
      bump(std::memory_order_relaxed);
      // The mark before the slots are read (waitForReaders' heavyBarrier()).
      detail::lightBarrier();
    } else {
      parity_ = registry_.epoch.load() & 1;
      registry_.readers[parity_].fetch_add(1);
    }
  }
  ~ReadSection() {
    if (slot_ != detail::kOverflowSlot) {
      bump(std::memory_order_release); // the reads before the mark
    } else {
      registry_.readers[parity_].fetch_sub(1);
    }
  }
  ReadSection(const ReadSection&) = delete;
  ReadSection& operator=(const ReadSection&) = delete;

 private:
  void bump(std::memory_order order) noexcept {
    std::atomic<uint64_t>& cell = registry_.sections[slot_].count;
    cell.store(cell.load(std::memory_order_relaxed) + 1, order);
  }

  Registry& registry_;
  const int slot_;
  uint64_t parity_ = 0;
};

// Ends once every read section begun before the call has ended. The caller
// emptied the slot before: once heavyBarrier() returns, a section either
// shows in its cell or reads the empty slot.
void waitForReaders() {
  Registry& r = registry();
  detail::heavyBarrier();
  for (auto& cell : r.sections) {
    const uint64_t seen = cell.count.load(std::memory_order_acquire);
    while ((seen & 1) != 0 &&
           cell.count.load(std::memory_order_acquire) == seen) {
      std::this_thread::yield();
    }
  }
  for (int flip = 0; flip < 2; ++flip) {
    const uint64_t parity = r.epoch.fetch_add(1) & 1;
    while (r.readers[parity].load() != 0) {
      std::this_thread::yield();
    }
  }
}

// One key's state, made when c10 first uses the key (KeyBackend below
// forwards c10's calls). With no capture active, start() is one relaxed load.
class KeyState {
 public:
  explicit KeyState(std::string_view key) : key_(key) {}

  // With no capture running, start() and stop() are a load, a test and a
  // return: the work is out of line, so that its register saves are not
  // made on that path.
  intptr_t start(Clock::time_point now) noexcept {
    if (runningCaptures.load(std::memory_order_relaxed) == 0) {
      return 0; // stop() skips it
    }
    return startCaptured(now);
  }
  void stop(Clock::time_point now, intptr_t ctx) noexcept {
    if (ctx != 0) {
      stopCaptured(now, ctx);
    }
  }

 private:
  [[gnu::noinline]] intptr_t startCaptured(Clock::time_point now) noexcept {
    // The library's own threads (the rank sync's Store traffic, a sink's
    // writer) time torch_monitor's work, not the program's.
    if (detail::onLibraryThread()) {
      return 0;
    }
    countRunning(1);
    return static_cast<intptr_t>(nanosecondsOf(now));
  }

  [[gnu::noinline]] void stopCaptured(
      Clock::time_point now,
      intptr_t ctx) noexcept {
    countRunning(-1);
    if (runningCaptures.load(std::memory_order_relaxed) == 0) {
      return;
    }
    const double micros = std::max(
        static_cast<double>(nanosecondsOf(now) - ctx) / 1e3, 0.0);
    // A sample within its key's open window is added inside the read
    // section, where remove() waits for it: that add closes nothing and
    // runs no handler. The keys whose add would close a window get a
    // reference there instead, and their adds (which may run handlers, a
    // Python one waiting for the GIL that remove()'s caller holds) come
    // after it.
    std::array<CapturedKey*, kSlots> taken;
    int count = 0;
    {
      Registry& r = registry();
      ReadSection section;
      const int end = r.slotsEnd.load();
      for (int slot = 0; slot < end; ++slot) {
        CaptureState* capture = r.slots[slot].load();
        if (capture == nullptr || capture->startNs > ctx) {
          continue;
        }
        CapturedKey* key = cache_[slot].load(std::memory_order_acquire);
        if (key == nullptr) {
          key = capture->keyOf(key_);
          cache_[slot].store(
              key == nullptr ? notTaken() : key, std::memory_order_release);
        }
        if (key != nullptr && key != notTaken() &&
            !addedWithinWindow(*key->stat, micros)) {
          key->refs.fetch_add(1, std::memory_order_relaxed);
          taken[count++] = key;
        }
      }
    }
    for (int i = 0; i < count; ++i) {
      record(*taken[i]->stat, micros);
      taken[i]->release();
    }
  }

 public:
  // The capture in `slot` is gone (no reader can see it): forget its Stat.
  void forget(int slot) noexcept {
    cache_[slot].store(nullptr, std::memory_order_relaxed);
  }

  const std::string& key() const noexcept {
    return key_;
  }
  // Units started while a capture ran and not stopped yet.
  int64_t active() const noexcept {
    int64_t sum = 0;
    for (const auto& cell : running_) {
      sum += cell.load(std::memory_order_relaxed);
    }
    return sum;
  }

  KeyState* next = nullptr; // the registry's list, set once

 private:
  // False when the add must wait for the read section's end (it would
  // close a window), or failed (record() then tries again and warns).
  static bool addedWithinWindow(Stat<double>& stat, double micros) noexcept {
    try {
      return stat.addIfWindowOpen(micros);
    } catch (...) {
      return false;
    }
  }

  void record(Stat<double>& stat, double micros) noexcept {
    // c10's stop() must not throw; the sample is added even when a
    // handler of the window it closes throws.
    try {
      stat.add(micros);
    } catch (const std::exception& e) {
      TORCH_WARN(
          "torch_monitor: an event handler failed while PyTorch's counter '",
          key_,
          "' was recorded: ",
          detail::errorMessage(e));
    } catch (...) {
      TORCH_WARN(
          "torch_monitor: an event handler failed while PyTorch's counter '",
          key_,
          "' was recorded");
    }
  }

  // The cache entry of a key its capture does not take (an address no
  // CapturedKey has; never dereferenced).
  static CapturedKey* notTaken() noexcept {
    static char mark;
    return reinterpret_cast<CapturedKey*>(&mark);
  }

  const std::string key_;
  // Per slot: the key's entry in that slot's capture, notTaken(), or
  // nullptr before the capture was asked.
  std::array<std::atomic<CapturedKey*>, kSlots> cache_{};
  // Units started minus units stopped, per thread slot (a unit may stop on
  // another thread than the one it started on: only the sum means
  // anything). A thread writes its own cell with a plain load and store,
  // which costs c10's hot path less than a shared atomic add; the threads
  // beyond the slots share the overflow cell, with atomic adds.
  std::array<std::atomic<int64_t>, detail::kMaxThreadSlots + 1> running_{};

  void countRunning(int64_t delta) noexcept {
    const int slot = detail::threadSlot();
    std::atomic<int64_t>& cell = running_[slot];
    if (slot == detail::kOverflowSlot) {
      cell.fetch_add(delta, std::memory_order_relaxed);
    } else {
      cell.store(
          cell.load(std::memory_order_relaxed) + delta,
          std::memory_order_relaxed);
    }
  }
};

// What c10 holds for a key. c10 keeps it for the process, but a caller of
// the factory may destroy it (the benchmarks do): the state it forwards to
// stays, as the registry's list must.
class KeyBackend final : public c10::monitor::detail::WaitCounterBackendIf {
 public:
  explicit KeyBackend(KeyState& state) : state_(state) {}
  intptr_t start(Clock::time_point now) noexcept override {
    return state_.start(now);
  }
  void stop(Clock::time_point now, intptr_t ctx) noexcept override {
    state_.stop(now, ctx);
  }

 private:
  KeyState& state_;
};

class KeyBackendFactory final
    : public c10::monitor::detail::WaitCounterBackendFactoryIf {
 public:
  std::unique_ptr<c10::monitor::detail::WaitCounterBackendIf> create(
      std::string_view key) noexcept override {
    try {
      auto* state = new KeyState(key);
      std::atomic<KeyState*>& head = registry().keys;
      state->next = head.load();
      while (!head.compare_exchange_weak(state->next, state)) {
      }
      return std::make_unique<KeyBackend>(*state);
    } catch (...) {
      return nullptr; // out of memory: c10 then ignores the key for us
    }
  }
};

// c10's dynamic counters (c10/util/DynamicCounter.h): c10 tells this
// backend of each counter made after the library loaded. The callbacks run
// under the mutex, so unregisterCounter() waits for those under way, as c10
// requires. Rebuilt in a forked child (not one of the locks fork() takes:
// a close reads the counters under locks of later fork stages).
// Thread safety: every method may be called from any thread.
class DynamicCounters final
    : public c10::monitor::detail::DynamicCounterBackendIf {
 public:
  void registerCounter(
      std::string_view key,
      c10::monitor::DynamicCounter::Callback callback) override {
    std::lock_guard<std::recursive_mutex> lock(mutex_.current());
    counters_.insert_or_assign(std::string(key), std::move(callback));
  }
  void unregisterCounter(std::string_view key) override {
    std::lock_guard<std::recursive_mutex> lock(mutex_.current());
    counters_.erase(std::string(key));
  }
  // Appends the value of each counter whose key `capture` takes.
  void read(const CaptureState& capture, detail::Gauges& out) {
    std::lock_guard<std::recursive_mutex> lock(mutex_.current());
    for (const auto& [key, callback] : counters_) {
      if (capture.takes(key)) {
        out.emplace_back(key, callback()); // c10: callbacks never throw
      }
    }
  }

 private:
  detail::ForkSafeMutex mutex_;
  std::map<std::string, c10::monitor::DynamicCounter::Callback> counters_;
};

// Owned by c10 (which never destroys its backends) once registered.
DynamicCounters* dynamicCounters = nullptr;

// What a capture reads when a window closes: "<key>.active" for each of its
// keys with units running (0 once when they stopped), and its dynamic
// counters.
detail::Gauges gaugesOf(CaptureState& capture) {
  detail::Gauges gauges;
  std::set<std::string> running;
  for (KeyState* k = registry().keys.load(); k != nullptr; k = k->next) {
    const int64_t active = k->active();
    const bool before = capture.runningAtLastClose.count(k->key()) != 0;
    if ((active > 0 || before) && capture.takes(k->key())) {
      gauges.emplace_back(k->key() + ".active", active);
      if (active > 0) {
        running.insert(k->key());
      }
    }
  }
  capture.runningAtLastClose = std::move(running);
  dynamicCounters->read(capture, gauges);
  return gauges;
}

void resetReadersInChild() {
  // The parent's other threads, which may have been reading, are not here.
  for (auto& cell : registry().sections) {
    cell.count.store(0);
  }
  for (auto& readers : registry().readers) {
    readers.store(0);
  }
}
constexpr detail::ForkHooks kForkHooks{nullptr, nullptr, resetReadersInChild};

// Registered when the library loads, so that every key first used after
// that reaches the captures.
const bool kRegistered = [] {
  detail::onFork(detail::ForkStage::kPytorchCounters, kForkHooks);
  c10::monitor::detail::registerWaitCounterBackend(
      std::make_unique<KeyBackendFactory>());
  auto dynamic = std::make_unique<DynamicCounters>();
  dynamicCounters = dynamic.get();
  c10::monitor::detail::registerDynamicCounterBackend(std::move(dynamic));
  return true;
}();

} // namespace

PytorchCounterCapture::PytorchCounterCapture(PytorchCounterOptions options)
    : options_(std::move(options)), state_(std::make_shared<State>()) {
  TORCH_CHECK_VALUE(
      options_.windowSteps >= 0,
      "capture_pytorch_counters: window_steps must be at least 1, got ",
      options_.windowSteps);
  if (options_.windowSteps > 0) {
    TORCH_CHECK_VALUE(
        !options_.closeOnTime,
        "capture_pytorch_counters: close_on_time applies to time windows "
        "(window_size); a window of training steps closes when set_step "
        "crosses its end");
  } else {
    const int64_t ms = options_.windowSize.count();
    TORCH_CHECK_VALUE(
        ms >= 1 && ms <= Stat<double>::kMaxWindowMs,
        "capture_pytorch_counters: window_size must be at least 1 ms (and "
        "at most datetime.timedelta.max), got ",
        ms,
        " ms");
  }
  state_->options = options_;
  if (options_.syncRanks && state_->options.group == nullptr) {
    // Resolved now: each key's Stat joins the group when the key first
    // comes, and the group must be the one the program meant at the start.
    state_->options.group = defaultRankGroup();
    TORCH_CHECK_VALUE(
        state_->options.group != nullptr,
        "capture_pytorch_counters: sync_ranks needs a rank group: set the "
        "process default one (Python: torch.distributed.init_process_group; "
        "C++: torch_monitor::setDefaultRankGroup) before starting the "
        "capture, or give options.group");
  }
  for (const auto& [pattern, what] :
       {std::pair{&options_.include, "include"},
        std::pair{&options_.exclude, "exclude"}}) {
    if (*pattern) {
      detail::checkText(**pattern, what);
    }
  }
  state_->include = detail::compiledPattern(
      options_.include, "capture_pytorch_counters: ", "include");
  state_->exclude = detail::compiledPattern(
      options_.exclude, "capture_pytorch_counters: ", "exclude");

  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.slotsMutex);
    for (int slot = 0; slot < kSlots && state_->slot < 0; ++slot) {
      if (r.slots[slot].load() == nullptr) {
        state_->slot = slot;
        state_->startNs = nanosecondsOf(Clock::now());
        r.slots[slot].store(state_.get());
        r.slotsEnd.store(std::max(r.slotsEnd.load(), slot + 1));
        runningCaptures.fetch_add(1);
      }
    }
  }
  TORCH_CHECK_VALUE(
      state_->slot >= 0,
      "capture_pytorch_counters: ",
      kMaxCaptures,
      " captures are active already; remove() one (or narrow one with "
      "include/exclude) before starting another");
  detail::GaugeWindowOptions gauges;
  gauges.windowSteps = options_.windowSteps;
  gauges.windowSize = options_.windowSize;
  if (options_.syncRanks) {
    // Named by the order of the synced captures, the same on every rank.
    static std::atomic<int64_t> synced{0};
    gauges.group = state_->options.group;
    gauges.syncName = "torch_monitor.PytorchCounters#" +
        std::to_string(synced.fetch_add(1));
    gauges.ranksKey = "pytorch_counters.ranks";
  }
  try {
    State* state = state_.get(); // outlives the gauges: remove()
    state_->gauges = detail::GaugeWindows::start(
        std::move(gauges), [state] { return gaugesOf(*state); });
  } catch (...) {
    remove();
    throw;
  }
}

PytorchCounterCapture::~PytorchCounterCapture() {
  try {
    remove();
  } catch (const std::exception& e) {
    TORCH_WARN(
        "torch_monitor: removing a capture of PyTorch's counters failed: ",
        detail::errorMessage(e));
  }
}

void PytorchCounterCapture::remove() {
  Registry& r = registry();
  std::map<std::string, CapturedKey*> keys;
  std::shared_ptr<detail::GaugeWindows> gauges;
  {
    std::lock_guard<std::mutex> lock(r.slotsMutex);
    if (state_->slot < 0) {
      return;
    }
    const int slot = state_->slot;
    r.slots[slot].store(nullptr);
    runningCaptures.fetch_sub(1);
    int end = r.slotsEnd.load();
    while (end > 0 && r.slots[end - 1].load() == nullptr) {
      --end;
    }
    r.slotsEnd.store(end);
    // Read sections run no event handler (nor Python), so this wait is
    // short; once it ends no backend can reach this capture, and its slot
    // may be reused.
    waitForReaders();
    for (KeyState* k = r.keys.load(); k != nullptr; k = k->next) {
      k->forget(slot);
    }
    state_->slot = -1;
    std::lock_guard<std::recursive_mutex> keysLock(state_->mutex.current());
    keys.swap(state_->keys);
    gauges.swap(state_->gauges);
  }
  // Outside the locks: each key's Stat logs its open window, running
  // handlers, here or, if a unit is being added to it, after that add.
  for (const auto& [name, key] : keys) {
    if (key != nullptr) {
      key->release();
    }
  }
  if (gauges) {
    gauges->close();
  }
}

bool PytorchCounterCapture::removed() const noexcept {
  std::lock_guard<std::mutex> lock(registry().slotsMutex);
  return state_->slot < 0;
}

std::vector<std::string> PytorchCounterCapture::keys() const {
  std::lock_guard<std::recursive_mutex> lock(state_->mutex.current());
  std::vector<std::string> out;
  for (const auto& [name, key] : state_->keys) {
    if (key != nullptr) {
      out.push_back(name);
    }
  }
  return out;
}

std::unique_ptr<PytorchCounterCapture> capturePytorchCounters(
    PytorchCounterOptions options) {
  return std::make_unique<PytorchCounterCapture>(std::move(options));
}

} // namespace torch_monitor
