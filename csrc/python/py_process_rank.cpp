// The process rank (process_rank.h) for Python: torch_monitor/_ranks.py sets
// it from torch.distributed; set_process_rank sets it by hand.

#include "py_common.h"

#include <optional>
#include <utility>

#include <pybind11/stl.h>

#include <torch_monitor/process_rank.h>

namespace torch_monitor::python {

void initProcessRank(py::module_& m) {
  m.def(
      "_set_process_rank",
      [](std::optional<int64_t> rank, std::optional<int64_t> worldSize) {
        if (!rank && !worldSize) {
          clearProcessRank();
          return;
        }
        if (!rank || !worldSize) {
          throw py::value_error(
              "set_process_rank: give both rank and world_size, or None "
              "for both (not distributed)");
        }
        setProcessRank(*rank, *worldSize);
      },
      py::arg("rank"),
      py::arg("world_size"),
      "Sets (or with None, None clears) the rank the file sinks use");
  m.def(
      "_process_rank",
      []() -> std::optional<std::pair<int64_t, int64_t>> {
        const auto rank = processRank();
        if (!rank) {
          return std::nullopt;
        }
        return std::make_pair(rank->rank, rank->worldSize);
      },
      "(rank, world_size) as the core sees it, or None");
}

} // namespace torch_monitor::python
