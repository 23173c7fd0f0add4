#include <torch_monitor/sinks/format/text.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace torch_monitor::sinks::text {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD"; // U+FFFD in UTF-8

// Length of the well-formed UTF-8 sequence starting at p[0] (1..4), or 0
// with `invalid` set to the length of the maximal invalid subpart (the lead
// byte plus the continuation bytes that were still acceptable), so that one
// U+FFFD replaces exactly what Python's "replace" error handler replaces.
size_t sequenceLength(const unsigned char* p, size_t n, size_t& invalid) {
  const unsigned char lead = p[0];
  if (lead < 0x80) {
    return 1;
  }
  size_t need;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) {
      low = 0xA0; // no overlong forms
    } else if (lead == 0xED) {
      high = 0x9F; // no surrogates
    }
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) {
      low = 0x90; // no overlong forms
    } else if (lead == 0xF4) {
      high = 0x8F; // nothing above U+10FFFF
    }
  } else {
    invalid = 1; // a stray continuation byte, C0, C1, F5..FF
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    const unsigned char lo = k == 1 ? low : 0x80;
    const unsigned char hi = k == 1 ? high : 0xBF;
    if (k >= n || p[k] < lo || p[k] > hi) {
      invalid = k;
      return 0;
    }
  }
  return need + 1;
}

// Appends s, repairing UTF-8; with `escape`, also JSON-escapes.
template <bool escape>
void appendText(std::string& out, std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // Copy the longest run that needs no attention in one go.
    size_t run = i;
    while (run < n && p[run] < 0x80 &&
           (!escape || (p[run] >= 0x20 && p[run] != '"' && p[run] != '\\'))) {
      ++run;
    }
    out.append(s.data() + i, run - i);
    i = run;
    if (i == n) {
      break;
    }
    const unsigned char c = p[i];
    if (c < 0x80) { // only reached when escaping
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
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default: {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        }
      }
      ++i;
      continue;
    }
    size_t invalid = 0;
    const size_t len = sequenceLength(p + i, n - i, invalid);
    if (len > 0) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out += kReplacement;
      i += invalid;
    }
  }
}

// Days since 1970-01-01 to a civil date (H. Hinnant's algorithm): no time
// zone database, no locale, valid far beyond any realistic timestamp.
void civilFromDays(int64_t z, int64_t& y, unsigned& m, unsigned& d) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const unsigned doe = static_cast<unsigned>(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  y = static_cast<int64_t>(yoe) + era * 400;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  d = doy - (153 * mp + 2) / 5 + 1;
  m = mp < 10 ? mp + 3 : mp - 9;
  y += m <= 2;
}

// Floor division of micros into seconds and a 0..999999 remainder.
std::pair<int64_t, int64_t> splitMicros(int64_t micros) {
  int64_t seconds = micros / 1000000;
  int64_t rest = micros % 1000000;
  if (rest < 0) {
    rest += 1000000;
    seconds -= 1;
  }
  return {seconds, rest};
}

void appendShortestDouble(std::string& out, double value) {
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value);
  out.append(buf, result.ptr);
}

template <typename Fn>
void forEachSorted(const Event& event, Fn&& fn) {
  std::vector<const std::pair<const std::string, data_value_t>*> items;
  items.reserve(event.data.size());
  for (const auto& item : event.data) {
    items.push_back(&item);
  }
  std::sort(items.begin(), items.end(), [](const auto* a, const auto* b) {
    return a->first < b->first;
  });
  for (const auto* item : items) {
    fn(item->first, item->second);
  }
}

} // namespace

void appendUtf8Repaired(std::string& out, std::string_view s) {
  appendText<false>(out, s);
}

void appendJsonEscaped(std::string& out, std::string_view s) {
  appendText<true>(out, s);
}

void appendJsonString(std::string& out, std::string_view s) {
  out.push_back('"');
  appendText<true>(out, s);
  out.push_back('"');
}

void appendJsonDouble(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "\"NaN\"";
    return;
  }
  if (std::isinf(value)) {
    out += value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
    return;
  }
  const size_t start = out.size();
  appendShortestDouble(out, value);
  if (out.find_first_of(".e", start) == std::string::npos) {
    out += ".0"; // keep it a float for the reader
  }
}

void appendInt(std::string& out, int64_t value) {
  char buf[24];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value);
  out.append(buf, result.ptr);
}

void appendIso8601Utc(std::string& out, int64_t epochMicros) {
  const auto [seconds, micros] = splitMicros(epochMicros);
  int64_t days = seconds / 86400;
  int64_t secondOfDay = seconds % 86400;
  if (secondOfDay < 0) {
    secondOfDay += 86400;
    days -= 1;
  }
  int64_t year;
  unsigned month;
  unsigned day;
  civilFromDays(days, year, month, day);
  char buf[64];
  const int n = std::snprintf(
      buf,
      sizeof(buf),
      "%04lld-%02u-%02uT%02d:%02d:%02d.%06dZ",
      static_cast<long long>(year),
      month,
      day,
      static_cast<int>(secondOfDay / 3600),
      static_cast<int>(secondOfDay / 60 % 60),
      static_cast<int>(secondOfDay % 60),
      static_cast<int>(micros));
  out.append(buf, static_cast<size_t>(n));
}

void appendEpochSeconds(std::string& out, int64_t epochMicros) {
  // Exact decimal from the integer, so 0.1 s never prints as 0.09999.
  const bool negative = epochMicros < 0;
  const uint64_t magnitude = negative
      ? uint64_t(0) - static_cast<uint64_t>(epochMicros)
      : static_cast<uint64_t>(epochMicros);
  char buf[40];
  const int n = std::snprintf(
      buf,
      sizeof(buf),
      "%s%llu.%06llu",
      negative ? "-" : "",
      static_cast<unsigned long long>(magnitude / 1000000),
      static_cast<unsigned long long>(magnitude % 1000000));
  out.append(buf, static_cast<size_t>(n));
}

namespace {

// One value of Event.data: a JSON string, an integer, true/false, or a
// double written by `appendDouble` (JSON lines and console lines write
// non-finite doubles differently).
template <typename AppendDouble>
void appendDataValue(
    std::string& out,
    const data_value_t& value,
    AppendDouble&& appendDouble) {
  switch (value.index()) {
    case 0:
      appendJsonString(out, std::get<std::string>(value));
      break;
    case 1:
      appendDouble(out, std::get<double>(value));
      break;
    case 2:
      appendInt(out, std::get<int64_t>(value));
      break;
    default:
      out += std::get<bool>(value) ? "true" : "false";
      break;
  }
}

} // namespace

void appendJsonLine(
    std::string& out,
    const Event& event,
    std::optional<ProcessRank> rank) {
  const int64_t micros = toEpochMicros(event.timestamp);
  out += "{\"name\":";
  appendJsonString(out, event.name);
  out += ",\"timestamp\":\"";
  appendIso8601Utc(out, micros);
  out += "\",\"epoch_seconds\":";
  appendEpochSeconds(out, micros);
  if (event.step) {
    out += ",\"step\":";
    out += std::to_string(*event.step);
  }
  if (rank) {
    out += ",\"rank\":";
    out += std::to_string(rank->rank);
    out += ",\"world_size\":";
    out += std::to_string(rank->worldSize);
  }
  out += ",\"data\":{";
  bool first = true;
  forEachSorted(event, [&](const std::string& key, const data_value_t& value) {
    if (!first) {
      out.push_back(',');
    }
    first = false;
    appendJsonString(out, key);
    out.push_back(':');
    appendDataValue(out, value, appendJsonDouble);
  });
  out += "}}\n";
}

void appendConsoleLine(
    std::string& out,
    const Event& event,
    std::optional<ProcessRank> rank) {
  appendIso8601Utc(out, toEpochMicros(event.timestamp));
  if (rank) {
    out += " [rank ";
    out += std::to_string(rank->rank);
    out.push_back(']');
  }
  out.push_back(' ');
  appendJsonEscaped(out, event.name);
  if (event.step) {
    out += " [step ";
    out += std::to_string(*event.step);
    out.push_back(']');
  }
  forEachSorted(event, [&](const std::string& key, const data_value_t& value) {
    out.push_back(' ');
    appendJsonEscaped(out, key);
    out.push_back('=');
    appendDataValue(out, value, [](std::string& out, double d) {
      if (std::isfinite(d)) {
        appendShortestDouble(out, d);
      } else {
        out += std::isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf");
      }
    });
  });
  out.push_back('\n');
}

} // namespace torch_monitor::sinks::text
