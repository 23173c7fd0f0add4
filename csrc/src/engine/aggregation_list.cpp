#include <torch_monitor/engine/aggregation_list.h>

namespace torch_monitor::detail {

static_assert(
    sizeof(uintptr_t) * 8 >= 1 + 3 * PackedAggregationList::kMaxPacked,
    "the packed form needs 64-bit words");
static_assert(NUM_AGGREGATIONS <= 8, "an aggregation must fit in 3 bits");

PackedAggregationList::PackedAggregationList(
    const std::vector<Aggregation>& list) {
  if (list.size() > size_t(kMaxPacked)) {
    bits_ = reinterpret_cast<uintptr_t>(new std::vector<Aggregation>(list));
    return;
  }
  bits_ = 1;
  for (size_t i = 0; i < list.size(); ++i) {
    bits_ |= uintptr_t(static_cast<int>(list[i])) << (1 + 3 * i);
  }
}

PackedAggregationList::~PackedAggregationList() {
  if ((bits_ & 1) == 0) {
    delete reinterpret_cast<std::vector<Aggregation>*>(bits_);
  }
}

std::vector<Aggregation> PackedAggregationList::unpack() const {
  if ((bits_ & 1) == 0) {
    return *reinterpret_cast<const std::vector<Aggregation>*>(bits_);
  }
  std::vector<Aggregation> out;
  for (uintptr_t rest = bits_ >> 1; rest != 0; rest >>= 3) {
    out.push_back(static_cast<Aggregation>(rest & 7));
  }
  return out;
}

} // namespace torch_monitor::detail
