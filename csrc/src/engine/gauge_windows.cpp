#include <torch_monitor/engine/gauge_windows.h>

#include <map>
#include <mutex>

#include <c10/util/Exception.h>

#include <torch_monitor/clock.h>
#include <torch_monitor/detail/bytes.h>
#include <torch_monitor/engine/window_timer.h>
#include <torch_monitor/event_handler.h>
#include <torch_monitor/rank_sync/protocol.h>

namespace torch_monitor::detail {

namespace {

constexpr uint64_t kGaugesMagic = 0x31534547'55414754; // "TGAUGES1"

// One rank's gauges and the step of their close (-1: none set).
std::vector<uint8_t> encodeGauges(const Gauges& gauges, int64_t step) {
  std::vector<uint8_t> out;
  putBytes(out, kGaugesMagic);
  putBytes(out, step);
  putBytes(out, uint64_t(gauges.size()));
  for (const auto& [key, value] : gauges) {
    putBytes(out, uint64_t(key.size()));
    out.insert(out.end(), key.begin(), key.end());
    putBytes(out, value);
  }
  return out;
}

// Adds the gauges of `in` into `sums`; false when `in` is not gauges.
bool addGauges(
    const std::vector<uint8_t>& in,
    std::map<std::string, int64_t>& sums,
    std::optional<int64_t>& step) {
  size_t at = 0;
  uint64_t magic = 0;
  int64_t closedAt = -1;
  uint64_t n = 0;
  if (!takeBytes(in, at, magic) || magic != kGaugesMagic ||
      !takeBytes(in, at, closedAt) || !takeBytes(in, at, n)) {
    return false;
  }
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t length = 0;
    if (!takeBytes(in, at, length) || in.size() - at < length) {
      return false;
    }
    std::string key(in.begin() + at, in.begin() + at + length);
    at += length;
    int64_t value = 0;
    if (!takeBytes(in, at, value)) {
      return false;
    }
    // Wraps rather than overflowing (undefined): counts of this size are
    // nonsense either way.
    int64_t& sum = sums[std::move(key)];
    sum = int64_t(uint64_t(sum) + uint64_t(value));
  }
  if (!step && closedAt >= 0) {
    step = closedAt;
  }
  return true;
}

Event gaugeEvent(std::optional<int64_t> step) {
  Event event;
  event.name = "torch.monitor.Stat";
  event.timestamp = std::chrono::system_clock::now();
  event.step = step;
  return event;
}

} // namespace

std::shared_ptr<GaugeWindows> GaugeWindows::start(
    GaugeWindowOptions options,
    Reader read) {
  std::shared_ptr<GaugeWindows> windows(
      new GaugeWindows(std::move(options), std::move(read)));
  if (windows->options_.group) {
    enableRankSync(
        windows.get(), windows->options_.group, windows->options_.syncName);
  }
  windows->track();
  if (windows->options_.windowSteps > 0) {
    addStepListener(windows);
  } else {
    joinWindowTimer(windows.get());
  }
  return windows;
}

GaugeWindows::GaugeWindows(GaugeWindowOptions options, Reader read)
    : options_(std::move(options)), read_(std::move(read)) {
  index_ = options_.windowSteps > 0
      ? getStep().value_or(0) / options_.windowSteps
      : readClock(ClockSource::PRECISE) / options_.windowSize.count();
}

GaugeWindows::~GaugeWindows() {
  try {
    close();
  } catch (const std::exception& e) {
    TORCH_WARN(
        "torch_monitor: an event handler failed while the last window of "
        "gauges was logged: ",
        e.what());
  }
}

void GaugeWindows::close() {
  {
    std::lock_guard<std::recursive_mutex> guard(mutex_.current());
    if (closed_) {
      return;
    }
  }
  // Without the lock: the timer may be waiting for it inside a pass that
  // leaving waits for.
  if (options_.windowSteps > 0) {
    removeStepListener(this);
  } else {
    leaveWindowTimer(this);
  }
  untrack();
  std::optional<Event> event;
  {
    std::lock_guard<std::recursive_mutex> guard(mutex_.current());
    if (closed_) {
      return;
    }
    closed_ = true;
    event = closeLocked(stepOfEarlyClose(), index_);
  }
  if (options_.group) {
    disableRankSync(this); // windows posted already are still merged
  }
  if (event) {
    dispatchEvent(*event);
  }
}

std::optional<Event> GaugeWindows::closeOpenWindow() {
  std::lock_guard<std::recursive_mutex> guard(mutex_.current());
  if (closed_) {
    return std::nullopt;
  }
  return closeLocked(stepOfEarlyClose(), index_);
}

std::optional<Event> GaugeWindows::closeWindowLeftBehind(
    int64_t step,
    std::optional<int64_t> stamp) {
  std::lock_guard<std::recursive_mutex> guard(mutex_.current());
  if (closed_ || options_.windowSteps <= 0 ||
      step / options_.windowSteps >= index_) {
    return std::nullopt;
  }
  return closeLocked(stamp, step / options_.windowSteps);
}

std::vector<Event> GaugeWindows::closeEndedWindow(int64_t& openEndMs) {
  std::optional<Event> event;
  {
    std::lock_guard<std::recursive_mutex> guard(mutex_.current());
    const int64_t length = options_.windowSize.count();
    if (closed_) {
      openEndMs = 0;
      return {};
    }
    const int64_t now = readClock(ClockSource::PRECISE);
    if (now / length != index_) {
      event = closeLocked(getStep(), now / length);
    }
    openEndMs = (index_ + 1) * length;
  }
  if (!event) {
    return {};
  }
  return {std::move(*event)};
}

void GaugeWindows::onStep(int64_t step) {
  std::optional<Event> event;
  {
    std::lock_guard<std::recursive_mutex> guard(mutex_.current());
    if (closed_ || step / options_.windowSteps == index_) {
      return;
    }
    event = closeLocked(step, step / options_.windowSteps);
  }
  if (event) {
    dispatchEvent(*event);
  }
}

std::optional<Event> GaugeWindows::closeLocked(
    std::optional<int64_t> eventStep,
    int64_t next) {
  // A window closed before its end (closeAllStats(), exit, close()) keeps
  // its index; read twice in a row (Python's exit hook, then C++'s), its
  // gauges would be logged twice.
  const bool early = next == index_;
  if (early && readEarly_) {
    return std::nullopt;
  }
  readEarly_ = early;
  const int64_t closing = index_;
  index_ = next;
  Gauges gauges = read_();
  if (options_.group) {
    const bool steps = options_.windowSteps > 0;
    const int64_t length =
        steps ? options_.windowSteps : options_.windowSize.count();
    const std::string ranksKey = options_.ranksKey;
    // Merged on the rank sync thread, from the payloads alone.
    auto merge = [ranksKey](const std::vector<std::vector<uint8_t>>& posts) {
      std::map<std::string, int64_t> sums;
      std::optional<int64_t> step;
      int64_t ranks = 0;
      for (const auto& post : posts) {
        ranks += addGauges(post, sums, step) ? 1 : 0;
      }
      std::vector<Event> events;
      if (!sums.empty()) {
        Event event = gaugeEvent(step);
        for (const auto& [key, sum] : sums) {
          event.data.emplace(key, sum);
        }
        event.data.emplace(ranksKey, ranks);
        events.push_back(std::move(event));
      }
      return events;
    };
    const int64_t index = steps
        ? closing
        : rankTimeWindowIndex((closing + 1) * length, length);
    if (postRankPayload(
            this,
            "gauges " + options_.syncName,
            index,
            encodeGauges(gauges, eventStep.value_or(-1)),
            encodeGauges({}, -1),
            std::string("gauges with ") + (steps ? "window_steps=" : "a ") +
                std::to_string(length) + (steps ? "" : " ms window"),
            std::move(merge))) {
      return std::nullopt;
    }
  }
  if (gauges.empty()) {
    return std::nullopt;
  }
  Event event = gaugeEvent(eventStep);
  for (auto& [key, value] : gauges) {
    event.data.emplace(std::move(key), value);
  }
  return event;
}

} // namespace torch_monitor::detail
