// A C++ program using torch_monitor as a user would (see CMakeLists.txt).
//
//   torch_monitor_consumer
//       Self-test of the C++ API: registers an EventHandler, feeds a
//       Stat<double> and a Stat<int64_t>, destroys them and checks the events
//       the handler received. Exit status 0 on success.
//   torch_monitor_consumer MODEL.pt [V...]
//       Registers a C++ handler, torch::jit::load()s MODEL.pt (a scripted
//       module saved from Python), calls forward(V) for each V (a float),
//       destroys the module, and checks that the handler saw at least one
//       "torch.monitor.Stat" event. torch_monitor is reached only through
//       TorchScript here, apart from the handler registration.
//   torch_monitor_script_only MODEL.pt [V...]
//       (built with TORCH_MONITOR_CONSUMER_SCRIPT_ONLY) the same, with no
//       handler: it names no torch_monitor symbol at all.
//
// stdout carries one JSON object per line, for test/python/test_cpp_consumer.py:
//   {"kind":"event","name":...,"timestamp_us":...,"data":{KEY:{"type":T,"value":V}}}
//     T is "str", "double", "int" or "bool" (the data_value_t alternative);
//   {"kind":"result","input":V,"output":V}           one per forward call;
//   {"kind":"stat","attr":...,"class":...,"name":...,"count":N,
//    "window_size_ms":N,"max_samples":N,"aggregations":[...]}
//     one per torch_monitor object held by the module, read through
//     TorchScript after the forward calls.
// Diagnostics go to stderr.

#ifndef TORCH_MONITOR_CONSUMER_SCRIPT_ONLY
#include <torch_monitor/torch_monitor.h>
#endif

#include <torch/script.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::cerr << "FAIL: " << what << std::endl;
  }
}

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Python's json module reads NaN and Infinity.
std::string jsonDouble(double v) {
  if (std::isnan(v)) {
    return "NaN";
  }
  if (std::isinf(v)) {
    return v > 0 ? "Infinity" : "-Infinity";
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Reads a torch_monitor object held by the module through TorchScript only
// (its registered methods), the way any LibTorch program can.
void printScriptObjects(const torch::jit::Module& module) {
  for (const auto& attr : module.named_attributes(/*recurse=*/false)) {
    if (!attr.value.isObject()) {
      continue;
    }
    const std::string cls = attr.value.type()->str();
    if (cls.rfind("__torch__.torch.classes.torch_monitor.", 0) != 0 ||
        cls.find("Stat") == std::string::npos) {
      continue;
    }
    torch::jit::Object stat(attr.value.toObject());
    std::ostringstream line;
    line << "{\"kind\":\"stat\",\"attr\":" << jsonString(attr.name)
         << ",\"class\":" << jsonString(cls)
         << ",\"name\":" << jsonString(stat.run_method("name").toStringRef())
         << ",\"count\":" << stat.run_method("count").toInt()
         << ",\"window_size_ms\":" << stat.run_method("window_size_ms").toInt()
         << ",\"max_samples\":" << stat.run_method("max_samples").toInt()
         << ",\"aggregations\":[";
    const c10::IValue aggregations = stat.run_method("aggregations");
    const auto names = aggregations.toListRef();
    for (size_t i = 0; i < names.size(); ++i) {
      line << (i ? "," : "") << jsonString(names[i].toStringRef());
    }
    line << "]}";
    std::cout << line.str() << std::endl;
  }
}

// Loads MODEL, calls forward(v) for every v, prints what the module holds,
// then destroys the module (closing the windows of its stats).
int runModel(const std::string& path, const std::vector<double>& inputs) {
  try {
    torch::jit::Module module = torch::jit::load(path);
    for (const double v : inputs) {
      const c10::IValue out = module.forward({c10::IValue(v)});
      std::cout << "{\"kind\":\"result\",\"input\":" << jsonDouble(v)
                << ",\"output\":"
                << (out.isDouble() ? jsonDouble(out.toDouble())
                                   : jsonString(out.tagKind()))
                << "}" << std::endl;
    }
    printScriptObjects(module);
  } catch (const std::exception& e) {
    std::cerr << "FAIL: running " << path << ": " << e.what() << std::endl;
    return 2;
  }
  return 0;
}

std::vector<double> parseInputs(int argc, char** argv) {
  std::vector<double> inputs;
  for (int i = 2; i < argc; ++i) {
    inputs.push_back(std::strtod(argv[i], nullptr));
  }
  return inputs;
}

#ifndef TORCH_MONITOR_CONSUMER_SCRIPT_ONLY

using torch_monitor::Aggregation;
using torch_monitor::data_value_t;
using torch_monitor::Event;

// Keeps a copy of every event it is given.
class Recorder : public torch_monitor::EventHandler {
 public:
  void handle(const Event& event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(event);
  }
  std::vector<Event> events() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return events_;
  }
  std::vector<Event> named(const std::string& name) const {
    std::vector<Event> out;
    for (const Event& e : events()) {
      if (e.name == name) {
        out.push_back(e);
      }
    }
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Event> events_;
};

void printEvent(const Event& event) {
  std::map<std::string, data_value_t> sorted(
      event.data.begin(), event.data.end());
  std::ostringstream line;
  line << "{\"kind\":\"event\",\"name\":" << jsonString(event.name)
       << ",\"timestamp_us\":" << torch_monitor::toEpochMicros(event.timestamp)
       << ",\"data\":{";
  bool first = true;
  for (const auto& [key, value] : sorted) {
    line << (first ? "" : ",") << jsonString(key) << ":{\"type\":";
    first = false;
    if (const auto* s = std::get_if<std::string>(&value)) {
      line << "\"str\",\"value\":" << jsonString(*s);
    } else if (const auto* d = std::get_if<double>(&value)) {
      line << "\"double\",\"value\":" << jsonDouble(*d);
    } else if (const auto* i = std::get_if<int64_t>(&value)) {
      line << "\"int\",\"value\":" << *i;
    } else {
      line << "\"bool\",\"value\":"
           << (std::get<bool>(value) ? "true" : "false");
    }
    line << "}";
  }
  line << "}}";
  std::cout << line.str() << std::endl;
}

template <typename V>
void checkValue(const Event& event, const std::string& key, V expected) {
  const auto it = event.data.find(key);
  if (it == event.data.end()) {
    check(false, "event '" + event.name + "' has no key '" + key + "'");
    return;
  }
  const V* got = std::get_if<V>(&it->second);
  if (got == nullptr) {
    check(false, "key '" + key + "' holds the wrong type (variant index " +
              std::to_string(it->second.index()) + ")");
    return;
  }
  std::ostringstream msg;
  msg << "key '" << key << "': expected " << expected << ", got " << *got;
  check(*got == expected, msg.str());
}

// Mode (a): the C++ API on its own.
int selfTest() {
  // The generated version header, from the one source of the version.
  std::cout << "{\"kind\":\"version\",\"string\":\"" TORCH_MONITOR_VERSION
            << "\",\"parts\":[" << TORCH_MONITOR_VERSION_MAJOR << ","
            << TORCH_MONITOR_VERSION_MINOR << "," << TORCH_MONITOR_VERSION_PATCH
            << "]}" << std::endl;
  auto recorder = std::make_shared<Recorder>();
  torch_monitor::registerEventHandler(recorder);
  // Windows are aligned to multiples of their size on the monotonic clock; an
  // hour makes crossing a boundary during this test practically impossible.
  const auto hour = std::chrono::milliseconds(3600 * 1000);
  const auto before = std::chrono::system_clock::now();

  // A custom event reaches the handler unchanged.
  Event hello;
  hello.name = "consumer.hello";
  hello.timestamp = before;
  hello.data["text"] = std::string("hi \"there\"");
  hello.data["ratio"] = 0.25;
  hello.data["answer"] = int64_t(42);
  hello.data["flag"] = true;
  torch_monitor::logEvent(hello);
  const auto hellos = recorder->named("consumer.hello");
  check(hellos.size() == 1, "expected one consumer.hello event");
  if (!hellos.empty()) {
    check(hellos[0] == hello, "consumer.hello arrived changed");
  }

  {
    torch_monitor::Stat<double> loss(
        "consumer.loss",
        {Aggregation::VALUE,
         Aggregation::MEAN,
         Aggregation::COUNT,
         Aggregation::SUM,
         Aggregation::MAX,
         Aggregation::MIN},
        hour);
    loss.add(1.5);
    loss.add(2.5);
    loss.add(-1.0);
    check(loss.name() == "consumer.loss", "Stat<double>::name()");
    check(loss.count() == 3, "Stat<double>::count() should be 3");
    check(loss.windowSize() == hour, "Stat<double>::windowSize()");
    check(loss.aggregations().size() == 6, "Stat<double>::aggregations()");
    check(
        recorder->named(torch_monitor::kStatEventName).empty(),
        "no Stat event may be logged before the window closes");
  } // destruction closes the open window

  {
    torch_monitor::Stat<int64_t> steps(
        "consumer.steps",
        {Aggregation::SUM,
         Aggregation::COUNT,
         Aggregation::MEAN,
         Aggregation::MAX,
         Aggregation::MIN},
        hour);
    steps.add(1);
    steps.add(2);
    steps.add(4);
    check(steps.count() == 3, "Stat<int64_t>::count() should be 3");
  }

  size_t statEventsBeforeCapped = 0;
  {
    // max_samples closes the window at once; later samples are discarded.
    torch_monitor::Stat<double> capped(
        "consumer.capped", {Aggregation::SUM, Aggregation::COUNT}, hour, 2);
    capped.add(1.0);
    capped.add(2.0);
    statEventsBeforeCapped =
        recorder->named(torch_monitor::kStatEventName).size();
    capped.add(10.0);
    check(capped.count() == 0, "a sample past max_samples must be discarded");
  }
  const auto after = std::chrono::system_clock::now();

  const auto stats = recorder->named(torch_monitor::kStatEventName);
  check(
      stats.size() == 3,
      "expected 3 Stat events (loss, steps, capped), got " +
          std::to_string(stats.size()));
  check(
      statEventsBeforeCapped == 3,
      "the capped stat should emit when it reaches max_samples, before its "
      "destruction");
  if (stats.size() >= 3) {
    const Event& l = stats[0];
    check(l.data.size() == 6, "consumer.loss event should have 6 keys");
    checkValue<double>(l, "consumer.loss.value", -1.0);
    checkValue<double>(l, "consumer.loss.mean", 1.0);
    checkValue<double>(l, "consumer.loss.count", 3.0);
    checkValue<double>(l, "consumer.loss.sum", 3.0);
    checkValue<double>(l, "consumer.loss.max", 2.5);
    checkValue<double>(l, "consumer.loss.min", -1.0);

    const Event& s = stats[1];
    check(s.data.size() == 5, "consumer.steps event should have 5 keys");
    checkValue<int64_t>(s, "consumer.steps.sum", 7);
    checkValue<int64_t>(s, "consumer.steps.count", 3);
    checkValue<int64_t>(s, "consumer.steps.mean", 2); // integer division
    checkValue<int64_t>(s, "consumer.steps.max", 4);
    checkValue<int64_t>(s, "consumer.steps.min", 1);

    const Event& c = stats[2];
    check(c.data.size() == 2, "consumer.capped event should have 2 keys");
    checkValue<double>(c, "consumer.capped.sum", 3.0);
    checkValue<double>(c, "consumer.capped.count", 2.0);

    for (const Event& e : stats) {
      check(
          torch_monitor::toEpochMicros(e.timestamp) >=
                  torch_monitor::toEpochMicros(before) &&
              torch_monitor::toEpochMicros(e.timestamp) <=
                  torch_monitor::toEpochMicros(after),
          "Stat event timestamp should be the wall-clock time of its close");
    }
  }

  for (const Event& e : recorder->events()) {
    printEvent(e);
  }

  torch_monitor::unregisterEventHandler(recorder);
  const size_t seen = recorder->events().size();
  Event late;
  late.name = "consumer.late";
  late.timestamp = std::chrono::system_clock::now();
  torch_monitor::logEvent(late);
  check(
      recorder->events().size() == seen,
      "an unregistered handler must not receive events");

  if (failures == 0) {
    std::cerr << "OK: C++ API self-test passed" << std::endl;
    return 0;
  }
  return 1;
}

// Mode (b): a scripted model, with a C++ handler recording its events.
int modelTest(const std::string& path, const std::vector<double>& inputs) {
  auto recorder = std::make_shared<Recorder>();
  torch_monitor::registerEventHandler(recorder);
  const int rc = runModel(path, inputs); // the module is destroyed on return
  torch_monitor::unregisterEventHandler(recorder);
  for (const Event& e : recorder->events()) {
    printEvent(e);
  }
  if (rc != 0) {
    return rc;
  }
  check(
      !recorder->named(torch_monitor::kStatEventName).empty(),
      "the C++ handler received no torch.monitor.Stat event from the model");
  if (failures == 0) {
    std::cerr << "OK: model ran; " << recorder->events().size()
              << " events received" << std::endl;
    return 0;
  }
  return 1;
}

#endif // TORCH_MONITOR_CONSUMER_SCRIPT_ONLY

} // namespace

int main(int argc, char** argv) {
#ifdef TORCH_MONITOR_CONSUMER_SCRIPT_ONLY
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " MODEL.pt [VALUE...]" << std::endl;
    return 2;
  }
  return runModel(argv[1], parseInputs(argc, argv));
#else
  if (argc < 2) {
    return selfTest();
  }
  return modelTest(argv[1], parseInputs(argc, argv));
#endif
}
