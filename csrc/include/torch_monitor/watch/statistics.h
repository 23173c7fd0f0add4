#pragma once

// The sufficient statistics a watch keeps per key ("<path>.<kind>"): one row
// of kColumns float64 cells (the last holds an int64 step), to which every
// observation of a tensor adds its own row (sums add, extremes take the
// extreme), and from which a closed window derives the statistics it logs
// (docs/watch.md). Rows merge the same way within a window, on the host, and
// across ranks: so one rule serves all three, and a merged window is exactly
// the window of all observations.

#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>

#include <ATen/core/Tensor.h>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>

namespace torch_monitor::watch {

// The columns of a row. Columns [0, kSumColumns) add up; those up to
// kFirstNonFinite keep their largest value (minima are kept negated, so that
// one maximum serves every extreme). The last cell holds an int64, not a
// double: the first step that saw a non-finite element, kNoStep when none,
// kept exact (a double rounds steps above 2**53) and merged by its minimum.
// So a row merges with one add, one maximum and one minimum, on the device
// as on the host.
namespace column {
inline constexpr int64_t kElements = 0; // elements seen, non-finite included
inline constexpr int64_t kNonFinite = 1; // NaN and +-inf elements
inline constexpr int64_t kZeros = 2; // elements equal to 0
inline constexpr int64_t kSum = 3; // sum of the finite elements
inline constexpr int64_t kSumSquares = 4; // sum of their squares
inline constexpr int64_t kNormSum = 5; // sum over observations of their L2 norm
inline constexpr int64_t kObservations = 6;
inline constexpr int64_t kRatioSum = 7; // update: sum of ||dW|| / ||W before||
inline constexpr int64_t kRatioCount = 8; // update: steps in kRatioSum
inline constexpr int64_t kBeforeSquares = 9; // update: sum of ||W before||^2
inline constexpr int64_t kSumColumns = 10;
inline constexpr int64_t kNegMin = 10; // -(smallest finite element)
inline constexpr int64_t kMax = 11; // largest finite element
inline constexpr int64_t kAbsMax = 12; // largest |finite element|
inline constexpr int64_t kNormMax = 13; // largest L2 norm of an observation
inline constexpr int64_t kFirstNonFinite = 14; // int64: first step with one
inline constexpr int64_t kColumns = 15;
inline constexpr int64_t kNoStep = std::numeric_limits<int64_t>::max();
} // namespace column

// The row of a key that saw nothing: zeros, -inf, and kNoStep.
TORCH_MONITOR_API void fillIdentity(double* row) noexcept;
// The first non-finite step of a host row (kNoStep when it saw none).
TORCH_MONITOR_API int64_t firstNonFiniteStep(const double* row) noexcept;
// Sets every row of `slots` ([keys, kColumns], float64, any device) to the
// identity, without reading it (two small kernels on a device).
TORCH_MONITOR_API void resetSlots(const at::Tensor& slots);
// Merges `from` into `into` (host rows).
TORCH_MONITOR_API void mergeRow(double* into, const double* from) noexcept;

// Adds one observation of `values` (any floating dtype on the CPU; for an
// update, `values` is the weight after the step and `before` the weight
// before it, and the observation is their difference) to the host row
// `row`. `step` is recorded as the first non-finite step when the
// observation has a non-finite element. Reads the tensors in place, in one
// pass (split over the intra-op threads for large tensors).
TORCH_MONITOR_API void observeOnHost(
    double* row,
    const at::Tensor& values,
    const at::Tensor* before,
    int64_t step);

// The rows of k observations at once, computed with ATen ops on their
// device (nothing is read on the host): [k, kColumns] float64, with the
// first non-finite step left at kNoStep (mergeRowsOnDevice sets it).
// `values` are k tensors on one device, all real or all complex (a complex
// tensor is observed as its magnitudes); for updates `before` holds the
// weights before the step, one per value (else it is empty). k > 1 costs
// the same few dozen ops as k = 1: the tensors are joined into one vector
// whose segments are reduced together, which is what makes a watch's
// optimizer-step observations cheap on a GPU, where each op is a launch
// (docs/performance.md, "watch"). `offsets` ([k + 1] int64 on that device:
// 0, n0, n0 + n1, ...; the segments' bounds) is needed for k > 1 only.
TORCH_MONITOR_API at::Tensor rowsOnDevice(
    at::TensorList values,
    at::TensorList before,
    const at::Tensor& offsets);

// Merges `rows` ([k, kColumns]) into `slots` ([k, kColumns], a view of the
// slot buffer, same device) when `gate` (a 0-d int64 tensor on that
// device: the step when this step is observed, else -1) says so; the gate's
// step is the first non-finite step of a row with one. All device work: a
// closed gate merges the identity.
TORCH_MONITOR_API void mergeRowsOnDevice(
    const at::Tensor& slots,
    at::Tensor rows,
    const at::Tensor& gate);

// One row ([1, kColumns], on rows' device) that is the merge of `rows`
// ([k, kColumns]): sums added, maxima taken; the row of all their
// observations together.
TORCH_MONITOR_API at::Tensor mergedRow(const at::Tensor& rows);

// Makes the merged row of one step's gradients ("total.grad") or updates
// ("total.update") one observation whose norm is the L2 norm over all of
// them: the norm columns become sqrt(sum of squares), the observations 1,
// and for updates the ratio ||dW|| / ||W before|| over the whole model
// (when it saw nothing, it stays the identity). A host row, or a
// [1, kColumns] tensor on any device (ATen ops there, nothing read on the
// host).
TORCH_MONITOR_API void asOneObservation(double* row) noexcept;
TORCH_MONITOR_API void asOneObservation(const at::Tensor& row);

// The statistics of a key's row, as the event data of a closed window:
// "<key>.rms", ".mean", ".min", ".max", ".abs_max", ".norm", ".norm_max",
// ".nonfinite" (an int), ".zero_frac" and, with `withRatio`, ".ratio". Nothing when the
// row has no observation. A statistic that no finite element defines (rms of
// a tensor that was all NaN, say) is NaN.
TORCH_MONITOR_API void appendStatistics(
    std::unordered_map<std::string, data_value_t>& data,
    const std::string& key,
    const double* row,
    bool withRatio);

} // namespace torch_monitor::watch
