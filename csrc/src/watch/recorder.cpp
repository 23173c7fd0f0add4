#include <torch_monitor/watch/recorder.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <limits>
#include <unordered_map>
#include <utility>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sub.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <torch_monitor/background_warnings.h>
#include <torch_monitor/clock.h>
#include <torch_monitor/detail/call_each.h>
#include <torch_monitor/detail/text.h>
#include <torch_monitor/engine/window_timer.h>
#include <torch_monitor/event_handler.h>
#include <torch_monitor/rank_sync.h>
#include <torch_monitor/rank_sync/protocol.h>
#include <torch_monitor/sinks/tensorboard_writer.h>
#include <torch_monitor/stat.h>
#include <torch_monitor/statistics_events.h>
#include <torch_monitor/step.h>
#include <torch_monitor/watch/memory.h>
#include <torch_monitor/watch/payload.h>
#include <torch_monitor/watch/statistics.h>
#include <torch_monitor/watch/window_events.h>

namespace torch_monitor::watch {

void registerEvents() {
  registerStatisticsEvent(kEventName, StatisticSuffix::kLastPart);
}

using column::kColumns;

namespace {

constexpr std::string_view kKindNames[] = {
    "grad", "weight", "update", "output", "output_grad"};

void dispatchAll(const std::vector<Event>& events) {
  detail::callEach(
      events, [](const Event& event) { detail::dispatchEvent(event); });
}

// Live recorders by id. Never destroyed: recorders may outlive static
// destruction's order (a Python object freed at exit).
struct Registry {
  std::mutex mutex;
  // Taken by every observation: a child of fork() finds it free.
  detail::ForkSafeLocks forkLocks{detail::ForkLockMode::kInner, {&mutex}};
  std::unordered_map<int64_t, std::weak_ptr<Recorder>> byId;
  int64_t nextId = 1;
  int64_t synced = 0; // recorders that sync ranks, for their Store names

  static Registry& get() {
    static Registry* registry = [] {
      auto* r = new Registry();
      // The rank sync's exit hook (flush) must run after ours (close and
      // post): exit hooks run in reverse order, so it is registered first.
      (void)defaultRankGroup();
      std::atexit([] { Recorder::closeAll(); });
      return r;
    }();
    return *registry;
  }
};

// What a watch observes of a tensor: a sparse one's stored values,
// coalesced (nn.Embedding(sparse=True)'s gradient repeats the indices of
// repeated inputs, whose values add up; on a GPU coalescing synchronises,
// as the optimizer's own coalesce of that gradient does); a compressed one
// (CSR, CSC, BSR, BSC) its values; any other as it is.
at::Tensor observedValues(const at::Tensor& x) {
  if (!x.defined()) {
    return x;
  }
  switch (x.layout()) {
    case at::kSparse:
      return x.coalesce().values();
    case at::kSparseCsr:
    case at::kSparseCsc:
    case at::kSparseBsr:
    case at::kSparseBsc:
      return x.values();
    default:
      return x;
  }
}

// Whether an observation has nothing to add: no elements, neither floating
// point nor complex (a complex tensor is observed as its magnitudes), or an
// update without the weight before the step.
bool nothingToObserve(const at::Tensor& x, const at::Tensor* before) {
  return !x.defined() || x.numel() == 0 ||
      !(at::isFloatingType(x.scalar_type()) ||
        at::isComplexType(x.scalar_type())) ||
      (before != nullptr && !before->defined());
}

} // namespace

std::string_view kindName(Kind kind) noexcept {
  return kKindNames[static_cast<int>(kind)];
}

Kind kindFromName(std::string_view name) {
  for (int i = 0; i < 5; ++i) {
    if (kKindNames[i] == name) {
      return static_cast<Kind>(i);
    }
  }
  TORCH_CHECK_VALUE(
      false,
      "torch_monitor.watch: unknown kind '",
      std::string(name),
      "'; what= takes \"grad\", \"weight\", \"update\", \"output\" and "
      "\"output_grad\"");
}

std::string Key::name() const {
  return path + "." + std::string(kindName(kind));
}

// A window read from the slots: the host copy of every row, and what its
// event needs.
struct Recorder::Closed {
  at::Tensor rows; // [keys, kColumns] float64 on the CPU
  std::optional<int64_t> step;
  int64_t index = 0; // the window's index, for the ranks
  std::vector<std::pair<std::string, int64_t>> memory;
  std::optional<Event> nonFinite; // keys the window had not reported yet
};

struct Recorder::StepListener final : detail::StepListener {
  std::weak_ptr<Recorder> recorder;
  void onStep(int64_t step) override {
    if (auto r = recorder.lock()) {
      r->onStep(step);
    }
  }
};

// The window timer's view of a recorder with closeOnTime.
struct Recorder::Timed final : detail::TimedWindows {
  explicit Timed(Recorder* r) : recorder(r) {}
  std::vector<Event> closeEndedWindow(int64_t& openEndMs) override {
    return recorder->closeEndedWindow(openEndMs);
  }
  Recorder* recorder; // leaves the timer before it is destroyed
};

Recorder::Recorder(
    std::vector<Key> keys,
    RecorderOptions options,
    c10::Device device)
    : id_([] {
        Registry& r = Registry::get();
        std::lock_guard<std::mutex> guard(r.mutex);
        return r.nextId++;
      }()),
      keys_(std::move(keys)),
      options_(std::move(options)) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  slots_ = at::empty({int64_t(keys_.size()), kColumns}, f64);
  resetSlots(slots_);
  gate_ = at::scalar_tensor(0, f64.dtype(at::kLong));
  for (size_t k = 0; k < keys_.size(); ++k) {
    Total* total = totalOf(keys_[k].kind);
    if (total != nullptr && keys_[k].path == kTotalPath) {
      total->key = int64_t(k);
      total->pending = at::empty({1, kColumns}, f64);
      resetSlots(total->pending);
    }
  }
  histogramStep_.assign(keys_.size(), -1);
  nonFiniteReported_.assign(keys_.size(), false);
  layoutHash_ = layoutHashOf(keys_);
  shape_ = shapeOf(keys_, options_, layoutHash_);
}

std::shared_ptr<Recorder> Recorder::create(
    std::vector<Key> keys,
    RecorderOptions options,
    c10::Device device) {
  TORCH_CHECK_VALUE(
      options.windowSteps >= 0,
      "torch_monitor.watch: window_steps must be at least 1, got ",
      options.windowSteps);
  const bool bySteps = options.windowSteps > 0;
  const bool byTime = options.windowSize.count() > 0;
  TORCH_CHECK_VALUE(
      bySteps != byTime,
      "torch_monitor.watch: give exactly one window: window_steps (training "
      "steps) or window_size (time), got ",
      bySteps && byTime ? "both" : "neither (or a window of 0)");
  TORCH_CHECK_VALUE(
      !options.closeOnTime || byTime,
      "torch_monitor.watch: close_on_time closes time windows when they end; "
      "with window_steps a window ends at a step change, which closes it "
      "anyway: give window_size, or drop close_on_time");
  TORCH_CHECK_VALUE(
      options.every >= 1,
      "torch_monitor.watch: every must be at least 1 (observe every k-th "
      "step), got ",
      options.every);
  TORCH_CHECK_VALUE(
      options.histogramsEvery >= 0,
      "torch_monitor.watch: histograms_every must be at least 1 (or None), "
      "got ",
      options.histogramsEvery);
  TORCH_CHECK_VALUE(
      options.histogramsEvery == 0 || options.writer != nullptr,
      "torch_monitor.watch: histograms_every needs a writer "
      "(a torch_monitor.TensorBoardWriter) to write the histograms to");
  TORCH_CHECK_VALUE(
      !keys.empty(),
      "torch_monitor.watch: nothing to watch (no parameter or module "
      "matched)");
  // Paths reach every sink as event keys (Python, JSON, C APIs), and each
  // key owns one row of slots: the same text check as every other name of
  // the library, and each key once.
  std::unordered_map<std::string, size_t> seen;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string where =
        "torch_monitor.watch: the path of key " + std::to_string(i);
    TORCH_CHECK_VALUE(
        !keys[i].path.empty(),
        where,
        " is empty; give each watched tensor its parameter or module path "
        "(\"fc1.weight\", \"fc1\")");
    detail::checkText(keys[i].path, where);
    const auto [it, fresh] = seen.emplace(keys[i].name(), i);
    TORCH_CHECK_VALUE(
        fresh,
        "torch_monitor.watch: the key '",
        it->first,
        "' is given twice (keys ",
        it->second,
        " and ",
        i,
        "); their statistics would overwrite each other's: give each path "
        "and kind once");
  }
  TORCH_CHECK_VALUE(
      !device.is_meta(),
      "torch_monitor.watch: the meta device holds no values, so no "
      "statistics could be read from it; keep them on the model's real "
      "device (device='cpu' or 'cuda')");
  std::shared_ptr<Recorder> r(
      new Recorder(std::move(keys), std::move(options), device));
  {
    Registry& registry = Registry::get();
    std::lock_guard<std::mutex> guard(registry.mutex);
    registry.byId.emplace(r->id_, r);
    if (r->options_.syncRanks) {
      r->syncName_ = "torch_monitor.Watch#" + std::to_string(registry.synced++);
    }
  }
  if (r->options_.syncRanks) {
    detail::enableRankSync(r.get(), r->options_.group, r->syncName_);
  }
  {
    std::lock_guard<std::mutex> guard(r->mutex_);
    r->startLocked(r->currentStep());
  }
  r->listener_ = std::make_shared<StepListener>();
  r->listener_->recorder = r;
  detail::addStepListener(r->listener_);
  if (r->options_.closeOnTime) {
    r->timed_ = std::make_unique<Timed>(r.get());
    detail::joinWindowTimer(r->timed_.get());
  }
  return r;
}

Recorder::~Recorder() {
  if (timed_) {
    detail::leaveWindowTimer(timed_.get());
  }
  if (listener_) {
    detail::removeStepListener(listener_.get());
  }
  {
    Registry& registry = Registry::get();
    std::lock_guard<std::mutex> guard(registry.mutex);
    registry.byId.erase(id_);
  }
  if (!removed_) {
    // A recorder nobody removed logs its last window, as a Stat does.
    try {
      std::optional<Closed> closed;
      {
        std::lock_guard<std::mutex> guard(mutex_);
        removed_ = true;
        closed = closeLocked(closeStep(), /*onlyIfObserved=*/true);
      }
      if (closed) {
        publish(std::move(*closed));
      }
    } catch (const std::exception& e) {
      TORCH_WARN(
          "torch_monitor.watch: could not log the last window: ", e.what());
    }
  }
  if (options_.syncRanks) {
    detail::disableRankSync(this);
  }
}

at::Tensor Recorder::slots() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return slots_;
}

at::Tensor Recorder::gate() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return gate_;
}

c10::Device Recorder::device() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return slots_.device();
}

bool Recorder::removed() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return removed_;
}

int64_t Recorder::currentStep() const {
  return getStep().value_or(ownSteps_.load(std::memory_order_relaxed));
}

int64_t Recorder::closeStep() const {
  // Step windows close at the set_step that ends them, so the open one is
  // always before its end; a time window lands one step after the last step
  // too, as it may share its opening step with the window closed there.
  // Own steps already count the optimizer step just taken.
  return stepOfEarlyClose().value_or(ownSteps_.load(std::memory_order_relaxed));
}

void Recorder::startLocked(int64_t step) {
  if (options_.windowSteps > 0) {
    windowIndex_ = step / options_.windowSteps;
  } else {
    const int64_t length = options_.windowSize.count();
    windowEndMs_ = (readClock(ClockSource::PRECISE) / length + 1) * length;
  }
  setGateLocked(step);
}

void Recorder::setGateLocked(int64_t step) {
  // The one place the cadence is decided: everything observed afterwards,
  // eager or compiled or replayed from a captured graph, reads the gate.
  const int64_t value = step % options_.every == 0 ? step : -1;
  if (value != gateValue_) {
    gate_.fill_(value);
    gateValue_ = value;
  }
}

Recorder::Total* Recorder::totalOf(Kind kind) {
  switch (kind) {
    case Kind::Grad:
      return &totals_[0];
    case Kind::Update:
      return &totals_[1];
    default:
      return nullptr;
  }
}

Recorder::Total* Recorder::totalFedBy(int64_t key) {
  Total* total = totalOf(keys_[key].kind);
  return total != nullptr && total->key >= 0 && total->key != key ? total
                                                                  : nullptr;
}

void Recorder::foldTotalsLocked() {
  for (Total& total : totals_) {
    if (!total.used) {
      continue;
    }
    total.used = false;
    if (slots_.is_cpu()) {
      double* pending = total.pending.data_ptr<double>();
      asOneObservation(pending);
      mergeRow(slots_.data_ptr<double>() + total.key * kColumns, pending);
      fillIdentity(pending);
      continue;
    }
    // On the device: the gate still says whether the ending step was
    // observed, and is the step of a non-finite value in it.
    asOneObservation(total.pending);
    mergeRowsOnDevice(slots_.narrow(0, total.key, 1), total.pending, gate_);
    resetSlots(total.pending); // after the merge, queued behind it
  }
}

void Recorder::onStep(int64_t step) {
  std::optional<Closed> closed;
  std::optional<Event> nonFinite;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (removed_) {
      return;
    }
    foldTotalsLocked();
    if (options_.windowSteps > 0) {
      const int64_t index = step / options_.windowSteps;
      if (index != windowIndex_) {
        closed = closeLocked(step);
        windowIndex_ = index;
      }
    } else {
      const int64_t now = readClock(ClockSource::PRECISE);
      if (now >= windowEndMs_ && lastStep_ != step) {
        closed = closeLocked(step);
        const int64_t length = options_.windowSize.count();
        windowEndMs_ = (now / length + 1) * length;
      }
    }
    if (!closed) {
      nonFinite = checkNonFiniteLocked();
    }
    setGateLocked(step);
  }
  if (closed) {
    publish(std::move(*closed));
  } else {
    reportNonFinite(std::move(nonFinite));
  }
}

void Recorder::optimizerStepped() {
  bool own = false;
  int64_t step = 0;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    ++ownSteps_;
    own = !getStep().has_value();
    step = ownSteps_;
  }
  if (own) {
    onStep(step);
  }
}

std::optional<Recorder::Closed> Recorder::closeLocked(
    std::optional<int64_t> eventStep,
    bool onlyIfObserved) {
  foldTotalsLocked(); // the step in progress: what it observed so far
  Closed c;
  c.step = eventStep;
  const bool read = observedSinceClose_ || (deviceUsed_ && !onlyIfObserved);
  observedSinceClose_ = false;
  if (read) {
    // The one host read of the window, on the stream that wrote last; the
    // reset is queued behind it there.
    std::optional<c10::StreamGuard> onWriter;
    if (!slots_.is_cpu()) {
      onWriter.emplace(c10::impl::VirtualGuardImpl(slots_.device().type())
                           .getStream(slots_.device()));
    }
    c.rows = slots_.is_cpu() ? slots_.clone() : slots_.to(at::kCPU);
    resetSlots(slots_);
    lastStep_ = eventStep;
    c.nonFinite =
        nonFiniteEventLocked(c.rows.const_data_ptr<double>(), eventStep);
  }
  // The next window reports its own; a copy still in flight is of this
  // one (and has arrived: the read above waited for the stream).
  std::fill(nonFiniteReported_.begin(), nonFiniteReported_.end(), false);
  nonFiniteCopied_.reset();
  if (options_.windowSteps > 0) {
    c.index = windowIndex_;
  } else {
    c.index = rankTimeWindowIndex(windowEndMs_, options_.windowSize.count());
  }
  if (options_.memory) {
    c.memory = deviceMemoryStats(slots_.device());
  }
  return c;
}

void Recorder::publish(Closed c) {
  std::optional<Event> nonFinite = std::move(c.nonFinite);
  dispatchAll(eventsToLog(std::move(c)));
  reportNonFinite(std::move(nonFinite));
}

std::vector<Event> Recorder::eventsToLog(Closed c) {
  // Nothing observed: nothing to log here, and an empty marker for the ranks
  // (rank 0 still merges the window: other ranks may have observed).
  const bool empty = !c.rows.defined();
  const double* rows = empty ? nullptr : c.rows.const_data_ptr<double>();
  if (options_.syncRanks) {
    std::vector<uint8_t> payload = emptyPayload();
    if (!empty) {
      Payload p;
      p.layoutHash = layoutHash_;
      p.step = c.step.value_or(-1);
      p.hasMemory = !c.memory.empty();
      for (size_t i = 0; i < c.memory.size() && i < Payload::kMemoryStats;
           ++i) {
        p.memory[i] = c.memory[i].second;
      }
      p.rows.assign(rows, rows + c.rows.numel());
      payload = encodePayload(p);
    }
    // Ranks whose watches differ (another model, other include/exclude,
    // another window, `every` or `memory`: see shape()) are refused by
    // rank 0 and log their windows themselves. Merged on the rank sync
    // thread from copies: this recorder may be gone by then.
    if (detail::postRankPayload(
            this,
            "watch " + syncName_,
            c.index,
            std::move(payload),
            emptyPayload(),
            shape_,
            payloadMerger(keys_, layoutHash_))) {
      return {};
    }
  }
  if (empty) {
    return {};
  }
  return windowEvents(keys_, rows, c.step, c.memory, std::nullopt);
}

std::vector<Event> Recorder::closeEndedWindow(int64_t& openEndMs) {
  std::optional<Closed> closed;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (removed_) {
      openEndMs = 0;
      return {};
    }
    // Read on this clock, as onStep() reads it: a later step change never
    // sees a time before the window closed here.
    const int64_t now = readClock(ClockSource::PRECISE);
    const int64_t length = options_.windowSize.count();
    if (now >= windowEndMs_ && lastStep_ == currentStep()) {
      // A window landed at this step already: this one waits for the step
      // to move (the timer looks again a window later).
      openEndMs = (now / length + 1) * length;
      return {};
    }
    if (now >= windowEndMs_) {
      closed = closeLocked(currentStep());
      windowEndMs_ = (now / length + 1) * length;
    }
    openEndMs = windowEndMs_;
  }
  if (!closed) {
    return {};
  }
  // The NonFinite event is logged here too; warn, raise and the handler
  // act at step changes, on the training thread, not on the timer's.
  std::optional<Event> nonFinite = std::move(closed->nonFinite);
  std::vector<Event> events = eventsToLog(std::move(*closed));
  if (nonFinite) {
    events.push_back(std::move(*nonFinite));
  }
  return events;
}

std::optional<Event> Recorder::nonFiniteEventLocked(
    const double* rows,
    std::optional<int64_t> step) {
  Event event;
  for (size_t k = 0; k < keys_.size(); ++k) {
    const double* row = rows + k * kColumns;
    if (!nonFiniteReported_[k] && row[column::kNonFinite] > 0.0) {
      nonFiniteReported_[k] = true;
      event.data.emplace(
          keys_[k].name(),
          firstNonFiniteStep(row));
    }
  }
  if (event.data.empty()) {
    return std::nullopt;
  }
  event.name = kNonFiniteEventName;
  event.timestamp = std::chrono::system_clock::now();
  event.step = step;
  return event;
}

std::optional<Event> Recorder::checkNonFiniteLocked() {
  if (!observedSinceClose_ && !deviceUsed_) {
    return std::nullopt;
  }
  if (slots_.is_cpu()) {
    return nonFiniteEventLocked(
        slots_.const_data_ptr<double>(), currentStep());
  }
  // The copy goes on the stream the observations were queued on, behind
  // them; the event says when it has arrived. One copy in flight at a time:
  // a device running behind reports at a later step change, with the
  // same first steps (the slots keep them).
  const c10::Device device = slots_.device();
  if (!nonFiniteCopied_) {
    if (!nonFiniteHost_.defined()) {
      nonFiniteHost_ = at::empty(
          slots_.sizes(),
          at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
    }
    nonFiniteHost_.copy_(slots_, /*non_blocking=*/true);
    nonFiniteCopied_.emplace(device.type());
    nonFiniteCopied_->record(
        c10::impl::VirtualGuardImpl(device.type()).getStream(device));
  }
  if (!nonFiniteCopied_->query()) {
    return std::nullopt;
  }
  nonFiniteCopied_.reset();
  return nonFiniteEventLocked(
      nonFiniteHost_.const_data_ptr<double>(), currentStep());
}

void Recorder::reportNonFinite(std::optional<Event> event) {
  if (!event) {
    return;
  }
  std::shared_ptr<EventHandler> handler;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    handler = nonFiniteHandler_;
  }
  detail::dispatchEvent(*event);
  if (handler) {
    handler->handle(*event);
  }
  if (options_.onNonFinite == OnNonFinite::Log) {
    return;
  }
  // The earliest first, by name within a step; a model's worth of keys
  // would drown the message: the event names them all.
  std::vector<std::pair<int64_t, std::string>> bad;
  for (const auto& [key, value] : event->data) {
    bad.emplace_back(std::get<int64_t>(value), key);
  }
  std::sort(bad.begin(), bad.end());
  constexpr size_t kNamed = 8;
  std::string message = "torch_monitor.watch: NaN or inf in " +
      std::to_string(bad.size()) + " watched tensor" +
      (bad.size() == 1 ? "" : "s") + ": ";
  for (size_t i = 0; i < bad.size() && i < kNamed; ++i) {
    message += (i == 0 ? "" : ", ") + bad[i].second + " (first at step " +
        std::to_string(bad[i].first) + ")";
  }
  if (bad.size() > kNamed) {
    message += " and " + std::to_string(bad.size() - kNamed) +
        " more (the \"torch_monitor.NonFinite\" event names them all)";
  }
  if (options_.onNonFinite == OnNonFinite::Warn) {
    detail::warnThroughBackgroundSink(message);
  } else {
    raiseNonFinite(message);
  }
}

void Recorder::setNonFiniteHandler(std::shared_ptr<EventHandler> handler) {
  std::lock_guard<std::mutex> guard(mutex_);
  nonFiniteHandler_ = std::move(handler);
}

void Recorder::close() {
  std::optional<Closed> closed;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    // A second close() at one step leaves what came since for the next
    // window, rather than land a second window on that step.
    if (removed_ || lastStep_ == closeStep()) {
      return;
    }
    closed = closeLocked(closeStep());
  }
  if (closed) {
    publish(std::move(*closed));
  }
}

void Recorder::remove() {
  std::optional<Closed> closed;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (removed_) {
      return;
    }
    removed_ = true;
    closed = closeLocked(closeStep());
  }
  if (listener_) {
    detail::removeStepListener(listener_.get());
  }
  if (timed_) {
    detail::leaveWindowTimer(timed_.get());
  }
  if (closed) {
    publish(std::move(*closed));
  }
}

void Recorder::closeAll() noexcept {
  std::vector<std::shared_ptr<Recorder>> live;
  {
    Registry& r = Registry::get();
    std::lock_guard<std::mutex> guard(r.mutex);
    for (const auto& [id, weak] : r.byId) {
      if (auto recorder = weak.lock()) {
        live.push_back(std::move(recorder));
      }
    }
  }
  std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) {
    return a->id_ < b->id_;
  });
  for (const auto& recorder : live) {
    try {
      recorder->close();
    } catch (const std::exception& e) {
      TORCH_WARN(
          "torch_monitor.watch: could not log a watch's last window: ",
          e.what());
    }
  }
}

std::shared_ptr<Recorder> Recorder::find(int64_t id) {
  Registry& r = Registry::get();
  std::lock_guard<std::mutex> guard(r.mutex);
  const auto it = r.byId.find(id);
  return it == r.byId.end() ? nullptr : it->second.lock();
}

void Recorder::observeById(
    int64_t id,
    const at::Tensor& slots,
    const at::Tensor& gate,
    at::TensorList values,
    c10::IntArrayRef keys,
    at::TensorList before) {
  std::shared_ptr<Recorder> r;
  {
    Registry& registry = Registry::get();
    std::lock_guard<std::mutex> guard(registry.mutex);
    TORCH_CHECK_VALUE(
        id >= 1 && id < registry.nextId,
        "watch_observe_: no watch ever had the id ",
        id,
        "; pass the id of the watch whose slots these are (Watch.id())");
    const auto it = registry.byId.find(id);
    if (it != registry.byId.end()) {
      r = it->second.lock();
    }
  }
  checkObservation(r.get(), slots, gate, values, keys, before);
  if (r) {
    r->observeChecked(slots, gate, values, keys, before);
  }
}

void Recorder::checkObservation(
    const Recorder* recorder,
    const at::Tensor& slots,
    const at::Tensor& gate,
    at::TensorList values,
    c10::IntArrayRef keys,
    at::TensorList before,
    bool metaKernel) {
  constexpr const char* kPass =
      "; pass the watch's own slots and gate (Watch.slots(), Watch.gate())";
  TORCH_CHECK_VALUE(
      values.size() == keys.size(),
      "watch_observe_: ",
      values.size(),
      " tensors for ",
      keys.size(),
      " keys; pass one key per value");
  TORCH_CHECK_VALUE(
      before.empty() || before.size() == values.size(),
      "watch_observe_: `before` holds ",
      before.size(),
      " tensors for ",
      values.size(),
      " values; pass one weight before the step per value (update keys), "
      "or none");
  TORCH_CHECK_VALUE(
      slots.defined() && gate.defined(),
      "watch_observe_: slots and gate must be tensors",
      kPass);
  // Where nothing is read (the Meta kernel, while tracing) every tensor is
  // a meta tensor; anywhere else none may be (it holds no values), and a
  // mix would have the Meta kernel drop real observations silently.
  const bool meta = metaKernel && slots.is_meta();
  auto checkMeta = [&](const at::Tensor& t, const std::string& what) {
    if (t.is_meta() == meta) {
      return;
    }
    TORCH_CHECK_VALUE(
        !t.is_meta(),
        "watch_observe_: ",
        what,
        " is a tensor on the meta device, which holds no values to observe "
        "or write; pass tensors on a real device");
    TORCH_CHECK_VALUE(
        false,
        "watch_observe_: the slots are on the meta device, which holds no "
        "statistics, while ",
        what,
        " is a real tensor; pass the watch's own slots (Watch.slots())");
  };
  checkMeta(slots, "slots");
  checkMeta(gate, "gate");
  // The host path writes rows through a raw pointer at key * kColumns and
  // the device path narrows rows of the slots: both need the dense
  // row-major layout of the watch's own buffer.
  TORCH_CHECK_TYPE(
      slots.scalar_type() == at::kDouble,
      "watch_observe_: slots must be float64, got ",
      slots.scalar_type(),
      kPass);
  TORCH_CHECK_VALUE(
      slots.dim() == 2 && slots.size(1) == kColumns &&
          (recorder == nullptr ||
           slots.size(0) == int64_t(recorder->keys_.size())),
      "watch_observe_: slots must have the shape [",
      recorder == nullptr ? std::string("keys")
                          : std::to_string(recorder->keys_.size()),
      ", ",
      kColumns,
      "] (one row per key), got ",
      slots.sizes(),
      kPass);
  TORCH_CHECK_VALUE(
      slots.is_contiguous(),
      "watch_observe_: slots must be contiguous (not expanded, transposed "
      "or sliced: rows are written in place), got strides ",
      slots.strides(),
      kPass);
  if (recorder != nullptr && !meta) {
    const c10::Device device = recorder->slots_.device();
    TORCH_CHECK_VALUE(
        slots.device() == device,
        "watch_observe_: slots are on ",
        slots.device(),
        " but the watch keeps its statistics on ",
        device,
        kPass);
  }
  TORCH_CHECK_TYPE(
      gate.scalar_type() == at::kLong,
      "watch_observe_: the gate must be int64 (the step observed, or -1), "
      "got ",
      gate.scalar_type(),
      kPass);
  TORCH_CHECK_VALUE(
      gate.numel() == 1,
      "watch_observe_: the gate must hold one number (the step observed, or "
      "-1), got ",
      gate.numel(),
      " elements",
      kPass);
  TORCH_CHECK_VALUE(
      gate.device() == slots.device(),
      "watch_observe_: the gate is on ",
      gate.device(),
      " and the slots on ",
      slots.device(),
      kPass);
  const int64_t rows = slots.size(0);
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t key = keys[i];
    TORCH_CHECK_VALUE(
        key >= 0 && key < rows,
        "watch_observe_: key ",
        key,
        " (for values[",
        i,
        "]) out of range: the watch has ",
        rows,
        " keys; pass indexes of Watch.keys()");
    const bool update =
        recorder != nullptr && recorder->keys_[key].kind == Kind::Update;
    TORCH_CHECK_VALUE(
        recorder == nullptr || update == !before.empty(),
        "watch_observe_: ",
        recorder == nullptr ? std::string()
                            : recorder->keys_[key].name(),
        update ? " is an update: pass the weight before the step in "
                 "`before` (one per value)"
               : " is not an update: pass `before` (the weights before the "
                 "step) only for update keys, in a call of their own");
    const at::Tensor& x = values[i];
    if (!x.defined()) {
      continue;
    }
    checkMeta(x, "values[" + std::to_string(i) + "]");
    if (!before.empty() && before[i].defined()) {
      const at::Tensor& b = before[i];
      checkMeta(b, "before[" + std::to_string(i) + "]");
      TORCH_CHECK_VALUE(
          b.sizes() == x.sizes() && b.scalar_type() == x.scalar_type() &&
              b.device() == x.device(),
          "watch_observe_: values[",
          i,
          "] and before[",
          i,
          "] (the weight after and before the step) must have the same "
          "shape, dtype and device, got ",
          x.sizes(),
          " ",
          x.scalar_type(),
          " on ",
          x.device(),
          " and ",
          b.sizes(),
          " ",
          b.scalar_type(),
          " on ",
          b.device());
    }
    TORCH_CHECK_VALUE(
        !slots.is_cpu() || x.is_cpu() || nothingToObserve(x, nullptr),
        "torch_monitor.watch: ",
        recorder == nullptr ? "values[" + std::to_string(i) + "]"
                            : recorder->keys_[key].name(),
        " is on ",
        x.device(),
        " but the watch keeps its statistics on the CPU (the model's "
        "device when watch() was called); moving them there would wait "
        "for the device at every step. Call watch() after model.to(device)");
  }
}

void Recorder::observe(
    const at::Tensor& slots,
    const at::Tensor& gate,
    at::TensorList values,
    c10::IntArrayRef keys,
    at::TensorList before) {
  checkObservation(this, slots, gate, values, keys, before);
  observeChecked(slots, gate, values, keys, before);
}

void Recorder::observeChecked(
    const at::Tensor& slots,
    const at::Tensor& gate,
    at::TensorList values,
    c10::IntArrayRef keys,
    at::TensorList before) {
  // The statistics are no part of any autograd graph.
  at::NoGradGuard noGrad;
  const bool slotsOnCpu = slots.is_cpu();
  const bool forceDevicePath = test_hooks::cpuTensorsTakeDevicePath();
  std::vector<DeviceObservation> onDevice;
  bool observed = false; // any value, for the histograms
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (removed_) {
      return;
    }
    int64_t gateValue = -1;
    bool gateRead = false;
    for (size_t i = 0; i < values.size(); ++i) {
      const at::Tensor x = observedValues(values[i]);
      const int64_t key = keys[i]; // in range: checkObservation
      const at::Tensor* b = before.empty() ? nullptr : &before[i];
      if (nothingToObserve(x, b)) {
        continue;
      }
      observed = true;
      // The host scan reads real floating point; complex tensors take the
      // ATen ops of the device path (on the CPU too), which see magnitudes.
      if (x.is_cpu() && slotsOnCpu && !forceDevicePath && !x.is_complex()) {
        // The host path: the gate is a CPU number, read here for free.
        if (!gateRead) {
          gateValue = *gate.const_data_ptr<int64_t>();
          gateRead = true;
        }
        if (gateValue >= 0) {
          double* row = slots.data_ptr<double>() + key * kColumns;
          if (Total* total = totalFedBy(key)) {
            // The observation's own row, for its key and the step's total.
            double own[kColumns];
            fillIdentity(own);
            observeOnHost(own, x, b, gateValue);
            mergeRow(row, own);
            mergeRow(total->pending.data_ptr<double>(), own);
            total->used = true;
          } else {
            observeOnHost(row, x, b, gateValue);
          }
          observedSinceClose_ = true;
        }
        continue;
      }
      onDevice.push_back({x, b == nullptr ? at::Tensor() : *b, key});
      observedSinceClose_ = true;
      deviceUsed_ = true;
    }
    if (!onDevice.empty()) {
      const at::Tensor stacked = rowsOnDeviceLocked(onDevice, slots.device());
      const int64_t n = int64_t(onDevice.size());
      std::vector<int64_t> rowKeys;
      for (const DeviceObservation& o : onDevice) {
        rowKeys.push_back(o.key);
      }
      bool contiguous = true;
      for (int64_t j = 1; j < n && contiguous; ++j) {
        contiguous = rowKeys[j] == rowKeys[0] + j;
      }
      if (contiguous) {
        mergeRowsOnDevice(slots.narrow(0, rowKeys[0], n), stacked, gate);
      } else {
        for (int64_t j = 0; j < n; ++j) {
          mergeRowsOnDevice(
              slots.narrow(0, rowKeys[j], 1), stacked.narrow(0, j, 1), gate);
        }
      }
      // The step's gradients and updates, into their pending totals: one
      // merged row when the call holds one kind (the optimizer's calls do),
      // else row by row (no index tensor: it would be copied from the host).
      Total* first = totalFedBy(rowKeys[0]);
      bool oneTotal = first != nullptr;
      for (int64_t j = 1; j < n && oneTotal; ++j) {
        oneTotal = totalFedBy(rowKeys[j]) == first;
      }
      if (oneTotal) {
        mergeRowsOnDevice(first->pending, mergedRow(stacked), gate);
        first->used = true;
      } else {
        for (int64_t j = 0; j < n; ++j) {
          if (Total* total = totalFedBy(rowKeys[j])) {
            mergeRowsOnDevice(total->pending, stacked.narrow(0, j, 1), gate);
            total->used = true;
          }
        }
      }
    }
  }
  if (options_.histogramsEvery > 0 && observed) {
    const int64_t step = currentStep();
    if (step % options_.histogramsEvery == 0) {
      writeHistograms(values, keys, before, step);
    }
  }
}

at::Tensor Recorder::rowsOnDeviceLocked(
    const std::vector<DeviceObservation>& observations,
    c10::Device slotsDevice) {
  std::vector<at::Tensor> rows;
  size_t first = 0;
  while (first < observations.size()) {
    // A batch: the next observations on the same device, all real or all
    // complex, up to kBatchElements elements (a larger tensor alone), so
    // that the joined copy of a batch stays small.
    const at::Tensor& head = observations[first].values;
    int64_t elements = head.numel();
    size_t last = first + 1;
    while (last < observations.size()) {
      const at::Tensor& x = observations[last].values;
      if (x.device() != head.device() || x.is_complex() != head.is_complex() ||
          elements + x.numel() > kBatchElements) {
        break;
      }
      elements += x.numel();
      ++last;
    }
    std::vector<at::Tensor> values;
    std::vector<at::Tensor> before;
    std::vector<int64_t> numels;
    for (size_t i = first; i < last; ++i) {
      values.push_back(observations[i].values);
      if (observations[i].before.defined()) {
        before.push_back(observations[i].before);
      }
      numels.push_back(observations[i].values.numel());
    }
    // An optimizer call passes only updates (with `before`) or none.
    TORCH_INTERNAL_ASSERT(before.empty() || before.size() == values.size());
    const at::Tensor offsets = values.size() == 1
        ? at::Tensor()
        : segmentOffsetsLocked(numels, head.device());
    rows.push_back(rowsOnDevice(values, before, offsets)
                       .to(slotsDevice, /*non_blocking=*/true));
    first = last;
  }
  return rows.size() == 1 ? rows[0] : at::cat(rows);
}

at::Tensor Recorder::segmentOffsetsLocked(
    const std::vector<int64_t>& numels,
    c10::Device device) {
  std::vector<int64_t> layout = {
      static_cast<int64_t>(device.type()), device.index()};
  layout.insert(layout.end(), numels.begin(), numels.end());
  auto found = segmentOffsets_.find(layout);
  if (found != segmentOffsets_.end()) {
    return found->second.onDevice;
  }
  if (segmentOffsets_.size() >= kMaxSegmentLayouts) {
    segmentOffsets_.clear(); // a program whose calls never repeat
  }
  at::Tensor host = at::empty(
      {static_cast<int64_t>(numels.size()) + 1}, at::TensorOptions(at::kLong));
  int64_t* bound = host.data_ptr<int64_t>();
  bound[0] = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    bound[i + 1] = bound[i] + numels[i];
  }
  if (!device.is_cpu()) {
    // Pinned, so that the copy does not wait for the device (where pinning
    // is not supported the copy from pageable memory blocks, as it must).
    try {
      host = host.pin_memory();
    } catch (const c10::Error&) {
    }
  }
  at::Tensor onDevice = host.to(device, /*non_blocking=*/true);
  return segmentOffsets_.emplace(std::move(layout), SegmentOffsets{host, onDevice})
      .first->second.onDevice;
}

void Recorder::writeHistograms(
    at::TensorList values,
    c10::IntArrayRef keys,
    at::TensorList before,
    int64_t step) {
  for (size_t i = 0; i < values.size(); ++i) {
    const at::Tensor x = observedValues(values[i]);
    const at::Tensor* b = before.empty() ? nullptr : &before[i];
    if (nothingToObserve(x, b)) {
      continue;
    }
    const int64_t key = keys[i];
    {
      // One histogram per key and step: the first observation of it (a
      // gradient accumulated over several backwards is observed each time).
      std::lock_guard<std::mutex> guard(mutex_);
      if (histogramStep_[key] == step) {
        continue;
      }
      histogramStep_[key] = step;
    }
    at::Tensor shown = b == nullptr ? x : at::sub(x, *b);
    if (shown.is_complex()) {
      shown = at::abs(shown); // magnitudes, as the statistics
    }
    try {
      options_.writer->addHistogram(keys_[key].name(), shown, step);
    } catch (const c10::ValueError&) {
      // No finite value to draw (a diverged layer): the histogram is left
      // out, and the window's non-finite counts say why. Raising here
      // would stop the training step the watch observes.
    }
  }
}

} // namespace torch_monitor::watch
