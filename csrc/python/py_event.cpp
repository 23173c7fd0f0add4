#include "py_common.h"
#include "internals.h"

#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <sstream>

#include <datetime.h>
#include <pybind11/stl.h>

#include <c10/util/Exception.h>
#include <torch/csrc/jit/api/object.h>

#include <torch_monitor/aggregation.h>
#include <torch_monitor/clock.h>
#include <torch_monitor/stat.h>
#include <torch_monitor/step.h>
#include <torch_monitor/script/event.h>

namespace torch_monitor::python {
namespace {

// Version of the pickled state of a Python Event. 1: (version, name,
// timestamp µs, data); 2 appends the step (None or an int). Both are read.
constexpr int64_t kEventStateVersion = 2;

void ensureDateTimeApi() {
  if (PyDateTimeAPI == nullptr) {
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == nullptr) {
      throw py::error_already_set();
    }
  }
}

data_value_t valueFromPython(const std::string& key, py::handle value) {
  PyObject* v = value.ptr();
  // bool first: it is a subclass of int, and torch.monitor wrongly turns it
  // into 1.0/0.0.
  if (PyBool_Check(v)) {
    return v == Py_True;
  }
  if (PyLong_Check(v)) {
    int overflow = 0;
    const long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow != 0) {
      PyErr_SetString(
          PyExc_OverflowError,
          ("Event data['" + key +
           "'] does not fit in a 64-bit signed integer")
              .c_str());
      throw py::error_already_set();
    }
    return static_cast<int64_t>(i);
  }
  if (PyFloat_Check(v)) {
    return PyFloat_AS_DOUBLE(v);
  }
  if (PyUnicode_Check(v) || PyBytes_Check(v)) { // bytes: UTF-8, as torch.monitor
    return textFromPython(value, "Event data['" + key + "']");
  }
  // NumPy's bool is no numbers.Integral; named as pybind11 knows it, so that
  // NumPy need not be imported (torch.monitor turns it into 1.0/0.0).
  const char* typeName = Py_TYPE(v)->tp_name;
  if (std::strcmp(typeName, "numpy.bool") == 0 ||
      std::strcmp(typeName, "numpy.bool_") == 0) {
    const int truth = PyObject_IsTrue(v);
    if (truth < 0) {
      throw py::error_already_set();
    }
    return truth == 1;
  }
  // NumPy scalars and other registered numbers; tensors are not numbers.Real.
  // Leaked on purpose: no Python object may be released after finalisation.
  static auto* integral =
      new py::object(py::module_::import("numbers").attr("Integral"));
  static auto* real = new py::object(py::module_::import("numbers").attr("Real"));
  const auto object = py::reinterpret_borrow<py::object>(value);
  if (py::isinstance(value, *integral)) {
    return valueFromPython(key, py::int_(object));
  }
  if (py::isinstance(value, *real)) {
    return valueFromPython(key, py::float_(object));
  }
  throw py::type_error(
      "Event data['" + key + "'] must be str, float, int or bool, got " +
      std::string(typeName));
}

std::string reprOf(const data_value_t& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) {
          return py::repr(py::str(v)).template cast<std::string>();
        } else if constexpr (std::is_same_v<V, bool>) {
          return v ? "True" : "False";
        } else {
          return py::repr(py::cast(v)).template cast<std::string>();
        }
      },
      value);
}

// An Event's step from Python: None, or an int of at least 0 (bool, a
// subclass of int, is a mistake here, not a step).
std::optional<int64_t> stepFromPython(py::handle step) {
  if (step.is_none()) {
    return std::nullopt;
  }
  if (!PyLong_Check(step.ptr()) || PyBool_Check(step.ptr())) {
    throw py::type_error(
        "Event step must be an int or None, got " +
        std::string(Py_TYPE(step.ptr())->tp_name));
  }
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(step.ptr(), &overflow);
  if (overflow != 0) {
    PyErr_SetString(
        PyExc_OverflowError,
        "Event step does not fit in a 64-bit signed integer");
    throw py::error_already_set();
  }
  checkStep(value, "Event step");
  return static_cast<int64_t>(value);
}

py::object stepToPython(const std::optional<int64_t>& step) {
  return step ? py::object(py::int_(*step)) : py::object(py::none());
}

// Whether the local wall time `local` of `t` also names an earlier instant:
// the second pass through the hour a clock repeats when it goes back (the
// end of summer time). datetime marks that pass fold=1, which is what makes
// .timestamp() give `t` back rather than an hour earlier. As
// datetime.fromtimestamp does: a clock that went back within the last day
// (no zone's ever went back more) had a larger UTC offset a day ago; then
// the wall time repeats if the instant that much earlier shows it too.
bool isRepeatedWallTime(time_t t, const std::tm& local) {
  constexpr time_t kDay = 24 * 3600;
  const time_t dayEarlier = t - kDay;
  std::tm dayBefore{};
  if (localtime_r(&dayEarlier, &dayBefore) == nullptr ||
      dayBefore.tm_gmtoff <= local.tm_gmtoff) {
    return false;
  }
  const time_t earlier = t - (dayBefore.tm_gmtoff - local.tm_gmtoff);
  std::tm then{};
  return localtime_r(&earlier, &then) != nullptr &&
      then.tm_hour == local.tm_hour && then.tm_min == local.tm_min &&
      then.tm_sec == local.tm_sec && then.tm_mday == local.tm_mday;
}

} // namespace

py::object timestampToPython(int64_t epochMicros) {
  ensureDateTimeApi();
  // floor division, so times before 1970 work too
  int64_t seconds = epochMicros / 1000000;
  int64_t micros = epochMicros % 1000000;
  if (micros < 0) {
    micros += 1000000;
    seconds -= 1;
  }
  const time_t t = static_cast<time_t>(seconds);
  std::tm local{};
  // localtime_r does not re-read the time zone on every call (localtime
  // does when TZ is unset, which costs torch.monitor ~2 µs per event).
  if (localtime_r(&t, &local) == nullptr) {
    throw py::value_error("timestamp out of range");
  }
  PyObject* dt = PyDateTime_FromDateAndTimeAndFold(
      local.tm_year + 1900,
      local.tm_mon + 1,
      local.tm_mday,
      local.tm_hour,
      local.tm_min,
      local.tm_sec,
      static_cast<int>(micros),
      isRepeatedWallTime(t, local) ? 1 : 0);
  if (dt == nullptr) {
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(dt);
}

int64_t timestampFromPython(py::handle datetime) {
  ensureDateTimeApi();
  if (PyDate_Check(datetime.ptr()) && !PyDateTime_Check(datetime.ptr())) {
    // A date is its midnight, local time, as torch.monitor takes it.
    PyObject* midnight = PyDateTime_FromDateAndTime(
        PyDateTime_GET_YEAR(datetime.ptr()),
        PyDateTime_GET_MONTH(datetime.ptr()),
        PyDateTime_GET_DAY(datetime.ptr()),
        0,
        0,
        0,
        0);
    if (midnight == nullptr) {
      throw py::error_already_set();
    }
    return timestampFromPython(py::reinterpret_steal<py::object>(midnight));
  }
  if (!PyDateTime_Check(datetime.ptr())) {
    throw py::type_error(
        "Event timestamp must be a datetime.datetime (or a datetime.date, "
        "its midnight), got " +
        std::string(Py_TYPE(datetime.ptr())->tp_name));
  }
  // datetime.timestamp() treats a naive value as local time and honours the
  // tzinfo of an aware one (torch.monitor ignores tzinfo).
  // An interned name hits CPython's method cache (a fresh str each call did
  // not). Leaked on purpose, like every object that must outlive finalisation.
  static PyObject* timestampName = PyUnicode_InternFromString("timestamp");
  PyObject* seconds = PyObject_CallMethodNoArgs(datetime.ptr(), timestampName);
  if (seconds == nullptr) {
    throw py::error_already_set();
  }
  const double value = PyFloat_AsDouble(seconds);
  Py_DECREF(seconds);
  const auto outOfRange = [&] {
    return py::value_error(
        "Event timestamp " + py::repr(datetime).cast<std::string>() +
        " is outside the supported range, 1677-09-21 to 2262-04-11 UTC "
        "(what a C++ std::chrono::system_clock time point holds)");
  };
  // Beyond what a C++ time point holds the value would wrap to another
  // century (year 9999 became 1816).
  if (!(value >= double(kMinEpochMicros / 1000000 - 1) &&
        value <= double(kMaxEpochMicros / 1000000 + 1))) {
    throw outOfRange();
  }
  // The float holds whole seconds exactly, but the microseconds only to
  // within its last bit: a microsecond off past 2100 and before 1840. The
  // instant's microseconds are the datetime's own, less an aware value's UTC
  // offset's (an offset may hold microseconds), and the float gives the rest.
  int64_t micros = PyDateTime_DATE_GET_MICROSECOND(datetime.ptr());
  if (PyDateTime_DATE_GET_TZINFO(datetime.ptr()) != Py_None) {
    static PyObject* utcoffsetName = PyUnicode_InternFromString("utcoffset");
    PyObject* offset = PyObject_CallMethodNoArgs(datetime.ptr(), utcoffsetName);
    if (offset == nullptr) {
      throw py::error_already_set();
    }
    if (PyDelta_Check(offset)) {
      micros = (micros - PyDateTime_DELTA_GET_MICROSECONDS(offset) + 1000000) %
          1000000;
    }
    Py_DECREF(offset);
  }
  const auto whole = static_cast<int64_t>(std::round(value - double(micros) * 1e-6));
  micros += whole * 1000000;
  if (micros < kMinEpochMicros || micros > kMaxEpochMicros) {
    throw outOfRange();
  }
  return micros;
}

py::dict dataToPython(const std::unordered_map<std::string, data_value_t>& data) {
  py::dict out;
  for (const auto& [key, value] : data) {
    out[py::str(key)] = std::visit([](const auto& v) { return py::cast(v); }, value);
  }
  return out;
}

std::unordered_map<std::string, data_value_t> dataFromPython(py::handle dict) {
  std::unordered_map<std::string, data_value_t> out;
  const auto add = [&out](py::handle key, py::handle value) {
    // bytes keys as UTF-8 text, as torch.monitor takes them
    if (!PyUnicode_Check(key.ptr()) && !PyBytes_Check(key.ptr())) {
      throw py::type_error(
          "Event data keys must be str, got " +
          std::string(Py_TYPE(key.ptr())->tp_name));
    }
    const std::string k = textFromPython(key, "Event data key");
    out.emplace(k, valueFromPython(k, value));
  };
  if (PyDict_Check(dict.ptr())) {
    for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(dict)) {
      add(key, value);
    }
    return out;
  }
  // Any other mapping (MappingProxyType, a Mapping class), as torch.monitor.
  // Leaked on purpose: no Python object may be released after finalisation.
  static auto* mapping = new py::object(
      py::module_::import("collections.abc").attr("Mapping"));
  if (!py::isinstance(dict, *mapping)) {
    throw py::type_error(
        "Event data must be a mapping (a dict) of str to str/float/int/bool, "
        "got " +
        std::string(Py_TYPE(dict.ptr())->tp_name));
  }
  for (py::handle item : dict.attr("items")()) {
    const auto pair = py::reinterpret_borrow<py::tuple>(item);
    add(pair[0], pair[1]);
  }
  return out;
}

void initAggregation(py::module_& m) {
  py::enum_<Aggregation> cls(
      m, "Aggregation", "Windowed aggregations of a Stat");
  cls.value("VALUE", Aggregation::VALUE)
      .value("MEAN", Aggregation::MEAN)
      .value("COUNT", Aggregation::COUNT)
      .value("SUM", Aggregation::SUM)
      .value("MAX", Aggregation::MAX)
      .value("MIN", Aggregation::MIN)
      .export_values();
  // Aggregation(2) is MEAN; pickle uses that call for every protocol.
  cls.def("__reduce_ex__", [](Aggregation a, py::handle /*protocol*/) {
    return py::make_tuple(
        py::module_::import("torch_monitor._C").attr("Aggregation"),
        py::make_tuple(static_cast<int>(a)));
  });
  initialiseOnNew(cls);
}

void initEvent(py::module_& m) {
  py::class_<Event>(m, "Event", "A named, timestamped record of data")
      .def(
          py::init([](Typed<TextHint> name,
                      Typed<TimestampHint> timestamp,
                      EventData data,
                      Typed<StepHint> step) {
            Event event;
            event.name = textFromPython(name, "Event name");
            event.timestamp = fromEpochMicros(timestampFromPython(timestamp));
            event.data = dataFromPython(data);
            event.step = stepFromPython(step);
            return event;
          }),
          py::arg("name"),
          py::arg("timestamp"),
          py::arg("data"),
          py::arg("step") = py::none())
      .def_property(
          "name",
          [](const Event& e) { return e.name; },
          [](Event& e, py::handle name) {
            e.name = textFromPython(name, "Event name");
          })
      .def_property(
          "timestamp",
          [](const Event& e) {
            return timestampToPython(toEpochMicros(e.timestamp));
          },
          [](Event& e, py::handle t) {
            e.timestamp = fromEpochMicros(timestampFromPython(t));
          })
      .def_property(
          "data",
          [](const Event& e) { return EventData(dataToPython(e.data)); },
          [](Event& e, EventData d) { e.data = dataFromPython(d); },
          "A copy of the event's data; assign a dict to replace it")
      .def_property(
          "step",
          [](const Event& e) { return stepToPython(e.step); },
          [](Event& e, py::handle step) { e.step = stepFromPython(step); },
          "The training step the event belongs to (an int), or None")
      .def(
          "__eq__",
          [](const Event& a, py::handle b) -> py::object {
            if (!py::isinstance<Event>(b)) {
              return py::reinterpret_borrow<py::object>(Py_NotImplemented);
            }
            return py::bool_(a == b.cast<const Event&>());
          })
      // Pickled as a factory call on a versioned state, so that every
      // protocol works (and a multiprocessing queue can carry events).
      .def(
          "__reduce_ex__",
          [](const Event& e, py::handle /*protocol*/) {
            return py::make_tuple(
                py::module_::import("torch_monitor._C").attr("_restore_event"),
                py::make_tuple(py::make_tuple(
                    kEventStateVersion,
                    e.name,
                    toEpochMicros(e.timestamp),
                    dataToPython(e.data),
                    stepToPython(e.step))));
          })
      .def("__repr__", [](const Event& e) {
        std::ostringstream out;
        out << "Event(name=" << py::repr(py::str(e.name)).cast<std::string>()
            << ", timestamp="
            << py::repr(timestampToPython(toEpochMicros(e.timestamp)))
                   .cast<std::string>()
            << ", data={";
        // keys sorted so the repr is stable
        std::map<std::string, data_value_t> sorted(e.data.begin(), e.data.end());
        const char* sep = "";
        for (const auto& [key, value] : sorted) {
          out << sep << py::repr(py::str(key)).cast<std::string>() << ": "
              << reprOf(value);
          sep = ", ";
        }
        out << "}";
        if (e.step) {
          out << ", step=" << *e.step;
        }
        out << ")";
        return out.str();
      });
  // __eq__ without __hash__: events are mutable, so unhashable (as dicts).
  m.attr("Event").attr("__hash__") = py::none();
  m.def(
      "_restore_event",
      [](py::tuple state) {
        TORCH_CHECK_VALUE(
            state.size() >= 1 && py::isinstance<py::int_>(state[0]),
            "not a pickled torch_monitor Event");
        const auto version = state[0].cast<int64_t>();
        TORCH_CHECK(
            version >= 1 && version <= kEventStateVersion,
            "cannot load a torch_monitor Event pickled with state version ",
            version,
            "; this build reads versions 1 to ",
            kEventStateVersion);
        // Version 1 (pickled before events had a step) has no step.
        TORCH_CHECK_VALUE(
            state.size() == size_t(version == 1 ? 4 : 5),
            "not a pickled torch_monitor Event");
        Event event;
        event.name = textFromPython(state[1], "Event name");
        event.timestamp = fromEpochMicros(state[2].cast<int64_t>());
        event.data = dataFromPython(state[3]);
        if (version >= 2) {
          event.step = stepFromPython(state[4]);
        }
        return event;
      },
      py::arg("state"),
      "Rebuilds a pickled event (used by pickle)");
  m.def(
      "_event_value",
      [](const std::string& key, py::handle value) {
        return std::visit(
            [](const auto& v) { return py::cast(v); }, valueFromPython(key, value));
      },
      py::arg("key"),
      py::arg("value"),
      "`value` as an Event's data holds it (a bool, int, float or str: NumPy "
      "scalars and other registered numbers converted, out-of-range ints "
      "refused), for log_event(name, data)");
  m.def(
      "_event_from_script",
      [](const torch::jit::Object& scriptEvent) {
        return c10::IValue(scriptEvent._ivalue())
            .toCustomClass<script::ScriptEvent>()
            ->event();
      },
      py::arg("script_event"),
      "A torch.classes.torch_monitor.Event's copy as a torch_monitor.Event");
  initialiseOnNew(m.attr("Event"));
  m.attr("STAT_EVENT") = kStatEventName;
}

void initTesting(py::module_& m) {
  m.def(
      "_set_fake_monotonic_ms",
      [](py::object ms) {
        if (ms.is_none()) {
          test_hooks::clearFakeMonotonicClock();
        } else {
          test_hooks::setFakeMonotonicMs(ms.cast<int64_t>());
        }
      },
      py::arg("ms"),
      "Drive every Stat's monotonic clock by hand (None: real clock again)");
  m.def(
      "_set_cpu_tensors_take_device_path",
      &test_hooks::setCpuTensorsTakeDevicePath,
      py::arg("on"),
      "Route CPU tensors through the accelerator tensors' path (tests)");
}

} // namespace torch_monitor::python
