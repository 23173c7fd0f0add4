#include <torch_monitor/reducers/factory.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include <torch_monitor/reducers/general.h>
#include <torch_monitor/reducers/stats.h>
#include <torch_monitor/reducers/trace.h>

namespace torch_monitor {
namespace {

// Reads a kind's parameters by name and rejects the names it did not read,
// so a typo ("time_const") fails instead of being ignored.
class Params {
 public:
  Params(const std::string& kind, const std::map<std::string, double>& params)
      : kind_(kind), params_(params) {}

  double required(const std::string& name) {
    used_.insert(name);
    const auto it = params_.find(name);
    TORCH_CHECK_VALUE(
        it != params_.end(), kind_, " needs the parameter '", name, "'");
    return it->second;
  }
  std::optional<double> optional(const std::string& name) {
    used_.insert(name);
    const auto it = params_.find(name);
    if (it == params_.end()) {
      return std::nullopt;
    }
    return it->second;
  }
  void finish() const {
    for (const auto& entry : params_) {
      if (used_.count(entry.first) == 0) {
        std::string known;
        for (const std::string& name : used_) {
          known += (known.empty() ? "" : ", ") + name;
        }
        TORCH_CHECK_VALUE(
            false,
            kind_,
            " has no parameter '",
            entry.first,
            "'",
            known.empty() ? std::string("; it takes none")
                          : "; it takes " + known);
      }
    }
  }

 private:
  const std::string& kind_;
  const std::map<std::string, double>& params_;
  std::set<std::string> used_;
};

// EventReducer's initial travels as its value (inf, 0 or nan).
std::string initialName(double value) {
  if (std::isnan(value)) {
    return "nan";
  }
  if (value == 0.0) {
    return "zero";
  }
  TORCH_CHECK_VALUE(
      std::isinf(value) && value > 0,
      "EventReducer: the parameter 'initial' must be inf, 0 or nan, got ",
      value);
  return "inf";
}

struct Config {
  double stepTime;
  double duration;
  bool inclusive;
  bool inplace;
};

using Builder = std::function<std::shared_ptr<FoldReducer>(
    const Config&, Params&, Criterion&)>;

const std::vector<std::pair<std::string, Builder>>& builders() {
  static const std::vector<std::pair<std::string, Builder>> table{
      {"PassthroughReducer",
       [](const Config& c, Params&, Criterion&) {
         return std::make_shared<PassthroughReducer>(
             c.stepTime, c.duration, c.inclusive, c.inplace);
       }},
      {"EventReducer",
       [](const Config& c, Params& p, Criterion& criterion) {
         const double initial = p.optional("initial").value_or(std::numeric_limits<double>::infinity());
         return std::make_shared<EventReducer>(
             c.stepTime,
             std::move(criterion),
             initialName(initial),
             c.duration,
             c.inclusive,
             c.inplace);
       }},
      {"EMAReducer",
       [](const Config& c, Params& p, Criterion&) {
         return std::make_shared<EMAReducer>(
             c.stepTime, p.required("alpha"), c.duration, c.inclusive, c.inplace);
       }},
      {"CAReducer",
       [](const Config& c, Params&, Criterion&) {
         return std::make_shared<CAReducer>(
             c.stepTime, c.duration, c.inclusive, c.inplace);
       }},
      {"NearestTraceReducer",
       [](const Config& c, Params& p, Criterion&) {
         return std::make_shared<NearestTraceReducer>(
             c.stepTime,
             p.required("time_constant"),
             p.required("amplitude"),
             p.required("target"),
             p.optional("tolerance"),
             c.duration,
             c.inclusive,
             c.inplace);
       }},
      {"CumulativeTraceReducer",
       [](const Config& c, Params& p, Criterion&) {
         return std::make_shared<CumulativeTraceReducer>(
             c.stepTime,
             p.required("time_constant"),
             p.required("amplitude"),
             p.required("target"),
             p.optional("tolerance"),
             c.duration,
             c.inclusive,
             c.inplace);
       }},
      {"ScaledNearestTraceReducer",
       [](const Config& c, Params& p, Criterion& criterion) {
         return std::make_shared<ScaledNearestTraceReducer>(
             c.stepTime,
             p.required("time_constant"),
             p.required("amplitude"),
             p.required("scale"),
             std::move(criterion),
             c.duration,
             c.inclusive,
             c.inplace);
       }},
      {"ScaledCumulativeTraceReducer",
       [](const Config& c, Params& p, Criterion& criterion) {
         return std::make_shared<ScaledCumulativeTraceReducer>(
             c.stepTime,
             p.required("time_constant"),
             p.required("amplitude"),
             p.required("scale"),
             std::move(criterion),
             c.duration,
             c.inclusive,
             c.inplace);
       }},
      {"ConditionalNearestTraceReducer",
       [](const Config& c, Params& p, Criterion&) {
         return std::make_shared<ConditionalNearestTraceReducer>(
             c.stepTime,
             p.required("time_constant"),
             p.required("amplitude"),
             p.required("scale"),
             c.duration,
             c.inclusive,
             c.inplace);
       }},
      {"ConditionalCumulativeTraceReducer",
       [](const Config& c, Params& p, Criterion&) {
         return std::make_shared<ConditionalCumulativeTraceReducer>(
             c.stepTime,
             p.required("time_constant"),
             p.required("amplitude"),
             p.required("scale"),
             c.duration,
             c.inclusive,
             c.inplace);
       }},
  };
  return table;
}

bool takesCriterion(const std::string& kind) {
  return kind == "EventReducer" || kind == "ScaledNearestTraceReducer" ||
      kind == "ScaledCumulativeTraceReducer";
}

} // namespace

const std::vector<std::string>& reducerKinds() {
  static const std::vector<std::string> kinds = [] {
    std::vector<std::string> out;
    for (const auto& entry : builders()) {
      out.push_back(entry.first);
    }
    return out;
  }();
  return kinds;
}

std::shared_ptr<FoldReducer> makeReducer(
    const std::string& kind,
    double stepTime,
    double duration,
    bool inclusive,
    bool inplace,
    const std::map<std::string, double>& params,
    Criterion criterion) {
  for (const auto& [name, build] : builders()) {
    if (name != kind) {
      continue;
    }
    if (takesCriterion(kind)) {
      TORCH_CHECK_VALUE(
          criterion.valid(),
          kind,
          " needs a criterion: a built-in one (eq, ne, gt, ge, lt, le with a "
          "threshold, or nonzero) or, from Python, a callable");
    } else {
      TORCH_CHECK_VALUE(
          !criterion.valid(),
          kind,
          " takes no criterion, got ",
          criterion.repr());
    }
    Params reader(kind, params);
    std::shared_ptr<FoldReducer> reducer = build(
        Config{stepTime, duration, inclusive, inplace}, reader, criterion);
    reader.finish();
    return reducer;
  }
  std::string known;
  for (const std::string& name : reducerKinds()) {
    known += (known.empty() ? "" : ", ") + name;
  }
  C10_THROW_ERROR(
      ValueError,
      c10::str("unknown reducer kind '", kind, "'; the kinds are ", known));
}

} // namespace torch_monitor
