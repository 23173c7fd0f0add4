#include "py_common.h"

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h> // c10::intrusive_ptr holders

#include <torch_monitor/rank_sync.h>

namespace torch_monitor::python {

// A torch.distributed Store object (torch's binding shares our pybind11
// internals, so it casts to the C++ Store it wraps).
std::shared_ptr<const RankGroup> groupFromPython(
    py::handle store,
    int64_t rank,
    int64_t worldSize,
    double deadlineSeconds) {
  auto group = std::make_shared<RankGroup>();
  group->store = store.cast<c10::intrusive_ptr<c10d::Store>>();
  group->rank = rank;
  group->worldSize = worldSize;
  group->deadline = std::chrono::milliseconds(
      static_cast<int64_t>(deadlineSeconds * 1000.0));
  return group;
}

void initRankSync(py::module_& m) {
  m.def(
      "_set_default_rank_group",
      [](py::handle store, int64_t rank, int64_t worldSize, double deadline) {
        setDefaultRankGroup(
            store.is_none() ? nullptr
                            : groupFromPython(store, rank, worldSize, deadline));
      },
      py::arg("store"),
      py::arg("rank"),
      py::arg("world_size"),
      py::arg("deadline"),
      "Sets the process default rank group (None unsets it); used by "
      "Stat(sync_ranks=True) and TorchScript's sync_ranks");
  m.def(
      "_flush_rank_sync",
      &flushRankSync,
      // Merged events reach Python handlers on the rank sync thread.
      py::call_guard<py::gil_scoped_release>(),
      "Waits (bounded by the deadlines) until every closed window of a "
      "synced Stat is posted and, on rank 0, merged and logged");
}

} // namespace torch_monitor::python
