#include <torch_monitor/script/sinks.h>

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>

#include <torch_monitor/script/event.h>
#include <torch_monitor/script/config.h>
#include <torch_monitor/script/registration.h>
#include <torch_monitor/sinks/sinks.h>

namespace torch_monitor::script {

ScriptSinkHolder::~ScriptSinkHolder() = default;

std::shared_ptr<sinks::Sink> ScriptSinkHolder::sinkOf(const c10::IValue& object) {
  // A custom-class object's one slot is a capsule holding the C++ object.
  if (!object.isObject()) {
    return nullptr;
  }
  const auto& slots = object.toObjectRef().slots();
  if (slots.size() != 1 || !slots[0].isCapsule()) {
    return nullptr;
  }
  const auto capsule = slots[0].toCapsule();
  const auto* holder = dynamic_cast<const ScriptSinkHolder*>(capsule.get());
  return holder == nullptr ? nullptr : holder->sink();
}

namespace {

using sinks::ConsoleHandler;
using sinks::JsonLinesWriter;
using sinks::MemoryHandler;
using sinks::PrometheusExporter;
using sinks::PrometheusTextFile;
using sinks::TensorBoardWriter;

// One C++ type per TorchScript class (custom classes are keyed by type).
template <typename S>
class ScriptSink final : public ScriptSinkHolder {
 public:
  explicit ScriptSink(std::shared_ptr<S> sink)
      : ScriptSinkHolder(sink), typed_(std::move(sink)) {}
  S& get() const noexcept {
    return *typed_;
  }

 private:
  std::shared_ptr<S> typed_;
};

template <typename S>
using Self = c10::intrusive_ptr<ScriptSink<S>>;

template <typename S, typename... Args>
Self<S> makeSink(Args&&... args) {
  return c10::make_intrusive<ScriptSink<S>>(
      std::make_shared<S>(std::forward<Args>(args)...));
}

double secondsOf(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

// A buffered file sink's options from its constructor's shared arguments.
template <typename Options>
Options fileSinkOptions(
    double flushInterval,
    int64_t maxBufferBytes,
    std::vector<std::string> eventNames,
    const std::string& ranks,
    const char* ranksWhat) {
  TORCH_CHECK_VALUE(
      maxBufferBytes > 0, "max_buffer_bytes must be positive, got ", maxBufferBytes);
  Options options;
  options.flushInterval = sinks::flushIntervalFromSeconds(flushInterval);
  options.maxBufferBytes = static_cast<size_t>(maxBufferBytes);
  options.eventNames = std::move(eventNames);
  options.ranks = sinks::rankFilesFromName(ranks, ranksWhat);
  return options;
}

// add_scalar's value or step: a number, or a one-element tensor read when
// the call runs, so that compiled and exported code can pass what it
// computed. `method` names the caller in errors.
c10::Scalar scalarArgument(
    const c10::IValue& v,
    const char* what,
    const char* method = "add_scalar") {
  if (v.isTensor()) {
    const at::Tensor& tensor = v.toTensor();
    TORCH_CHECK_VALUE(
        tensor.numel() == 1,
        "TensorBoardWriter.",
        method,
        ": ",
        what,
        " must be a number or a one-element tensor, got a tensor of ",
        tensor.numel(),
        " elements");
    return tensor.item();
  }
  TORCH_CHECK_TYPE(
      v.isDouble() || v.isInt() || v.isBool(),
      "TensorBoardWriter.",
      method,
      ": ",
      what,
      " must be a number or a one-element tensor, got ",
      v.tagKind());
  return v.toScalar();
}

// A step argument of add_scalar and add_histogram: an int or a one-element
// integer tensor; None means "not given" (TensorBoardWriter then picks the
// step: the training step, else the tag's counter).
std::optional<int64_t> stepArgument(
    const c10::IValue& step,
    const char* method) {
  if (step.isNone()) {
    return std::nullopt;
  }
  const c10::Scalar scalar = scalarArgument(step, "step", method);
  TORCH_CHECK_TYPE(
      !scalar.isFloatingPoint(),
      "TensorBoardWriter.",
      method,
      ": step must be an int (or a one-element integer tensor), got ",
      scalar.toDouble());
  return scalar.toLong();
}

// A buffered file sink's configuration: its own entries, then those every
// such sink shares (never its counters: see defineFlatten).
template <typename Options>
Config fileSinkConfig(Config own, const Options& o) {
  own.emplace_back("flush_interval", secondsOf(o.flushInterval));
  own.emplace_back("max_buffer_bytes", static_cast<int64_t>(o.maxBufferBytes));
  own.emplace_back("event_names", o.eventNames);
  own.emplace_back("ranks", std::string(sinks::rankFilesName(o.ranks)));
  return own;
}

// The methods every sink class has.
template <typename S>
torch::class_<ScriptSink<S>>& defineSinkMethods(
    torch::class_<ScriptSink<S>>& cls) {
  return cls
      .def(
          "register",
          [](const Self<S>& self) { self->get().registerSelf(); },
          "Registers this sink as an event handler (again: no-op)")
      .def(
          "unregister",
          [](const Self<S>& self) { self->get().unregisterSelf(); },
          "Undoes register()")
      .def(
          "registered",
          [](const Self<S>& self) { return self->get().registeredSelf(); },
          "Whether register() (or `with`) registered it")
      .def(
          "flush",
          [](const Self<S>& self) { self->get().flush(); },
          "Writes what is buffered now")
      .def(
          "close",
          [](const Self<S>& self) { self->get().close(); },
          "Unregisters, flushes and releases the output; later events are "
          "ignored")
      .def(
          "closed",
          [](const Self<S>& self) { return self->get().closed(); },
          "Whether close() ran (a closed sink ignores events)")
      .def(
          "dropped",
          [](const Self<S>& self) { return self->get().dropped(); },
          "Events or values lost (buffer full, failing output, overwritten)")
      .def(
          "problems",
          [](const Self<S>& self) { return self->get().problems(); },
          "Distinct problems warned so far")
      .def(
          "description",
          [](const Self<S>& self) { return self->get().description(); },
          "What it writes where, as repr() shows it");
}

// The methods every buffered file sink has.
template <typename S>
torch::class_<ScriptSink<S>>& defineFileSinkMethods(
    torch::class_<ScriptSink<S>>& cls) {
  return defineSinkMethods(cls)
      .def(
          "file_path",
          [](const Self<S>& self) { return self->get().filePath(); },
          "The file this process writes")
      .def(
          "ranks",
          [](const Self<S>& self) {
            return std::string(
                sinks::rankFilesName(self->get().options().ranks));
          },
          "Which ranks of a distributed run write: 'separate' (each, under "
          "a rank<r> folder) or 'zero' (rank 0 alone)")
      .def(
          "flush_interval",
          [](const Self<S>& self) {
            return secondsOf(self->get().options().flushInterval);
          },
          "Seconds between background writes")
      .def(
          "max_buffer_bytes",
          [](const Self<S>& self) {
            return static_cast<int64_t>(self->get().options().maxBufferBytes);
          },
          "The most bytes buffered; beyond it events are dropped (counted)")
      .def(
          "event_names",
          [](const Self<S>& self) { return self->get().options().eventNames; },
          "The event names written ([]: every event)");
}

// Every sink's state is its configuration (defineConfigState): unpickling
// makes a new, unregistered sink with the same configuration, so a
// TorchScript module that holds a writer opens a new event file when
// loaded. Version 1 was a tuple of some of the constructor's arguments.
constexpr int64_t kStateVersion = 2;
using Labels = c10::Dict<std::string, std::string>;

Self<TensorBoardWriter> makeTensorBoardWriter(
    std::string logdir,
    double flushInterval,
    int64_t maxBufferBytes,
    std::vector<std::string> eventNames,
    std::optional<std::string> stepKey,
    const std::string& ranks) {
  auto options = fileSinkOptions<sinks::TensorBoardWriterOptions>(
      flushInterval, maxBufferBytes, std::move(eventNames), ranks, "TensorBoardWriter: ranks");
  options.stepKey = std::move(stepKey).value_or("");
  return makeSink<TensorBoardWriter>(std::move(logdir), std::move(options));
}

void registerTensorBoardWriter(torch::Library& m) {
  using S = TensorBoardWriter;
  auto cls = m.class_<ScriptSink<S>>("TensorBoardWriter");
  defineConfigState(
      cls,
      kStateVersion,
      &makeTensorBoardWriter,
      [](ScriptSink<S>& self) {
    return fileSinkConfig(
        {{"log_dir", self.get().logdir()},
         {"step_key", self.get().options().stepKey}},
        self.get().options());
  },
      {{1, {"log_dir", "flush_interval", "max_buffer_bytes", "event_names", "step_key"}}});
  cls.def(
      torch::init(textChecked(&makeTensorBoardWriter)),
      "Writes events as TensorBoard scalars, natively (no protobuf, no "
      "TensorFlow).\n"
      "\n"
      "Creates ``log_dir`` and an "
      "``events.out.tfevents.<time>.<host>.<pid>.<n>``\n"
      "file in it. For each accepted event (by default the "
      "``\"torch.monitor.Stat\"``\n"
      "events a ``Stat`` logs when its window closes, and the\n"
      "``\"torch_monitor.Watch\"`` events of ``watch()``) every numeric "
      "value becomes a\n"
      "scalar: the data key is the tag, the event's timestamp the wall "
      "time, and the\n"
      "step a per-tag counter 0, 1, 2, ... (or the event's ``step_key`` "
      "value).\n"
      "ints and floats are written as float32 (TensorBoard's "
      "``simple_value``),\n"
      "bools as 1.0/0.0; strings are skipped.\n"
      "\n"
      "Logging only encodes into memory (about 0.1 \u00b5s per scalar); a "
      "background\n"
      "thread writes whole records every ``flush_interval`` seconds, on "
      "``flush()``\n"
      "and ``close()``, when the object is destroyed, and at process exit. "
      "If the\n"
      "disk cannot keep up, at most ``max_buffer_bytes`` are held and "
      "newer\n"
      "scalars are dropped (counted in ``dropped``, warned once). What "
      "a full\n"
      "disk keeps out of the file until ``close()`` is counted there too; "
      "the file\n"
      "always ends at a whole record. ``dropped`` counts points (one per "
      "scalar\n"
      "value or histogram), not events.\n"
      "\n"
      "Args:\n"
      "    log_dir: the run's directory, e.g. ``\"runs/exp1\"`` (str or "
      "path-like).\n"
      "    flush_interval: seconds (or a ``timedelta``) between background "
      "writes.\n"
      "    max_buffer_bytes: bound on buffered bytes.\n"
      "    event_names: the event names written; ``None`` for every event.\n"
      "    step_key: if set, an event's int value under this key is the "
      "step of\n"
      "        all its other values (and is not written itself).\n"
      "    ranks: in a distributed job (``torch.distributed`` initialised, "
      "or\n"
      "        ``set_process_rank``), ``\"separate\"`` (default) writes to\n"
      "        ``<log_dir>/rank<r>``, one TensorBoard run per rank; "
      "``\"zero\"``\n"
      "        writes on rank 0 only, to ``log_dir`` (other ranks write "
      "nothing).\n"
      "        Outside one, ``log_dir`` as given. ``run_dir`` is where "
      "this\n"
      "        process writes.\n"
      "\n"
      "Points land at the event's step (a Stat's event carries the "
      "training step\n"
      "set with ``torch_monitor.set_step``), else at a per-tag counter 0, "
      "1, 2.\n"
      "\n"
      "Also ``add_scalar(tag, scalar_value, global_step=None, "
      "walltime=None)``\n"
      "like ``SummaryWriter`` (``global_step`` None means the training "
      "step when\n"
      "one is set, else the tag's next counter value; ``walltime`` None "
      "means\n"
      "now); ``add_histogram(tag, values, global_step=None, "
      "walltime=None)``, the\n"
      "histogram of a tensor's values with "
      "``SummaryWriter.add_histogram``'s\n"
      "default buckets (bucketed on the tensor's device; ``values`` None "
      "writes\n"
      "nothing, so ``monitor.peek()`` can be passed as is; ``global_step`` "
      "as for\n"
      "``add_scalar``; see docs/sinks.md \"Histograms\"); and the read-only\n"
      "``log_dir``, ``file_path``, ``flush_interval``, ``event_names``.",
      {torch::arg("log_dir"),
       torch::arg("flush_interval") = 1.0,
       torch::arg("max_buffer_bytes") = int64_t(32) << 20,
       // Every event of statistics registered when the library loaded.
       torch::arg("event_names") =
           c10::IValue(c10::List<std::string>(statisticsEventNames())),
       torch::arg("step_key") = c10::IValue(),
       torch::arg("ranks") = std::string("separate")});
  defineFileSinkMethods(cls)
      .def(
          "add_scalar",
          [](const Self<S>& self,
             std::string tag,
             c10::IValue value,
             c10::IValue step,
             std::optional<double> wallTime) {
            const std::optional<int64_t> at = stepArgument(step, "add_scalar");
            const double time =
                wallTime.value_or(std::numeric_limits<double>::quiet_NaN());
            if (value.isTensor()) {
              // A device tensor is read when the writer writes: no wait.
              self->get().addScalar(tag, value.toTensor(), at, time);
            } else {
              self->get().addScalar(
                  tag, scalarArgument(value, "value").toDouble(), at, time);
            }
          },
          "Writes one point at global_step (SummaryWriter's arguments): "
          "scalar_value is a number or a one-element tensor (a tensor on a "
          "device is copied there and read when the writer writes, so the "
          "call never waits for it), global_step a number or a one-element "
          "tensor read at the call; global_step None means the training "
          "step (set_step) when one is set, else the tag's next counter "
          "value; walltime None means now",
          {torch::arg("tag"),
           torch::arg("scalar_value"),
           torch::arg("global_step") = c10::IValue(),
           torch::arg("walltime") = c10::IValue()})
      .def(
          "add_histogram",
          [](const Self<S>& self,
             std::string tag,
             std::optional<at::Tensor> values,
             c10::IValue step,
             std::optional<double> wallTime) {
            // None (a monitor's peek() before its first step) writes
            // nothing, so that one line can feed a histogram every N steps.
            if (values) {
              self->get().addHistogram(
                  tag,
                  *values,
                  stepArgument(step, "add_histogram"),
                  wallTime.value_or(std::numeric_limits<double>::quiet_NaN()));
            }
          },
          "Writes the histogram of `values` with SummaryWriter's default "
          "buckets (None writes nothing, so a monitor's peek() can be passed "
          "as is); global_step an int, a one-element tensor, or None for the "
          "training step (else a per-tag counter); walltime None means now",
          {torch::arg("tag"),
           torch::arg("values"),
           torch::arg("global_step") = c10::IValue(),
           torch::arg("walltime") = c10::IValue()})
      .def(
          "log_dir",
          [](const Self<S>& self) { return self->get().logdir(); },
          "The folder given (TensorBoard's --logdir)")
      .def(
          "run_dir",
          [](const Self<S>& self) { return self->get().runDir(); },
          "The folder this process writes to (log_dir, or its rank<r> folder)")
      .def(
          "step_key",
          [](const Self<S>& self) { return self->get().options().stepKey; },
          "The data key whose value is a point's step ('': the event's "
          "step)");
}

Self<JsonLinesWriter> makeJsonLinesWriter(
    std::string path,
    double flushInterval,
    int64_t maxBufferBytes,
    std::vector<std::string> eventNames,
    bool append,
    const std::string& ranks) {
  auto options = fileSinkOptions<sinks::JsonLinesWriterOptions>(
      flushInterval, maxBufferBytes, std::move(eventNames), ranks, "JsonLinesWriter: ranks");
  options.append = append;
  return makeSink<JsonLinesWriter>(std::move(path), std::move(options));
}

// A loaded writer appends, whatever `append` it was saved with: loading a
// model (a checkpoint resumed mid-run, say) must never truncate a log.
Self<JsonLinesWriter> loadJsonLinesWriter(
    std::string path,
    double flushInterval,
    int64_t maxBufferBytes,
    std::vector<std::string> eventNames,
    bool /*append*/,
    const std::string& ranks) {
  return makeJsonLinesWriter(
      std::move(path),
      flushInterval,
      maxBufferBytes,
      std::move(eventNames),
      /*append=*/true,
      ranks);
}

void registerJsonLinesWriter(torch::Library& m) {
  using S = JsonLinesWriter;
  auto cls = m.class_<ScriptSink<S>>("JsonLinesWriter");
  defineConfigState(
      cls,
      kStateVersion,
      &loadJsonLinesWriter,
      [](ScriptSink<S>& self) {
    return fileSinkConfig(
        {{"path", self.get().path()},
         {"append", self.get().options().append}},
        self.get().options());
  },
      {{1, {"path", "flush_interval", "max_buffer_bytes", "event_names"}}});
  cls.def(
      torch::init(textChecked(&makeJsonLinesWriter)),
      "Appends one JSON object per event and line to ``path`` (JSON "
      "Lines).\n"
      "\n"
      "``{\"name\": ..., \"timestamp\": \"2024-05-01T12:34:56.123456Z\",\n"
      "\"epoch_seconds\": 1714566896.123456, \"data\": {...}}`` with the "
      "data's types\n"
      "kept: ints as JSON integers, floats as JSON numbers that read back "
      "as float\n"
      "(``2.0``, not ``2``; NaN and infinities as the strings ``\"NaN\"``,\n"
      "``\"Infinity\"``, ``\"-Infinity\"``, which ``float()`` reads), bools as\n"
      "``true``/``false``, strings as strings. Names, keys and strings are "
      "escaped\n"
      "and invalid UTF-8 (possible from C++) becomes U+FFFD, so every line "
      "is valid\n"
      "JSON: ``[json.loads(line) for line in open(path)]``.\n"
      "\n"
      "Buffered and written in the background exactly like "
      "``TensorBoardWriter``:\n"
      "on a full disk the file always ends at a whole line, and every "
      "event not\n"
      "written by ``close()`` is counted in ``dropped``.\n"
      "\n"
      "``path`` may also be a FIFO or ``/dev/stdout``: opening and writing "
      "never\n"
      "block (a FIFO without a reader is warned about and opened once one "
      "comes;\n"
      "a stalled reader costs dropped events, and ``close()`` waits at "
      "most 1 s),\n"
      "and a reader that goes away (``prog | head``) is one warning, after "
      "which\n"
      "events are dropped, never a ``SIGPIPE``.\n"
      "\n"
      "Args:\n"
      "    path: the file (its directory is created); UTF-8 text (``str``,\n"
      "        path-like or UTF-8 ``bytes``) without NUL bytes, not a "
      "directory\n"
      "        (else ``ValueError``).\n"
      "    flush_interval: seconds (or a ``timedelta``) between background "
      "writes.\n"
      "    max_buffer_bytes: bound on buffered bytes.\n"
      "    event_names: the event names written; ``None`` (default) for "
      "every event.\n"
      "    append: ``True`` keeps what the file holds (default), ``False`` "
      "starts\n"
      "        it anew; anything else is a ``TypeError``.\n"
      "    ranks: in a distributed job, ``\"separate\"`` (default) writes to\n"
      "        ``<dir>/rank<r>/<name>`` for ``path`` ``<dir>/<name>`` (a "
      "FIFO or\n"
      "        device is shared as is); ``\"zero\"`` writes on rank 0 only, "
      "to\n"
      "        ``path``. Lines then carry ``\"rank\"`` and ``\"world_size\"``.\n"
      "        ``file_path`` is the file this process writes.",
      {torch::arg("path"),
       torch::arg("flush_interval") = 1.0,
       torch::arg("max_buffer_bytes") = int64_t(32) << 20,
       torch::arg("event_names") = c10::IValue(c10::List<std::string>()),
       torch::arg("append") = true,
       torch::arg("ranks") = std::string("separate")});
  defineFileSinkMethods(cls)
      .def(
          "path",
          [](const Self<S>& self) { return self->get().path(); },
          "The path given (a rank's file may differ: file_path)")
      .def(
          "append",
          [](const Self<S>& self) { return self->get().options().append; },
          "Whether the file was appended to (else truncated when made)");
}

Self<ConsoleHandler> makeConsoleHandler(
    const std::string& stream,
    std::vector<std::string> eventNames) {
  return makeSink<ConsoleHandler>(
      sinks::consoleStreamFromName(stream), std::move(eventNames));
}

void registerConsoleHandler(torch::Library& m) {
  using S = ConsoleHandler;
  auto cls = m.class_<ScriptSink<S>>("ConsoleHandler");
  defineConfigState(
      cls,
      kStateVersion,
      &makeConsoleHandler,
      [](ScriptSink<S>& self) {
    return Config{
        {"stream", std::string(sinks::consoleStreamName(self.get().stream()))},
        {"event_names", self.get().eventNames()}};
  },
      {{1, {"stream", "event_names"}}});
  cls.def(
      torch::init(textChecked([](std::string stream, std::vector<std::string> names) {
        return makeConsoleHandler(stream, std::move(names));
      })),
      "Prints one human-readable line per event to ``\"stderr\"`` (default) "
      "or ``\"stdout\"``.\n"
      "\n"
      "``2024-05-01T12:34:56.123456Z torch.monitor.Stat loss.count=10 "
      "loss.mean=0.25``\n"
      "(UTC time, event name, data sorted by key). Each line is written "
      "straight\n"
      "to the file descriptor, so it is not mixed with other lines but can\n"
      "overtake text still sitting in ``sys.stdout``'s buffer. A closed "
      "pipe is\n"
      "one warning (later lines are dropped and counted), never a "
      "``SIGPIPE``;\n"
      "a failing stream (a full disk, ``/dev/full``) drops and counts "
      "the lines\n"
      "it cannot take, and a file never ends inside a line.\n"
      "\n"
      "Args:\n"
      "    stream: ``\"stderr\"`` or ``\"stdout\"``.\n"
      "    event_names: the event names printed; ``None`` (default) for "
      "every event.",
      {torch::arg("stream") = std::string("stderr"),
       torch::arg("event_names") = c10::IValue(c10::List<std::string>())});
  defineSinkMethods(cls)
      .def(
          "stream",
          [](const Self<S>& self) {
            return std::string(sinks::consoleStreamName(self->get().stream()));
          },
          "The stream written: 'stdout' or 'stderr'")
      .def(
          "event_names",
          [](const Self<S>& self) { return self->get().eventNames(); },
          "The event names written ([]: every event)");
}

Self<MemoryHandler> makeMemoryHandler(
    int64_t capacity,
    std::vector<std::string> eventNames) {
  TORCH_CHECK_VALUE(
      capacity > 0, "MemoryHandler: capacity must be at least 1, got ", capacity);
  return makeSink<MemoryHandler>(
      static_cast<size_t>(capacity), std::move(eventNames));
}

void registerMemoryHandler(torch::Library& m) {
  using S = MemoryHandler;
  auto cls = m.class_<ScriptSink<S>>("MemoryHandler");
  defineConfigState(
      cls,
      kStateVersion,
      &makeMemoryHandler,
      [](ScriptSink<S>& self) {
    return Config{
        {"capacity", static_cast<int64_t>(self.get().capacity())},
        {"event_names", self.get().eventNames()}};
  },
      {{1, {"capacity", "event_names"}}});
  cls.def(
      torch::init(textChecked(&makeMemoryHandler)),
      "Keeps the last ``capacity`` events in memory, for tests and "
      "notebooks.\n"
      "\n"
      "``events()`` returns them oldest first (as "
      "``torch_monitor.Event``),\n"
      "``clear()`` forgets them, ``len(handler)`` counts them; ``dropped`` "
      "counts\n"
      "the events overwritten because the ring was full::\n"
      "\n"
      "    with monitor.MemoryHandler() as memory:\n"
      "        train_one_epoch()\n"
      "    losses = [e.data[\"loss.mean\"] for e in memory.events()]\n"
      "\n"
      "Args:\n"
      "    capacity: how many events are kept.\n"
      "    event_names: the event names kept; ``None`` (default) for every "
      "event.",
      {torch::arg("capacity") =
           static_cast<int64_t>(MemoryHandler::kDefaultCapacity),
       torch::arg("event_names") = c10::IValue(c10::List<std::string>())});
  defineSinkMethods(cls)
      .def(
          "events",
          [](const Self<S>& self) {
            std::vector<c10::intrusive_ptr<ScriptEvent>> out;
            for (Event& e : self->get().events()) {
              out.push_back(c10::make_intrusive<ScriptEvent>(std::move(e)));
            }
            return out;
          },
          "The events held, oldest first")
      .def(
          "clear",
          [](const Self<S>& self) { self->get().clear(); },
          "Forgets the events held")
      .def(
          "size",
          [](const Self<S>& self) {
            return static_cast<int64_t>(self->get().size());
          },
          "The number of events held")
      .def(
          "capacity",
          [](const Self<S>& self) {
            return static_cast<int64_t>(self->get().capacity());
          },
          "The most events held; beyond it the oldest is dropped")
      .def(
          "event_names",
          [](const Self<S>& self) { return self->get().eventNames(); },
          "The event names kept ([]: every event)");
}

Self<PrometheusExporter> makePrometheusExporter(
    int64_t port,
    std::string host,
    const Labels& labels) {
  TORCH_CHECK_VALUE(
      port >= 0 && port <= 65535,
      "PrometheusExporter: port must be in 0..65535 (0: any free port), got ",
      port);
  return makeSink<PrometheusExporter>(
      static_cast<int>(port), std::move(host), mapOf(labels));
}

void registerPrometheusExporter(torch::Library& m) {
  using S = PrometheusExporter;
  auto cls = m.class_<ScriptSink<S>>("PrometheusExporter");
  // The port asked for, not the one bound: configuration only.
  defineConfigState(
      cls,
      kStateVersion,
      &makePrometheusExporter,
      [](ScriptSink<S>& self) {
    return Config{
        {"port", static_cast<int64_t>(self.get().requestedPort())},
        {"host", self.get().host()},
        {"labels", dictOf(self.get().labels())}};
  },
      {{1, {"port", "host", "labels"}}});
  cls.def(
      torch::init(textChecked(&makePrometheusExporter)),
      "Serves every Stat's last closed window at ``GET /metrics`` for "
      "Prometheus.\n"
      "\n"
      "Text exposition format 0.0.4: per Stat a gauge family\n"
      "``torch_monitor_<name>`` (the name with characters outside\n"
      "``[a-zA-Z0-9_:]`` replaced by ``_``) with one sample per "
      "aggregation\n"
      "(label ``aggregation=\"mean\"``, ...), and for a Stat with COUNT a "
      "counter\n"
      "``torch_monitor_<name>_count_total`` summing the counts of all "
      "windows.\n"
      "A scrape reads a snapshot that each window close updates: it never\n"
      "touches ``Stat.add``. The server is one C++ thread with bounded\n"
      "connections and timeouts (docs/sinks.md, \"Prometheus\").\n"
      "\n"
      "Args:\n"
      "    port: the TCP port; 0 (default) picks a free one, see ``port``.\n"
      "    host: the address to listen on; ``\"127.0.0.1\"`` (default) keeps "
      "it\n"
      "        local, ``\"0.0.0.0\"`` opens it to the network.\n"
      "    labels: constant labels on every sample (job, run id). When\n"
      "        torch.distributed is initialised, ``rank`` is added (unless\n"
      "        given).",
      {torch::arg("port") = int64_t(0),
       torch::arg("host") = std::string("127.0.0.1"),
       torch::arg("labels") = c10::IValue(Labels())});
  defineSinkMethods(cls)
      .def(
          "port",
          [](const Self<S>& self) {
            return static_cast<int64_t>(self->get().port());
          },
          "The port bound")
      .def(
          "host",
          [](const Self<S>& self) { return self->get().host(); },
          "The address the server listens on")
      .def(
          "labels",
          [](const Self<S>& self) { return dictOf(self->get().labels()); },
          "The labels every sample carries")
      .def(
          "serving",
          [](const Self<S>& self) { return self->get().serving(); },
          "Whether the server runs in this process (False after close() and "
          "in a forked child)")
      .def(
          "render",
          [](const Self<S>& self) { return self->get().render(); },
          "What a scrape of /metrics returns now");
}

Self<PrometheusTextFile> makePrometheusTextFile(
    std::string path,
    const Labels& labels) {
  return makeSink<PrometheusTextFile>(std::move(path), mapOf(labels));
}

void registerPrometheusTextFile(torch::Library& m) {
  using S = PrometheusTextFile;
  auto cls = m.class_<ScriptSink<S>>("PrometheusTextFile");
  defineConfigState(
      cls,
      kStateVersion,
      &makePrometheusTextFile,
      [](ScriptSink<S>& self) {
    return Config{
        {"path", self.get().path()},
        {"labels", dictOf(self.get().labels())}};
  },
      {{1, {"path", "labels"}}});
  cls.def(
      torch::init(textChecked(&makePrometheusTextFile)),
      "Writes what ``PrometheusExporter`` serves to a ``.prom`` file.\n"
      "\n"
      "For node_exporter's textfile collector: at every Stat window close "
      "the\n"
      "text is written to a temporary file beside ``path`` and renamed "
      "over it,\n"
      "so a reader sees a whole file, old or new; a window that cannot "
      "be\n"
      "written (a full disk) leaves the old file and is counted in "
      "``dropped``.\n"
      "``labels`` as for\n"
      "``PrometheusExporter`` (``rank`` added under torch.distributed).",
      {torch::arg("path"), torch::arg("labels") = c10::IValue(Labels())});
  defineSinkMethods(cls)
      .def(
          "path",
          [](const Self<S>& self) { return self->get().path(); },
          "The file written (replaced whole, by a rename, at each write)")
      .def(
          "labels",
          [](const Self<S>& self) { return dictOf(self->get().labels()); },
          "The labels every sample carries");
}

} // namespace

void registerSinkClasses(torch::Library& m) {
  registerTensorBoardWriter(m);
  registerJsonLinesWriter(m);
  registerConsoleHandler(m);
  registerMemoryHandler(m);
  registerPrometheusExporter(m);
  registerPrometheusTextFile(m);
}

} // namespace torch_monitor::script
