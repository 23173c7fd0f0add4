#pragma once

#include <cstdint>
#include <vector>

#include <torch_monitor/aggregation.h>
#include <torch_monitor/export.h>

namespace torch_monitor::detail {

// A Stat's aggregations as given (order and duplicates kept) in 8 bytes, so
// that a stat needs no heap block for them: up to kMaxPacked valid entries
// are packed 3 bits each; a longer list (only duplicates can make one) lives
// on the heap.
// Thread safety: immutable after construction; concurrent reads are safe.
class TORCH_MONITOR_API PackedAggregationList {
 public:
  static constexpr int kMaxPacked = 21;

  // Every entry must be a valid aggregation (1..6): Stat validates first.
  explicit PackedAggregationList(const std::vector<Aggregation>& list);
  ~PackedAggregationList();
  PackedAggregationList(const PackedAggregationList&) = delete;
  PackedAggregationList& operator=(const PackedAggregationList&) = delete;

  std::vector<Aggregation> unpack() const;

 private:
  // Bit 0 set: entries in bits 1..63, 3 bits each, ended by a 0 (NONE is
  // never an entry). Bit 0 clear: a std::vector<Aggregation>* (heap blocks
  // are at least 8-byte aligned).
  uintptr_t bits_;
};

} // namespace torch_monitor::detail
