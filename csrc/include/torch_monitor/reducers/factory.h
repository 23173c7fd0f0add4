#pragma once

#include <map>
#include <memory>
#include <string>

#include <torch_monitor/reducers/criterion.h>
#include <torch_monitor/reducers/fold_reducer.h>
#include <torch_monitor/reducers/kinds.h>

namespace torch_monitor {

// Builds a reducer from its kind (the inferno class name) and its parameters
// by name, as reducerKindTable() describes them (kinds.h). Throws
// c10::ValueError for an unknown kind (listing the kinds), a missing, unknown
// or out-of-range parameter (saying which and what is allowed), or a
// criterion given to / missing from a kind.
inline std::shared_ptr<FoldReducer> makeReducer(
    const std::string& kind,
    double stepTime,
    double duration,
    bool inclusive,
    bool inplace,
    const std::map<std::string, double>& params,
    Criterion criterion = Criterion()) {
  return std::make_shared<FoldReducer>(
      reducerKind(kind),
      stepTime,
      duration,
      inclusive,
      inplace,
      params,
      std::move(criterion));
}

} // namespace torch_monitor
