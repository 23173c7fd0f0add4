#include <torch_monitor/rank_sync.h>

#include <utility>

#include <c10/util/Exception.h>

#include <torch_monitor/rank_sync/protocol.h>

namespace torch_monitor {

void setDefaultRankGroup(std::shared_ptr<const RankGroup> group) {
  if (group) {
    TORCH_CHECK_VALUE(
        group->store, "RankGroup: a Store is required (the group's c10d Store)");
    TORCH_CHECK_VALUE(
        group->worldSize >= 1 && group->rank >= 0 &&
            group->rank < group->worldSize,
        "RankGroup: rank must be in [0, worldSize), got rank ",
        group->rank,
        " of ",
        group->worldSize);
    TORCH_CHECK_VALUE(
        group->deadline.count() >= 1,
        "RankGroup: the deadline must be at least 1 ms, got ",
        group->deadline.count(),
        " ms");
  }
  detail::storeDefaultRankGroup(std::move(group));
}

std::shared_ptr<const RankGroup> defaultRankGroup() {
  return detail::loadDefaultRankGroup();
}

void flushRankSync() noexcept {
  detail::waitForRankSync();
}

void stopRankSync() noexcept {
  detail::stopRankSyncThread();
}

} // namespace torch_monitor
