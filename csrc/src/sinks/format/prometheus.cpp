#include <torch_monitor/sinks/format/prometheus.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include <c10/util/Exception.h>

#include <torch_monitor/aggregation.h>
#include <torch_monitor/detail/text.h>
#include <torch_monitor/process_rank.h>
#include <torch_monitor/statistics_events.h>
#include <torch_monitor/sinks/format/text.h>

namespace torch_monitor::sinks::prometheus {
namespace {

constexpr std::string_view kPrefix = "torch_monitor_";

bool isNameChar(char c, bool first) {
  const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  const bool digit = c >= '0' && c <= '9';
  return letter || c == '_' || (!first && digit);
}

// A Stat event key "<stat>.<aggregation>": the aggregation's position, or
// npos when the key does not end with a known aggregation name.
size_t aggregationDot(const std::string& key) {
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos || dot == 0) {
    return std::string::npos;
  }
  const std::string_view suffix(key.data() + dot + 1, key.size() - dot - 1);
  for (int a = 1; a < NUM_AGGREGATIONS; ++a) {
    if (suffix == aggregationName(static_cast<Aggregation>(a))) {
      return dot;
    }
  }
  return std::string::npos;
}

// Escapes '\', '"' (when `quote`) and newline after repairing UTF-8.
void appendEscaped(std::string& out, std::string_view s, bool quote) {
  std::string repaired;
  text::appendUtf8Repaired(repaired, s);
  for (char c : repaired) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out.push_back(c);
    }
  }
}

void appendSample(
    std::string& out,
    const std::string& name,
    const Labels& labels,
    const char* aggregation,
    const std::variant<double, int64_t>& value) {
  out += name;
  bool first = true;
  auto label = [&](std::string_view key, std::string_view text) {
    out += first ? "{" : ",";
    first = false;
    out += key;
    out += "=\"";
    appendLabelValue(out, text);
    out += '"';
  };
  for (const auto& [key, text] : labels) {
    label(key, text);
  }
  if (aggregation != nullptr) {
    label("aggregation", aggregation);
  }
  out += first ? " " : "} ";
  if (const auto* i = std::get_if<int64_t>(&value)) {
    text::appendInt(out, *i);
  } else {
    appendSampleValue(out, std::get<double>(value));
  }
  out += '\n';
}

void appendFamilyHead(
    std::string& out,
    const std::string& name,
    const std::string& help,
    const char* type) {
  out += "# HELP ";
  out += name;
  out += ' ';
  appendHelpText(out, help);
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

} // namespace

std::string metricName(std::string_view statName) {
  std::string out(kPrefix);
  for (char c : statName) {
    out.push_back(isNameChar(c, false) || c == ':' ? c : '_');
  }
  return out;
}

void appendLabelValue(std::string& out, std::string_view value) {
  appendEscaped(out, value, /*quote=*/true);
}

void appendHelpText(std::string& out, std::string_view text) {
  appendEscaped(out, text, /*quote=*/false);
}

void appendSampleValue(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
  } else if (std::isinf(value)) {
    out += value > 0 ? "+Inf" : "-Inf";
  } else {
    char buf[32];
    const auto result = std::to_chars(buf, buf + sizeof(buf), value);
    out.append(buf, result.ptr);
  }
}

Labels checkedLabels(const std::map<std::string, std::string>& labels) {
  Labels out;
  for (const auto& [name, value] : labels) {
    bool valid = !name.empty();
    for (size_t i = 0; i < name.size() && valid; ++i) {
      valid = isNameChar(name[i], i == 0);
    }
    TORCH_CHECK_VALUE(
        valid,
        "Prometheus label name '",
        name,
        "' is invalid: use letters, digits and '_', not starting with a digit");
    TORCH_CHECK_VALUE(
        name.rfind("__", 0) != 0,
        "Prometheus label name '",
        name,
        "' is invalid: names starting with '__' are reserved by Prometheus");
    TORCH_CHECK_VALUE(
        name != "aggregation",
        "Prometheus label name 'aggregation' is taken by the sink itself "
        "(it names each sample's aggregation); choose another name");
    torch_monitor::detail::checkText(value, "Prometheus label value");
    out.emplace_back(name, value);
  }
  // In a distributed job every sample says which rank it comes from, unless
  // the user labelled the rank already; kept sorted by name.
  if (labels.count("rank") == 0) {
    if (const auto rank = processRank()) {
      const auto at = std::find_if(out.begin(), out.end(), [](const auto& l) {
        return l.first > "rank";
      });
      out.emplace(at, "rank", std::to_string(rank->rank));
    }
  }
  return out; // sorted by name
}

bool isWindowEvent(const Event& event) {
  return statisticsEvent(event.name).has_value();
}

void Snapshot::update(const Event& event) {
  const std::optional<StatisticSuffix> suffix = statisticsEvent(event.name);
  if (!suffix) {
    return;
  }
  // Keys whose statistic is their last part (a watch's: rms, norm, ...).
  const bool lastPart = *suffix == StatisticSuffix::kLastPart;
  // One event is one closed window of each Stat it names: the new windows
  // are built here, outside the lock, then replace the old ones (an
  // aggregation missing now is dropped).
  std::map<std::string, std::shared_ptr<Window>> windows;
  std::map<std::string, int64_t> counts;
  for (const auto& [key, data] : event.data) {
    // A watch's keys end in statistics of their own (rms, norm, ...).
    const size_t dot = lastPart ? key.rfind('.') : aggregationDot(key);
    std::variant<double, int64_t> value;
    if (const auto* d = std::get_if<double>(&data)) {
      value = *d;
    } else if (const auto* i = std::get_if<int64_t>(&data)) {
      value = *i;
    } else {
      continue; // strings and bools are no samples
    }
    std::string stat;
    std::string aggregation;
    if (!lastPart && dot == std::string::npos && !key.empty()) {
      // A key with no aggregation is a value of its own: a gauge read at a
      // close ("<key>.active", a dynamic counter) or a merge's "<stat>.ranks".
      stat = key;
      aggregation = aggregationName(Aggregation::VALUE);
    } else if (dot == std::string::npos || dot == 0) {
      continue;
    } else {
      stat = key.substr(0, dot);
      aggregation = key.substr(dot + 1);
    }
    std::shared_ptr<Window>& window = windows[stat];
    if (window == nullptr) {
      window = std::make_shared<Window>();
      window->stat = std::move(stat);
      window->source = event.name;
    }
    if (aggregation == aggregationName(Aggregation::COUNT)) {
      window->hasCount = true;
      const double count = std::holds_alternative<int64_t>(value)
          ? static_cast<double>(std::get<int64_t>(value))
          : std::get<double>(value);
      // A count logged by hand may be anything: a negative or non-finite
      // one is left out of the counter.
      window->countTotal = std::isfinite(count) && count >= 0 ? count : 0;
    }
    window->values[aggregation] = value;
  }
  std::lock_guard<std::mutex> guard(mutex_);
  for (auto& [stat, window] : windows) {
    std::shared_ptr<const Window>& slot = stats_[stat];
    if (slot != nullptr && window->hasCount) {
      window->countTotal += slot->countTotal;
    }
    slot = std::move(window);
  }
}

std::string Snapshot::render(
    const Labels& labels,
    std::vector<std::string>* clashes) const {
  std::vector<std::shared_ptr<const Window>> windows;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    windows.reserve(stats_.size());
    for (const auto& entry : stats_) {
      windows.push_back(entry.second);
    }
  }
  std::string out;
  std::set<std::string> families;
  for (const auto& window : windows) {
    const std::string& stat = window->stat;
    const std::string gauge = metricName(stat);
    const std::string counter = gauge + "_count_total";
    if (families.count(gauge) != 0 ||
        (window->hasCount && families.count(counter) != 0)) {
      if (clashes != nullptr) {
        clashes->push_back(stat);
      }
      continue;
    }
    families.insert(gauge);
    appendFamilyHead(
        out,
        gauge,
        (window->source == kStatEventName ? std::string("torch_monitor Stat '")
                                          : window->source + " '") +
            stat + "': last closed window",
        "gauge");
    for (const auto& [aggregation, value] : window->values) {
      appendSample(out, gauge, labels, aggregation.c_str(), value);
    }
    if (window->hasCount) {
      families.insert(counter);
      appendFamilyHead(
          out,
          counter,
          "torch_monitor Stat '" + stat + "': samples counted, all windows",
          "counter");
      appendSample(out, counter, labels, nullptr, window->countTotal);
    }
  }
  return out;
}

size_t Snapshot::size() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return stats_.size();
}

} // namespace torch_monitor::sinks::prometheus
