#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch_monitor/export.h>
#include <torch_monitor/reducers/criterion.h>
#include <torch_monitor/reducers/fold_reducer.h>

namespace torch_monitor {

// Builds a reducer from its kind (the inferno class name) and its parameters
// by name, as the TorchScript class and saved models describe it:
//   PassthroughReducer, CAReducer       (none)
//   EventReducer                        initial (inf | 0 | nan; default inf)
//                                       + criterion
//   EMAReducer                          alpha
//   NearestTraceReducer,
//   CumulativeTraceReducer              time_constant, amplitude, target,
//                                       tolerance (optional)
//   ScaledNearestTraceReducer,
//   ScaledCumulativeTraceReducer        time_constant, amplitude, scale
//                                       + criterion
//   ConditionalNearestTraceReducer,
//   ConditionalCumulativeTraceReducer   time_constant, amplitude, scale
// Throws c10::ValueError for an unknown kind, a missing or unknown parameter,
// or a criterion given to / missing from a kind.
TORCH_MONITOR_API std::shared_ptr<FoldReducer> makeReducer(
    const std::string& kind,
    double stepTime,
    double duration,
    bool inclusive,
    bool inplace,
    const std::map<std::string, double>& params,
    Criterion criterion = Criterion());

// The kinds makeReducer() knows, in the table's order.
TORCH_MONITOR_API const std::vector<std::string>& reducerKinds();

} // namespace torch_monitor
