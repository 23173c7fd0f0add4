#include <torch_monitor/sinks/tensorboard_writer.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <unordered_map>

#include <unistd.h>

#include <c10/util/Exception.h>

#include <torch_monitor/sinks/detail/buffered_file_writer.h>
#include <torch_monitor/sinks/format/histogram.h>
#include <torch_monitor/sinks/format/tensorboard.h>
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
  Impl(std::string dir, TensorBoardWriterOptions opts, ProblemLog& problems)
      : logdir(std::move(dir)),
        options(std::move(opts)),
        runDir(rankPath(logdir, options.ranks, /*isDirectory=*/true)),
        filter(options.eventNames),
        writer(
            detail::FileLayout{
                [this] { return eventFileName(*runDir); },
                [] {
                  std::string header;
                  tensorboard::appendRecord(
                      header, tensorboard::fileVersionEvent(nowSeconds()));
                  return header;
                },
                &recordEnd,
                /*exclusive=*/true,
                /*truncateFirst=*/false},
            detail::BufferOptions{
                options.flushInterval, options.maxBufferBytes},
            problems) {}

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

  const std::string logdir;
  const TensorBoardWriterOptions options;
  // Nothing on a rank that writes nothing (RankFiles::Zero): then no file
  // is made and every point is ignored.
  const std::optional<std::string> runDir;
  const EventNameFilter filter;
  std::unordered_map<std::string, TagState> tags; // under the buffer lock
  detail::BufferedFileWriter writer;
};

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

void TensorBoardWriter::addHistogram(
    std::string_view tag,
    const at::Tensor& values,
    std::optional<int64_t> step,
    double wallTime) {
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
  return impl_->writer.dropped();
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
