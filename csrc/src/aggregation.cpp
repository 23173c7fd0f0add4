#include <torch_monitor/aggregation.h>

#include <algorithm>
#include <cctype>
#include <string>

#include <c10/util/Exception.h>

namespace torch_monitor {
namespace {
constexpr const char* kValidNames =
    "value, mean, count, sum, max, min (or the ints 1..6)";
} // namespace

const char* aggregationName(Aggregation aggregation) {
  switch (aggregation) {
    case Aggregation::NONE:
      return "none";
    case Aggregation::VALUE:
      return "value";
    case Aggregation::MEAN:
      return "mean";
    case Aggregation::COUNT:
      return "count";
    case Aggregation::SUM:
      return "sum";
    case Aggregation::MAX:
      return "max";
    case Aggregation::MIN:
      return "min";
  }
  return "unknown";
}

Aggregation aggregationFromName(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  for (int i = 1; i < NUM_AGGREGATIONS; ++i) {
    const auto a = static_cast<Aggregation>(i);
    if (lower == aggregationName(a)) {
      return a;
    }
  }
  TORCH_CHECK_VALUE(
      false,
      "unknown aggregation '",
      std::string(name),
      "'; valid aggregations are ",
      kValidNames);
}

Aggregation aggregationFromInt(int64_t value) {
  TORCH_CHECK_VALUE(
      value >= 1 && value < NUM_AGGREGATIONS,
      "invalid aggregation ",
      value,
      "; valid aggregations are ",
      kValidNames);
  return static_cast<Aggregation>(value);
}

AggregationSet::AggregationSet(const std::vector<Aggregation>& aggregations) {
  for (Aggregation a : aggregations) {
    // Validates the value, which may have been cast from any int.
    aggregationFromInt(static_cast<int64_t>(a));
    bits_ |= 1u << static_cast<int>(a);
  }
}

std::vector<Aggregation> AggregationSet::members() const {
  std::vector<Aggregation> out;
  for (int i = 1; i < NUM_AGGREGATIONS; ++i) {
    if (contains(static_cast<Aggregation>(i))) {
      out.push_back(static_cast<Aggregation>(i));
    }
  }
  return out;
}

} // namespace torch_monitor
