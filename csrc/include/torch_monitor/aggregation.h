#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

// The API throws c10::ValueError / c10::TypeError; callers can catch them.
#include <c10/util/Exception.h>

#include <torch_monitor/export.h>

namespace torch_monitor {

// The windowed aggregations a Stat can compute. The integer values are the
// ones torch::monitor::Aggregation uses, so code and saved models that store
// them as ints keep their meaning.
enum class Aggregation : int {
  NONE = 0, // never emitted; exists for torch::monitor parity
  VALUE = 1, // the last accepted sample of the window
  MEAN = 2,
  COUNT = 3,
  SUM = 4,
  MAX = 5,
  MIN = 6,
};

// The number of Aggregation values, NONE included (spelled as
// torch::monitor spells it, so its code compiles unchanged).
constexpr int NUM_AGGREGATIONS = 7;

// The hash of the maps Stat::get() returns, as torch::monitor names it (code
// written for it spells the map type out: unordered_map<Aggregation, T,
// AggregationHash>).
// Thread safety: stateless.
struct AggregationHash {
  std::size_t operator()(Aggregation aggregation) const noexcept {
    return static_cast<std::size_t>(aggregation);
  }
};

// Lower-case name ("value", "mean", ...) used to build event keys.
TORCH_MONITOR_API const char* aggregationName(Aggregation aggregation);

// Parses a name (case-insensitive) or throws c10::ValueError listing the
// valid names.
TORCH_MONITOR_API Aggregation aggregationFromName(std::string_view name);

// Maps 1..6 to an Aggregation or throws c10::ValueError listing the choices.
TORCH_MONITOR_API Aggregation aggregationFromInt(int64_t value);

// A set of aggregations stored as bits; duplicates collapse.
// Thread safety: a value type; concurrent reads are safe.
class AggregationSet {
 public:
  constexpr AggregationSet() = default;
  // Throws c10::ValueError for NONE or an out-of-range value.
  explicit AggregationSet(const std::vector<Aggregation>& aggregations);

  constexpr bool contains(Aggregation a) const noexcept {
    return bits_ & (1u << static_cast<int>(a));
  }
  bool empty() const noexcept {
    return bits_ == 0;
  }
  // The members in ascending enum order.
  std::vector<Aggregation> members() const;

 private:
  // One byte: a Stat keeps its flags beside it within its memory budget.
  uint8_t bits_ = 0;
  static_assert(NUM_AGGREGATIONS <= 8, "one bit per aggregation");
};

} // namespace torch_monitor
