#pragma once

// The bucketing of TensorBoard histograms, the same as
// torch.utils.tensorboard.SummaryWriter.add_histogram's default
// (bins="tensorflow"), so that one tensor gives the same HistogramProto from
// either writer.

#include <cstdint>
#include <vector>

#include <torch_monitor/export.h>

namespace at {
class Tensor; // declared only: the encoder uses Histogram without ATen
} // namespace at

namespace torch_monitor::sinks {

// The fields of TensorBoard's HistogramProto; a plain value. Bucket i holds
// bucketCounts[i] values and ends at bucketLimits[i] (the previous limit, or
// the first limit itself for i = 0, is where it starts).
struct Histogram {
  double min = 0;
  double max = 0;
  double num = 0;
  double sum = 0;
  double sumSquares = 0;
  std::vector<double> bucketLimits;
  std::vector<double> bucketCounts;
};

// SummaryWriter's default bucket edges: 0, ±1e-12 and every ±1e-12 * 1.1^k
// below 1e20 (computed by repeated multiplication, as it does), ascending.
TORCH_MONITOR_API const std::vector<double>& defaultHistogramEdges();

// The histogram of every element of `values` (any shape, real or bool dtype,
// any device; autograd ignored). As SummaryWriter does (numpy.histogram over
// the default edges, then trimming): a bucket counts the values from its
// lower edge up to, excluding, its upper edge, the last one including it;
// values outside the edges, NaN and infinities included, fall in no bucket
// but still count in min, max, num, sum and sumSquares (NaN then propagates
// there). Only the buckets from the one before the first non-empty one to
// the last non-empty one are kept. Elements are converted to double first
// (bfloat16 directly, where SummaryWriter goes through float16).
//
// The bucketing runs on the tensor's device in float64 (MPS, which has
// none, goes to the CPU); the result comes back with one copy. On the CPU
// it runs in chunks of 2**20 elements, each converted on its own: the extra
// memory is 8 MiB whatever the tensor's size (an expanded tensor is never
// materialised).
// Throws c10::TypeError for complex and other non-real dtypes, and
// c10::ValueError for an empty tensor or one with no value inside the
// edges (SummaryWriter raises ValueError for both).
// Thread safety: a pure function; safe to call from any thread.
TORCH_MONITOR_API Histogram computeHistogram(const at::Tensor& values);

// computeHistogram in two halves, for a caller that reads the device later
// (TensorBoardWriter defers the read of a device tensor's histogram to its
// next write). histogramSummary checks `values` (the TypeError and the
// empty-tensor ValueError above) and queues the bucketing on its device,
// reading nothing back: a 1-D float64 tensor of the default buckets'
// counts, then min, max, sum and sum of squares. histogramFromSummary makes
// the Histogram from that summary read to the host, for a tensor of `numel`
// elements (the ValueError for no value inside the edges).
// Thread safety: pure functions; safe to call from any thread.
TORCH_MONITOR_API at::Tensor histogramSummary(const at::Tensor& values);
TORCH_MONITOR_API Histogram histogramFromSummary(
    const double* summary,
    int64_t numel);

namespace detail {
// computeHistogram's two ways to count a contiguous 1-D float64 tensor into
// the default buckets (a float64 tensor of edges - 1 counts, on the
// tensor's device): a one-pass loop for CPU tensors, and bucketize +
// bincount for the other devices. Public so that tests check they agree.
TORCH_MONITOR_API at::Tensor countBucketsOnCpu(const at::Tensor& values);
TORCH_MONITOR_API at::Tensor countBucketsWithTensorOps(const at::Tensor& values);
} // namespace detail

} // namespace torch_monitor::sinks
