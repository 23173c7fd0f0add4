#pragma once

// The engine of watch(model) (docs/watch.md), shared by the three worlds:
// the keys a watch observes, their statistics in one buffer of slots on
// the model's device, the gate that says on the device whether the current
// step is observed, and the windows that close with one host read of all
// slots and log one "torch_monitor.Watch" event. It knows nothing of
// modules, hooks or optimizers: the Python package (torch_monitor/watch.py)
// and the C++ Watch (watch/watch.h) attach those and hand every
// observation to observe(), which the op torch_monitor::watch_observe_
// also calls. What a window logs is watch/window_events.h's; how it travels
// and merges across ranks, watch/payload.h's.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/util/ArrayRef.h>

#include <torch_monitor/detail/fork_safe_locks.h>
#include <torch_monitor/event.h>
#include <torch_monitor/export.h>
#include <torch_monitor/watch/non_finite.h>

namespace torch_monitor {
class EventHandler;
struct RankGroup;
namespace sinks {
class TensorBoardWriter;
} // namespace sinks
} // namespace torch_monitor

namespace torch_monitor::watch {

// Name of the events a watch logs when its window closes (one number per
// "<path>.<kind>.<statistic>"; registered as statistics, see
// registerEvents), and of those naming the keys that saw non-finite values
// (each key's first step with one in the window, once per window: at the
// step change after that step, or a later one while a device has not
// caught up, or when the window closes).
inline constexpr const char* kEventName = "torch_monitor.Watch";
inline constexpr const char* kNonFiniteEventName = "torch_monitor.NonFinite";
// The path of the whole model's keys: "total.grad" ("total.update")
// observes, once per step, every gradient (update) observed in that step
// together: its norm is the model's total gradient norm (update norm), its
// ratio ||dW|| / ||W before|| over the model. No parameter or module may
// have this path.
inline constexpr const char* kTotalPath = "total";

// Registers kEventName as an event of statistics (statistics_events.h), so
// that the sinks of statistics take a watch's windows. Done when the
// library loads (script/registration.cpp), before any sink is made.
TORCH_MONITOR_API void registerEvents();

// What an observation is (spec: watch.md, "Semantics to build").
enum class Kind : int8_t {
  Grad, // a parameter's gradient as the optimizer step uses it
  Weight, // a parameter after an optimizer step
  Update, // the change of a parameter across one optimizer step
  Output, // a module's output in forward
  OutputGrad, // the gradient flowing into that output in backward
};
// "grad", "weight", "update", "output", "output_grad".
TORCH_MONITOR_API std::string_view kindName(Kind kind) noexcept;
// The kind named so; c10::ValueError naming the five otherwise.
TORCH_MONITOR_API Kind kindFromName(std::string_view name);

// How a recorder windows and publishes its statistics; a plain value.
struct RecorderOptions {
  // Exactly one of them is set (> 0): windows of training steps
  // [0, n), [n, 2n), ... like Stat(window_steps=n), or of time.
  int64_t windowSteps = 0;
  std::chrono::milliseconds windowSize{0};
  // Observe on steps divisible by `every` only.
  int64_t every = 1;
  // With a writer: a histogram of each observed tensor, tag "<key>", on
  // steps divisible by histogramsEvery (0: none).
  int64_t histogramsEvery = 0;
  std::shared_ptr<sinks::TensorBoardWriter> writer;
  // Add the device allocator's counters to each window's event.
  bool memory = false;
  // Merge every rank's windows on rank 0 (rank_sync.h); `group` nullptr is
  // the process default group.
  bool syncRanks = false;
  std::shared_ptr<const RankGroup> group;
  // What follows a "torch_monitor.NonFinite" event.
  OnNonFinite onNonFinite = OnNonFinite::Log;
  // Time windows only: the window timer (engine/window_timer.h) closes a
  // window once it ends, even when no step change comes (a stalled run).
  bool closeOnTime = false;
};

// One key: "<path>.<kind>", e.g. "fc1.weight.grad" or "fc1.output".
// Thread safety: a plain value.
struct Key {
  std::string path;
  Kind kind;
  std::string name() const;
};

// Thread safety: every method may be called from any thread; observations,
// step changes and window closes are serialised by one mutex per recorder
// (an observation holds it for its dispatch of a few kernels on a device,
// or for its scan of a CPU tensor); events are logged outside it.
class TORCH_MONITOR_API Recorder
    : public std::enable_shared_from_this<Recorder> {
 public:
  // Keys in slot order; statistics kept on `device`. Throws
  // c10::ValueError for options that do not make sense (no window or two,
  // every < 1, histograms without a writer), for a path that is empty or
  // not text (invalid UTF-8, a NUL: it would reach the sinks), for a key
  // given twice (its statistics would overwrite each other's) and for the
  // meta device (it holds no statistics to read).
  static std::shared_ptr<Recorder> create(
      std::vector<Key> keys,
      RecorderOptions options,
      c10::Device device);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // The process-wide id the op finds this recorder by (see find()).
  int64_t id() const noexcept {
    return id_;
  }
  const std::vector<Key>& keys() const noexcept {
    return keys_;
  }
  const RecorderOptions& options() const noexcept {
    return options_;
  }
  // The slot buffer ([keys, column::kColumns] float64) and the gate (0-d
  // int64: the step when it is observed, -1 when it is not), on the
  // statistics' device. The op takes them as arguments so that compiled
  // graphs see what it mutates and reads; they are these very tensors.
  at::Tensor slots() const;
  at::Tensor gate() const;
  c10::Device device() const;
  // Adds one observation of each values[i] to key keys[i] (for Update keys,
  // `before` holds the weights before the step, one per value; else it is
  // empty). Tensors that are undefined, empty or not floating point are
  // skipped. `slots` and `gate` are slots() and gate() (or what a compiled
  // graph passes for them). A CPU tensor is scanned in place, on this
  // thread, when the gate is open; a tensor on a device only queues device
  // work (gated there), so nothing waits for the device. On steps divisible
  // by histogramsEvery, also writes each tensor's histogram (which reads it).
  // Arguments checkObservation() refuses are refused before anything is
  // observed.
  void observe(
      const at::Tensor& slots,
      const at::Tensor& gate,
      at::TensorList values,
      c10::IntArrayRef keys,
      at::TensorList before);
  // observe() for the recorder with `id` (the op's kernel): checks the
  // arguments, then does nothing more when the recorder is gone (removed
  // while a compiled graph still calls the op). c10::ValueError for an id
  // no watch of this process ever had.
  static void observeById(
      int64_t id,
      const at::Tensor& slots,
      const at::Tensor& gate,
      at::TensorList values,
      c10::IntArrayRef keys,
      at::TensorList before);
  static std::shared_ptr<Recorder> find(int64_t id);
  // Refuses, with a c10::ValueError or c10::TypeError saying what to pass,
  // the arguments of an observation that would corrupt memory or be
  // misread: slots that are not a contiguous [keys, kColumns] float64
  // tensor on the watch's device (expanded, transposed or sliced slots
  // were written out of bounds or into the wrong cells), a gate that is not
  // one int64 element on the slots' device, counts that disagree, keys
  // out of range, `before` given for other keys than updates (or not
  // given for updates) or not shaped like its value, values on a device
  // when the statistics are on the CPU, and meta tensors. `recorder`
  // nullptr (gone): what can be checked without it. `metaKernel`: the
  // op's Meta kernel (tracing), where every tensor is on the meta device
  // and nothing is read; a mix of meta and real tensors is refused there.
  static void checkObservation(
      const Recorder* recorder,
      const at::Tensor& slots,
      const at::Tensor& gate,
      at::TensorList values,
      c10::IntArrayRef keys,
      at::TensorList before,
      bool metaKernel = false);
  // What must be the same on every rank for their windows to merge (the
  // keys, the window, the cadence, the memory counters, the row layout),
  // as rank 0's warning about a refused rank says it.
  const std::string& shape() const noexcept {
    return shape_;
  }

  // The training step changed (setStep tells every recorder): closes the
  // window it ends, and opens or shuts the gate for this step.
  void onStep(int64_t step);
  // An optimizer step happened (Python's optimizer hook, C++
  // Watch::step): when the program sets no training step, the recorder
  // counts these as its steps.
  void optimizerStepped();
  // The step observations are taken at now (the training step, else the
  // count of optimizer steps).
  int64_t currentStep() const;
  // The step of the open window's event when remove(), close() or the
  // destructor closes it (stepOfEarlyClose() before its end).
  int64_t closeStep() const;

  // Closes the open window now and logs it (nothing when it saw nothing).
  void close();
  // close(), then stops following the step; observe() does nothing after.
  void remove();
  bool removed() const;

  // Closes every live recorder's window (at exit: the Python exit sequence,
  // and std::atexit for C++ programs).
  static void closeAll() noexcept;

  // Also gives each "torch_monitor.NonFinite" event of this recorder to
  // `handler` (nullptr: none), after the registered handlers and before
  // options().onNonFinite's warning or error; what it throws propagates
  // as that error would (Python's on_nonfinite=callable).
  void setNonFiniteHandler(std::shared_ptr<EventHandler> handler);

 private:
  Recorder(std::vector<Key> keys, RecorderOptions options, c10::Device device);
  struct Closed; // a window read from the slots
  struct StepListener;
  struct Timed; // what the window timer calls (closeOnTime)
  std::vector<Event> closeEndedWindow(int64_t& openEndMs);
  void startLocked(int64_t step);
  void setGateLocked(int64_t step);
  // Reads and resets the slots, unless nothing can have been observed
  // since the last close (then the window is empty and nothing is read).
  // `onlyIfObserved`: also skip the read when the device path was used but
  // observe() was not called since (the destructor: at exit, a device may
  // already be gone).
  std::optional<Closed> closeLocked(
      std::optional<int64_t> eventStep,
      bool onlyIfObserved = false);
  // Logs the window (or posts it to rank 0), then reports its non-finite
  // values (reportNonFinite).
  void publish(Closed closed);
  // publish() up to the dispatch: posts the window to rank 0 when syncing
  // (then returns nothing), else returns its Watch event.
  std::vector<Event> eventsToLog(Closed closed);
  // The keys whose non-finite values were not reported yet in this window,
  // from `rows` (the slots, read on the host), as one event; marks them
  // reported. `step`: the event's.
  std::optional<Event> nonFiniteEventLocked(
      const double* rows,
      std::optional<int64_t> step);
  // Between windows: on the CPU, reads the slots; on a device, harvests
  // the copy of the counts queued before if it has arrived, and queues
  // the next (never waiting for the device).
  std::optional<Event> checkNonFiniteLocked();
  // Logs the event, then does what onNonFinite and the handler say.
  void reportNonFinite(std::optional<Event> event);
  // Adds each total's pending row to its slot as one observation (the
  // step's total norm); at each step change and close.
  void foldTotalsLocked();
  void observeChecked(
      const at::Tensor& slots,
      const at::Tensor& gate,
      at::TensorList values,
      c10::IntArrayRef keys,
      at::TensorList before);
  void writeHistograms(
      at::TensorList values,
      c10::IntArrayRef keys,
      at::TensorList before,
      int64_t step);
  // An observation that takes the device path, its row computed later in
  // one batch with the call's others.
  struct DeviceObservation {
    at::Tensor values;
    at::Tensor before; // undefined unless an update
    int64_t key;
  };
  // The rows of `observations` ([n, kColumns] on slotsDevice, in order),
  // computed in batches (rowsOnDevice): a few dozen ops per batch, not per
  // tensor.
  at::Tensor rowsOnDeviceLocked(
      const std::vector<DeviceObservation>& observations,
      c10::Device slotsDevice);
  // A batch's segment bounds on `device` (see rowsOnDevice), made once per
  // layout of tensor sizes: a watch's optimizer calls repeat the same few.
  // Each is kept with its pinned host source, so that a CUDA graph that
  // captured its copy replays it from memory that still holds the bounds.
  at::Tensor segmentOffsetsLocked(
      const std::vector<int64_t>& numels,
      c10::Device device);
  static constexpr int64_t kBatchElements = int64_t(1) << 22;
  static constexpr size_t kMaxSegmentLayouts = 64;
  struct SegmentOffsets {
    at::Tensor host;
    at::Tensor onDevice;
  };

  const int64_t id_;
  const std::vector<Key> keys_;
  const RecorderOptions options_;
  std::string syncName_; // "torch_monitor.Watch#<n>" when syncing ranks
  uint64_t layoutHash_ = 0; // of the keys: ranks merge equal layouts only
  std::string shape_; // see shape()
  std::shared_ptr<StepListener> listener_;
  std::unique_ptr<Timed> timed_; // joined to the window timer

  mutable std::mutex mutex_;
  // A child of fork() gets mutex_ back unlocked, whoever held it (a close
  // reading the device may hold it long: fork() does not wait for it).
  detail::ForkSafeLocks forkLocks_{
      detail::ForkLockMode::kResetInChild, {&mutex_}};
  at::Tensor slots_;
  at::Tensor gate_;
  int64_t gateValue_ = 0; // what gate_ holds
  std::atomic<int64_t> ownSteps_{0}; // optimizer steps, when no step is set
  int64_t windowIndex_ = 0; // the open window: step / windowSteps, or time
  int64_t windowEndMs_ = 0; // time windows: end of the open one
  // The step the last window read was stamped with: a time window ending
  // at that step again stays open until the step moves, so that no two
  // windows of a key land on one step (TensorBoard would keep one).
  std::optional<int64_t> lastStep_;
  std::vector<int64_t> histogramStep_; // per key: last step written
  // Layout (device, then the sizes) -> its segment bounds.
  std::map<std::vector<int64_t>, SegmentOffsets> segmentOffsets_;
  // Whether anything was observed since the last close. A graph captured
  // for replay (CUDA graphs) observes without calling observe(), so once the
  // device path was used (deviceUsed_) every close reads the slots.
  bool observedSinceClose_ = false;
  bool deviceUsed_ = false;
  bool removed_ = false;
  // The whole model's keys, "total.grad" and "total.update": each one's
  // slot (-1: not watched) and the merged row of what the current step
  // observed of its kind ([1, kColumns] beside the slots), which becomes
  // one observation of it when the step ends.
  struct Total {
    int64_t key = -1;
    at::Tensor pending;
    bool used = false; // pending holds something of this step
  };
  std::array<Total, 2> totals_; // grad, update
  // Non-finite values: per key whether this window reported it; the
  // device's counts and first steps ([2, keys], pinned host memory) copied
  // at a step change, and the event that says the copy has arrived.
  std::vector<bool> nonFiniteReported_;
  at::Tensor nonFiniteHost_;
  std::optional<c10::Event> nonFiniteCopied_;
  std::shared_ptr<EventHandler> nonFiniteHandler_;
  Total* totalOf(Kind kind);
  // The total an observation of `key` adds to; nullptr when none (its kind
  // has no total, the total is not watched, or `key` is the total's own).
  Total* totalFedBy(int64_t key);
};

} // namespace torch_monitor::watch
