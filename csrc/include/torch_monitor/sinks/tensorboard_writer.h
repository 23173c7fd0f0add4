#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>
#include <torch_monitor/sinks/rank_files.h>
#include <torch_monitor/sinks/sink.h>
#include <torch_monitor/statistics_events.h>

namespace at {
class Tensor; // declared only: this header stays free of ATen
} // namespace at

namespace torch_monitor::sinks {

// Configuration of a TensorBoardWriter; a plain value.
struct TensorBoardWriterOptions {
  // How often the background thread writes the buffered records (it also
  // writes sooner when the buffer fills).
  std::chrono::milliseconds flushInterval{1000};
  // Bound on buffered bytes; beyond it new scalars are dropped and counted.
  size_t maxBufferBytes = size_t(32) << 20;
  // Events whose values are written; empty = every event. By default every
  // event of statistics (statistics_events.h: Stats' windows, watches'
  // windows, and whatever else is registered when the writer is made).
  std::vector<std::string> eventNames = statisticsEventNames();
  // When not empty and an event holds an integer under this key, it is the
  // step of all the event's other values (and is not written itself), in
  // place of the event's own step.
  std::string stepKey;
  // In a distributed job (process_rank.h): each rank writes to
  // "<logdir>/rank<r>" (one TensorBoard run per rank), or only rank 0
  // writes, to logdir.
  RankFiles ranks = RankFiles::Separate;
};

// Writes events as TensorBoard scalars, without protobuf: an event-file
// `events.out.tfevents.<epoch s>.<host>.<pid>.<n>` in `logdir` (created if
// missing). For each accepted event (by default those a Stat logs, named
// "torch.monitor.Stat") every numeric value becomes one scalar: the data key
// is the tag, the event's timestamp the wall time, and the step the first
// of: the event's `stepKey` value (when configured and present), the
// event's step (a Stat's event carries the training step current when its
// window closed, see step.h), else a per-tag counter 0, 1, 2, ... (which
// only the points without a step advance). Doubles and ints are
// written as float32 (TensorBoard's simple_value), bools as 0/1, strings are
// skipped. addScalar() and addHistogram() write points directly, like
// SummaryWriter. In a distributed job the files go to a folder per rank, or
// only rank 0 writes (TensorBoardWriterOptions::ranks); the rank is read
// when the writer is made.
//
// handle() only encodes into memory (~0.1 µs per scalar); a background
// thread writes whole records every flushInterval, and on flush(), close(),
// destruction and process exit. Disk problems are warned once each and never
// thrown at the caller (see BufferedFileWriter).
//
//   auto tb = std::make_shared<TensorBoardWriter>("runs/exp1");
//   torch_monitor::registerEventHandler(tb);
//
// Thread safety: no concurrent call to any API of this type causes a data
// race; handle() may run on many threads at once.
class TORCH_MONITOR_API TensorBoardWriter final : public Sink {
 public:
  explicit TensorBoardWriter(
      std::string logdir,
      TensorBoardWriterOptions options = TensorBoardWriterOptions());
  ~TensorBoardWriter() override;

  void handle(const Event& event) override;

  // Writes one point directly, as SummaryWriter.add_scalar does, at `step`;
  // without one, at the training step (getStep()) when one is set, else at
  // the tag's next counter value (as an event without a step). A wall time
  // that is not finite (the default NaN) means now: TensorBoard's reader
  // rejects a NaN wall time.
  //   tb.addScalar("loss", loss, step);  // or tb.addScalar("loss", loss)
  void addScalar(
      std::string_view tag,
      double value,
      std::optional<int64_t> step = std::nullopt,
      double wallTime = std::numeric_limits<double>::quiet_NaN());
  // The same for a one-element real tensor (c10::ValueError / TypeError
  // otherwise). A CPU tensor is read at the call. A tensor on another
  // device is not waited for: its value is copied on the device, on the
  // calling thread's current stream (one small op: a later in-place change
  // of the tensor is not what is written), and read when the writer next
  // writes, every such point of a write in one copy to the host. The step
  // (given, else the training step) and the wall time are taken at the
  // call; a tag's counter, when neither step exists, when it is written.
  //   tb.addScalar("loss", loss);  // loss on a GPU: no synchronisation
  void addScalar(
      std::string_view tag,
      const at::Tensor& value,
      std::optional<int64_t> step = std::nullopt,
      double wallTime = std::numeric_limits<double>::quiet_NaN());

  // Writes the histogram of `values` (any shape, real or bool dtype, any
  // device) as SummaryWriter.add_histogram does with its default buckets
  // (see computeHistogram in format/histogram.h, which also says what is thrown
  // for bad values). The bucketing runs on the tensor's device on the
  // calling thread. A CPU tensor's histogram is then buffered and written
  // in the background like a scalar. Another device's is read as a device
  // tensor's addScalar value is, when the writer next writes, so the call
  // never waits for the device; a tensor with no value inside the buckets'
  // range is then reported as a warning at that write instead of thrown.
  // An omitted step is the training step (getStep()), else the tag's own
  // counter 0, 1, 2, ... (see stepFor in the .cpp). Wall time as in
  // addScalar.
  //
  //   if (step % 100 == 0)
  //     if (auto d = monitor->reducer()->peek())
  //       tb->addHistogram("fc.weight.update", *d, step);
  void addHistogram(
      std::string_view tag,
      const at::Tensor& values,
      std::optional<int64_t> step = std::nullopt,
      double wallTime = std::numeric_limits<double>::quiet_NaN());

  void flush() override;
  // Points (TensorBoard records: one per scalar value of an event, per
  // addScalar and per addHistogram) that were never written: over the
  // buffer bound, still unwritten at close or exit (a full disk), device
  // points over the deferred bound or that could not be read back.
  int64_t dropped() const override;

  // The log directory as given (what is saved with a TorchScript module).
  const std::string& logdir() const noexcept;
  const TensorBoardWriterOptions& options() const noexcept;
  // The folder this process writes to: logdir, or its "rank<r>" folder in a
  // distributed job; "" on a rank that writes nothing (RankFiles::Zero).
  const std::string& runDir() const noexcept;
  // The event file being written ("" while it cannot be created, and on a
  // rank that writes nothing).
  std::string filePath() const;

 protected:
  void closeOutput() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace torch_monitor::sinks
