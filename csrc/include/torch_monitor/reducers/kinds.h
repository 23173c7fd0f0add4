#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch_monitor/export.h>

namespace torch_monitor {

// The one description of every reducer kind. makeReducer(), the TorchScript
// class torch.classes.torch_monitor.Reducer and the Python classes of
// torch_monitor.reducers all read it, so adding a reducer is one entry in
// reducerKindTable() (kinds.cpp) plus, for a new kind of fold, its case in
// FoldReducer::fold() (fold_reducer.cpp).

// What values a parameter accepts.
enum class ParamCheck {
  Any, // any number
  Positive, // > 0
  NonZero, // != 0
  UnitInterval, // in [0, 1]
  InfZeroNan, // inf, 0 or nan (EventReducer's initial)
};

// One parameter of a kind.
// Thread safety: immutable once in the table.
struct ParamSpec {
  std::string name;
  // nullopt: required, unless `unsettable`.
  std::optional<double> defaultValue;
  ParamCheck check = ParamCheck::Any;
  // May be absent (no default): params() leaves it out and setting it to NaN
  // unsets it (a trace's tolerance; None in Python).
  bool unsettable = false;
  // Set at construction only (it decides the history's fill value).
  bool fixed = false;
};

// Where a step's matches come from.
enum class MatchSource {
  None,
  Criterion, // criterion(observation); the kind takes a criterion
  Target, // observation == target (within tolerance)
  Condition, // a second input: bool, or its nonzero elements
};

// The state after a step, given the observation, the matches and the
// previous state (see folds.h).
enum class FoldRule {
  Passthrough, // x
  Event, // 0 on a match, else previous + step time
  MovingAverage, // alpha * x + (1 - alpha) * s
  CumulativeAverage, // s + (x - s) / n
  NearestTrace, // the contribution on a match, else decayed
  CumulativeTrace, // decayed + the contribution on a match
};

// The state between two recorded ones, `sampleAt` after the older.
enum class Interpolation {
  Previous, // the older one
  Elapsed, // the older one + sampleAt
  Linear, // linear between both
  Decay, // the older one decayed by exp(-sampleAt / time_constant)
};

// Thread safety: immutable (the table is built once, on first use).
struct TORCH_MONITOR_API ReducerKind {
  std::string name; // the inferno class name
  std::vector<ParamSpec> params; // in the inferno constructor's order
  MatchSource match = MatchSource::None;
  FoldRule fold = FoldRule::Passthrough;
  Interpolation interpolation = Interpolation::Previous;
  // The parameter whose value fills never-written rows; empty: 0.
  std::string fillParam;

  bool takesCriterion() const noexcept {
    return match == MatchSource::Criterion;
  }
  // How many tensors forward() takes.
  size_t arity() const noexcept {
    return match == MatchSource::Condition ? 2 : 1;
  }
  // nullptr when the kind has no such parameter.
  const ParamSpec* param(const std::string& name) const noexcept;
  // Throws c10::ValueError naming the parameter, the kind and the allowed
  // values when `value` is not allowed (or `name` unknown).
  void checkParam(const std::string& name, double value) const;
  // The parameters of a new reducer: `given` checked, defaults added.
  // Throws c10::ValueError for a missing, unknown or invalid parameter.
  std::map<std::string, double> resolveParams(
      const std::map<std::string, double>& given) const;
  // The fill value of a reducer with these (resolved) parameters.
  double fill(const std::map<std::string, double>& params) const;
};

// Every kind, in inferno's order.
TORCH_MONITOR_API const std::vector<ReducerKind>& reducerKindTable();
// Their names, in the table's order: the kinds makeReducer() knows.
TORCH_MONITOR_API const std::vector<std::string>& reducerKinds();
// Throws c10::ValueError listing the kinds when `name` is not one.
TORCH_MONITOR_API const ReducerKind& reducerKind(const std::string& name);
// The allowed values of a check in words ("> 0", "in [0, 1]", ...).
TORCH_MONITOR_API const char* describeCheck(ParamCheck check) noexcept;

} // namespace torch_monitor
