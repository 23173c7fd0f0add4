#include <torch_monitor/sinks/tensorboard_writer.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <unordered_map>

#include <unistd.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <torch_monitor/detail/lifecycle.h>
#include <torch_monitor/detail/text.h>
#include <torch_monitor/sinks/detail/buffered_file_writer.h>
#include <torch_monitor/sinks/format/histogram.h>
#include <torch_monitor/sinks/format/tensorboard.h>
#include <torch_monitor/stat.h> // test_hooks::cpuTensorsTakeDevicePath
#include <torch_monitor/step.h>

namespace torch_monitor::sinks {
namespace {

double nowSeconds() {
  return static_cast<double>(
             toEpochMicros(std::chrono::system_clock::now())) /
      1e6;
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
    return "localhost";
  }
  std::string host(name);
  for (char& c : host) {
    if (c == '/') {
      c = '_'; // must stay one path component
    }
  }
  return host;
}

// The <n> of the file name: unique per process, so that two writers on the
// same directory within the same second never collide.
std::atomic<uint64_t> gFileCounter{0};

std::string eventFileName(const std::string& logdir) {
  const auto seconds = static_cast<long long>(std::time(nullptr));
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "%010lld", seconds);
  static const std::string host = hostName();
  return logdir + "/events.out.tfevents." + stamp + "." + host + "." +
      std::to_string(::getpid()) + "." +
      std::to_string(gFileCounter.fetch_add(1));
}

// Whether a tensor's value is read when the writer writes rather than at
// the call: any tensor off the CPU (reading it would wait for its device),
// and CPU tensors in the tests that take that path on purpose.
bool readsLater(const at::Tensor& t) {
  return !t.device().is_cpu() || test_hooks::cpuTensorsTakeDevicePath();
}

// The calling thread's current stream on the tensor's device: where the
// snapshot of it is made, and so where it is read.
c10::Stream streamOf(const at::Tensor& t) {
  return c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device());
}

// End of the record containing byte `pos`, walking the length prefixes from
// the start of `data` (which is a record boundary).
size_t recordEnd(std::string_view data, size_t pos) {
  size_t offset = 0;
  while (offset + 8 <= data.size()) {
    uint64_t length;
    std::memcpy(&length, data.data() + offset, 8);
    const size_t end = offset + 12 + static_cast<size_t>(length) + 4;
    if (end > pos) {
      return end;
    }
    offset = end;
  }
  return data.size();
}

} // namespace

struct TensorBoardWriter::Impl {
  Impl(std::string dir, TensorBoardWriterOptions opts, ProblemLog& problemLog)
      : logdir(std::move(dir)),
        options(std::move(opts)),
        runDir(rankPath(logdir, options.ranks, /*isDirectory=*/true)),
        filter(options.eventNames),
        problems(problemLog),
        writer(
            detail::FileLayout{
                [this] { return eventFileName(*runDir); },
                [](const std::string& /*path*/) {
                  std::string header;
                  tensorboard::appendRecord(
                      header, tensorboard::fileVersionEvent(nowSeconds()));
                  return header;
                },
                &recordEnd,
                /*exclusive=*/true,
                /*truncateFirst=*/false,
                [this](bool closing) { writeDeferred(closing); }},
            detail::BufferOptions{
                options.flushInterval, options.maxBufferBytes},
            problemLog) {}

  struct TagState {
    explicit TagState(std::string_view tag) : encoded(tag) {}
    tensorboard::ScalarTag encoded;
    int64_t nextStep = 0;
  };

  // Called with the writer's buffer lock held.
  TagState& tagState(const std::string& key) {
    auto it = tags.find(key);
    if (it == tags.end()) {
      it = tags.emplace(key, TagState(key)).first;
    }
    return it->second;
  }

  // Which step a point written directly (add_scalar, add_histogram) gets:
  // the one given, else the training step (getStep()), else the tag's own
  // counter 0, 1, 2, ... (shared with the events' per-tag steps). Called with
  // the writer's buffer lock held.
  static int64_t stepFor(std::optional<int64_t> given, TagState& tag) {
    if (given) {
      return *given;
    }
    if (const std::optional<int64_t> training = getStep()) {
      return *training;
    }
    return tag.nextStep++;
  }

  // Buffers the one record `write(buffer, wallTime, step, tagState)` of a
  // point written directly at `tag`: a non-finite wall time means now, the
  // step is stepFor()'s.
  template <typename Write>
  void appendPoint(
      std::string_view tag,
      std::optional<int64_t> step,
      double wallTime,
      const Write& write) {
    if (!runDir) {
      return;
    }
    if (!std::isfinite(wallTime)) {
      wallTime = nowSeconds();
    }
    const std::string key(tag);
    writer.append([&](std::string& buffer) {
      TagState& state = tagState(key);
      write(buffer, wallTime, stepFor(step, state), state);
      return size_t(1);
    });
  }

  // A point written directly with a value still on its device: the value
  // was copied there at the call (a histogram: its summary computed there),
  // and is read when the writer next writes.
  struct DeferredPoint {
    std::string tag;
    // As given, else the training step at the call; else the tag's counter
    // when it is written.
    std::optional<int64_t> step;
    double wallTime; // finite
    at::Tensor snapshot; // 1-D float64: the value, or histogramSummary()
    int64_t numel; // a histogram's elements; 0 for a scalar
    c10::Stream stream; // the stream that wrote the snapshot
  };

  // Queues a point whose `snapshot` the caller just made on its device.
  void defer(DeferredPoint point);
  // FileLayout::beforeWrite: reads every deferred point (one copy to the
  // host per stream that wrote them) and appends their records.
  void writeDeferred(bool closing);
  // Encodes a point read back from the device (`values` on the host),
  // under the buffer lock; false for a histogram with no value in range.
  bool encodeDeferred(
      std::string& buffer,
      const DeferredPoint& point,
      const double* values);

  // Deferred points waiting before the flusher is asked to write at once,
  // and beyond which they are dropped (and counted), so that their device
  // memory stays bounded when points come faster than the writes.
  static constexpr size_t kFlushDeferredAt = 1024;
  static constexpr size_t kMaxDeferred = 65536;

  const std::string logdir;
  const TensorBoardWriterOptions options;
  // Nothing on a rank that writes nothing (RankFiles::Zero): then no file
  // is made and every point is ignored.
  const std::optional<std::string> runDir;
  const EventNameFilter filter;
  ProblemLog& problems;
  // The fork generation of the process that made the writer: a forked
  // child's writer is inert (BufferedFileWriter), so it defers nothing.
  const uint64_t generation = torch_monitor::detail::forkGeneration();
  std::unordered_map<std::string, TagState> tags; // under the buffer lock
  std::mutex deferredMutex; // guards what follows
  std::vector<DeferredPoint> deferred;
  bool deferredClosed = false;
  std::atomic<int64_t> deferredDropped{0};
  detail::BufferedFileWriter writer; // last: its close() calls writeDeferred
};

void TensorBoardWriter::Impl::defer(DeferredPoint point) {
  if (!runDir ||
      torch_monitor::detail::forkGeneration() != generation) {
    return;
  }
  size_t waiting;
  {
    std::lock_guard<std::mutex> guard(deferredMutex);
    if (deferredClosed) {
      return;
    }
    waiting = deferred.size();
    if (waiting < kMaxDeferred) {
      deferred.push_back(std::move(point));
    }
  }
  if (waiting >= kMaxDeferred) {
    if (deferredDropped.fetch_add(1, std::memory_order_relaxed) == 0) {
      problems.report(
          "deferred dropped",
          "more than " + std::to_string(kMaxDeferred) +
              " points of device tensors wait to be read; newer ones are "
              "dropped until the writer catches up (dropped() counts them)",
          // Met on the thread that adds a point or handles an event.
          ProblemLog::WarnVia::kBackgroundSink);
    }
  } else if (waiting + 1 == kFlushDeferredAt) {
    writer.requestFlush();
  }
}

void TensorBoardWriter::Impl::writeDeferred(bool closing) {
  std::vector<DeferredPoint> points;
  {
    std::lock_guard<std::mutex> guard(deferredMutex);
    points.swap(deferred);
    deferredClosed = deferredClosed || closing;
  }
  if (points.empty()) {
    return;
  }
  // One read per stream (a training loop's points share one): on the
  // stream that wrote the snapshots, which the read then waits for.
  std::vector<at::Tensor> host(points.size());
  std::vector<int64_t> offset(points.size());
  try {
    const at::AutoDispatchBelowADInplaceOrView belowAutograd;
    std::vector<bool> done(points.size());
    for (size_t i = 0; i < points.size(); ++i) {
      if (done[i]) {
        continue;
      }
      std::vector<at::Tensor> parts;
      std::vector<size_t> members;
      for (size_t j = i; j < points.size(); ++j) {
        if (!done[j] && points[j].stream == points[i].stream) {
          done[j] = true;
          offset[j] = parts.empty()
              ? 0
              : offset[members.back()] + parts.back().numel();
          members.push_back(j);
          parts.push_back(points[j].snapshot);
        }
      }
      const c10::StreamGuard onWritersStream(points[i].stream);
      const at::Tensor read =
          (parts.size() == 1 ? parts[0] : at::cat(parts)).cpu();
      for (size_t j : members) {
        host[j] = read;
      }
    }
  } catch (const std::exception& e) {
    deferredDropped.fetch_add(
        static_cast<int64_t>(points.size()), std::memory_order_relaxed);
    problems.report(
        "deferred read",
        std::to_string(points.size()) +
            " point(s) of device tensors could not be read from their "
            "device and are lost (dropped() counts them): " + e.what(),
        ProblemLog::WarnVia::kBackgroundSink);
    return;
  }
  size_t unplottable = 0;
  writer.append([&](std::string& buffer) {
    size_t records = 0;
    for (size_t i = 0; i < points.size(); ++i) {
      const double* values = host[i].const_data_ptr<double>() + offset[i];
      if (encodeDeferred(buffer, points[i], values)) {
        ++records;
      } else {
        ++unplottable;
      }
    }
    return records;
  });
  if (unplottable > 0) {
    problems.report(
        "deferred histogram out of range",
        "add_histogram of a device tensor with no value inside the "
        "histogram's range (all NaN, infinite or beyond it) writes nothing; "
        "SummaryWriter rejects such a tensor. Filter the values first, e.g. "
        "values[values.isfinite()]",
        ProblemLog::WarnVia::kBackgroundSink);
  }
}

bool TensorBoardWriter::Impl::encodeDeferred(
    std::string& buffer,
    const DeferredPoint& point,
    const double* values) {
  std::optional<Histogram> histogram;
  if (point.numel > 0) {
    try {
      histogram = histogramFromSummary(values, point.numel);
    } catch (const c10::ValueError&) {
      return false;
    }
  }
  TagState& state = tagState(point.tag);
  const int64_t step = stepFor(point.step, state);
  if (histogram) {
    tensorboard::appendRecord(
        buffer,
        tensorboard::histogramEvent(
            point.wallTime, step, state.encoded.tag(), *histogram));
  } else {
    tensorboard::appendScalarRecord(
        buffer,
        point.wallTime,
        step,
        state.encoded,
        static_cast<float>(values[0]));
  }
  return true;
}

namespace {

// The scalar written for a value, or false for values that have none.
bool scalarOf(const data_value_t& value, double& out) {
  switch (value.index()) {
    case 1:
      out = std::get<double>(value);
      return true;
    case 2:
      out = static_cast<double>(std::get<int64_t>(value));
      return true;
    case 3:
      out = std::get<bool>(value) ? 1.0 : 0.0;
      return true;
    default:
      return false; // strings cannot be plotted
  }
}

std::string describe(const std::string& logdir) {
  return "TensorBoardWriter('" + logdir + "')";
}

} // namespace

TensorBoardWriter::TensorBoardWriter(
    std::string logdir,
    TensorBoardWriterOptions options)
    : Sink(describe(logdir)) {
  TORCH_CHECK_VALUE(
      !logdir.empty(),
      "TensorBoardWriter: logdir is empty; pass the run's directory, e.g. "
      "\"runs/exp1\"");
  checkPathText(logdir, "TensorBoardWriter: logdir");
  while (logdir.size() > 1 && logdir.back() == '/') {
    logdir.pop_back();
  }
  impl_ = std::make_unique<Impl>(
      std::move(logdir), std::move(options), problemLog());
  if (impl_->runDir) {
    impl_->writer.start();
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  close();
}

void TensorBoardWriter::handle(const Event& event) {
  Impl& impl = *impl_;
  if (!impl.runDir || !impl.filter.accepts(event.name)) {
    return;
  }
  // Integral microseconds: never NaN.
  const double wallTime =
      static_cast<double>(toEpochMicros(event.timestamp)) / 1e6;
  bool fromKey = false;
  std::optional<int64_t> step = event.step;
  if (!impl.options.stepKey.empty()) {
    const auto it = event.data.find(impl.options.stepKey);
    if (it != event.data.end() && std::holds_alternative<int64_t>(it->second)) {
      fromKey = true;
      step = std::get<int64_t>(it->second);
    }
  }
  impl.writer.append([&](std::string& buffer) {
    size_t records = 0;
    for (const auto& [key, value] : event.data) {
      double scalar;
      if (!scalarOf(value, scalar) ||
          (fromKey && key == impl.options.stepKey)) {
        continue;
      }
      Impl::TagState& tag = impl.tagState(key);
      const int64_t pointStep = step ? *step : tag.nextStep++;
      tensorboard::appendScalarRecord(
          buffer, wallTime, pointStep, tag.encoded, static_cast<float>(scalar));
      ++records;
    }
    return records;
  });
}

void TensorBoardWriter::addScalar(
    std::string_view tag,
    double value,
    std::optional<int64_t> step,
    double wallTime) {
  // Here, so that every world's call is checked (TorchScript's too).
  torch_monitor::detail::checkText(tag, "TensorBoardWriter tag");
  impl_->appendPoint(
      tag,
      step,
      wallTime,
      [&](std::string& buffer,
          double time,
          int64_t pointStep,
          Impl::TagState& state) {
        tensorboard::appendScalarRecord(
            buffer, time, pointStep, state.encoded, static_cast<float>(value));
      });
}

void TensorBoardWriter::addScalar(
    std::string_view tag,
    const at::Tensor& value,
    std::optional<int64_t> step,
    double wallTime) {
  torch_monitor::detail::checkText(tag, "TensorBoardWriter tag");
  TORCH_CHECK_VALUE(
      value.defined() && value.numel() == 1,
      "TensorBoardWriter.add_scalar: value must be a number or a one-element "
      "tensor, got a tensor of ",
      value.defined() ? value.numel() : 0,
      " elements");
  TORCH_CHECK_TYPE(
      !at::isComplexType(value.scalar_type()),
      "TensorBoardWriter.add_scalar: the value must be real, got a ",
      value.scalar_type(),
      " tensor");
  if (!readsLater(value)) {
    addScalar(tag, value.item<double>(), step, wallTime);
    return;
  }
  const at::AutoDispatchBelowADInplaceOrView belowAutograd;
  impl_->defer(Impl::DeferredPoint{
      std::string(tag),
      step ? step : getStep(),
      std::isfinite(wallTime) ? wallTime : nowSeconds(),
      value.reshape({1}).to(at::kDouble, /*non_blocking=*/false, /*copy=*/true),
      0,
      streamOf(value)});
}

void TensorBoardWriter::addHistogram(
    std::string_view tag,
    const at::Tensor& values,
    std::optional<int64_t> step,
    double wallTime) {
  torch_monitor::detail::checkText(tag, "TensorBoardWriter tag");
  if (readsLater(values)) {
    // Type and emptiness are checked here; "no value in range" needs the
    // values, so it is reported when the point is written.
    impl_->defer(Impl::DeferredPoint{
        std::string(tag),
        step ? step : getStep(),
        std::isfinite(wallTime) ? wallTime : nowSeconds(),
        histogramSummary(values),
        values.numel(),
        streamOf(values)});
    return;
  }
  // Bad values throw here, before anything is buffered (on every rank).
  const Histogram histogram = computeHistogram(values);
  impl_->appendPoint(
      tag,
      step,
      wallTime,
      [&](std::string& buffer,
          double time,
          int64_t pointStep,
          Impl::TagState& state) {
        tensorboard::appendRecord(
            buffer,
            tensorboard::histogramEvent(
                time, pointStep, state.encoded.tag(), histogram));
      });
}

void TensorBoardWriter::flush() {
  impl_->writer.flush();
}

int64_t TensorBoardWriter::dropped() const {
  return impl_->writer.dropped() +
      impl_->deferredDropped.load(std::memory_order_relaxed);
}

const std::string& TensorBoardWriter::logdir() const noexcept {
  return impl_->logdir;
}

const TensorBoardWriterOptions& TensorBoardWriter::options() const noexcept {
  return impl_->options;
}

const std::string& TensorBoardWriter::runDir() const noexcept {
  static const std::string none;
  return impl_->runDir ? *impl_->runDir : none;
}

std::string TensorBoardWriter::filePath() const {
  return impl_->writer.currentPath();
}

void TensorBoardWriter::closeOutput() {
  impl_->writer.close();
}

} // namespace torch_monitor::sinks
