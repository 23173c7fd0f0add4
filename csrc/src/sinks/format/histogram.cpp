#include <torch_monitor/sinks/format/histogram.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/bucketize.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/dot.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_add.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

namespace torch_monitor::sinks {
namespace {

std::vector<double> makeEdges() {
  // SummaryWriter builds them this way (after TensorBoard's
  // generate_testdata.py); the same double operations give the same edges.
  std::vector<double> positive;
  for (double v = 1e-12; v < 1e20; v *= 1.1) {
    positive.push_back(v);
  }
  std::vector<double> edges;
  edges.reserve(2 * positive.size() + 1);
  for (auto it = positive.rbegin(); it != positive.rend(); ++it) {
    edges.push_back(-*it);
  }
  edges.push_back(0.0);
  edges.insert(edges.end(), positive.begin(), positive.end());
  return edges;
}

const at::Tensor& edgesOnCpu() {
  static const at::Tensor edges = [] {
    const std::vector<double>& values = defaultHistogramEdges();
    at::Tensor t = at::empty(
        {static_cast<int64_t>(values.size())}, at::TensorOptions(at::kDouble));
    std::memcpy(t.data_ptr<double>(), values.data(), values.size() * 8);
    return t;
  }();
  return edges;
}

void checkValues(const at::Tensor& values) {
  TORCH_CHECK_VALUE(
      values.defined(),
      "add_histogram: values is an undefined tensor; pass a tensor of the "
      "values to bucket");
  const at::ScalarType dtype = values.scalar_type();
  TORCH_CHECK_TYPE(
      at::isFloatingType(dtype) || at::isIntegralType(dtype, true),
      "add_histogram: values must be a real (floating, integer or bool) "
      "tensor, got ",
      dtype,
      "; for a complex tensor pass .real, .imag or .abs()");
  TORCH_CHECK_VALUE(
      values.numel() > 0,
      "add_histogram: values is empty (shape ",
      values.sizes(),
      "); a histogram needs at least one value");
}

} // namespace

namespace detail {

// In both counters a bucket holds [lower edge, upper edge), the last one
// also its upper edge; values outside the edges, NaN included, are in none
// (numpy.histogram's rule, which SummaryWriter uses).

// The edges grow by 1.1 from 1e-12 outwards, so log|x| guesses the bucket
// and a step or two along the exact edges settles it (the guess only affects
// speed, never the result). Runs on torch's intra-op threads; several times
// faster on the CPU than bucketize + bincount.
at::Tensor countBucketsOnCpu(const at::Tensor& values) {
  const std::vector<double>& edges = defaultHistogramEdges();
  const int64_t last = static_cast<int64_t>(edges.size()) - 1; // edge index
  const int64_t zero = last / 2; // edges[zero] == 0, 1e-12 * 1.1^k around it
  const double perStep = 1.0 / std::log(1.1);
  const double* v = values.const_data_ptr<double>();
  const double* e = edges.data();
  const int64_t n = values.numel();
  // One row of counts per intra-op thread, added up at the end.
  const int64_t threads = at::get_num_threads();
  at::Tensor partial =
      at::zeros({threads, last}, at::TensorOptions(at::kDouble));
  double* const counts = partial.mutable_data_ptr<double>();
  at::parallel_for(0, n, int64_t(1) << 16, [&](int64_t begin, int64_t end) {
    double* out = counts + at::get_thread_num() * last;
    for (int64_t i = begin; i < end; ++i) {
      const double x = v[i];
      if (!(x >= e[0] && x <= e[last])) {
        continue; // NaN too
      }
      const double steps = std::log(std::abs(x) * 1e12) * perStep;
      const int64_t k =
          steps > 0 ? std::min(static_cast<int64_t>(steps), zero - 1) : 0;
      int64_t g = x >= 0 ? zero + 1 + k : zero - 1 - k;
      // Settle on the last edge <= x.
      while (g < last && e[g + 1] <= x) {
        ++g;
      }
      while (e[g] > x) {
        --g;
      }
      out[std::min(g, last - 1)] += 1;
    }
  });
  return threads == 1 ? partial[0] : partial.sum(0);
}

// bucketize + index_add_ on the tensor's device, with no host read (bincount
// would read its input's range back to size its output).
at::Tensor countBucketsWithTensorOps(const at::Tensor& values) {
  const std::vector<double>& edgeList = defaultHistogramEdges();
  const at::Tensor edges = edgesOnCpu().to(values.device());
  const int64_t buckets = edges.numel() - 1;
  // bucketize(right=true) - 1 is the bucket whose [lower, upper) holds the
  // value; the value equal to the last edge belongs to the last bucket.
  at::Tensor index =
      at::bucketize(values, edges, /*out_int32=*/false, /*right=*/true)
          .sub(1)
          .clamp_max(buckets - 1);
  // Everything outside the edges (NaN fails both comparisons) goes to one
  // extra slot that is dropped: no boolean indexing, which would sync.
  const at::Tensor inside =
      values.ge(edgeList.front()).logical_and(values.le(edgeList.back()));
  index = at::where(inside, index, buckets);
  return at::zeros({buckets + 1}, values.options())
      .index_add_(0, index, at::ones({1}, values.options()).expand_as(values))
      .narrow(0, 0, buckets);
}

} // namespace detail

const std::vector<double>& defaultHistogramEdges() {
  static const std::vector<double> edges = makeEdges();
  return edges;
}

namespace {

// Elements bucketed at a time on the CPU (8 MiB as float64).
constexpr int64_t kHistogramChunk = int64_t(1) << 20;

// What computeHistogram reads from the values: the bucket counts, then min,
// max, sum and sum of squares (a float64 tensor of edges + 3 numbers).
at::Tensor summarise(const at::Tensor& values) {
  const auto [low, high] = at::aminmax(values);
  const at::Tensor counts = values.is_cpu()
      ? detail::countBucketsOnCpu(values)
      : detail::countBucketsWithTensorOps(values);
  return at::cat({counts,
                  low.reshape(1),
                  high.reshape(1),
                  values.sum().reshape(1),
                  at::dot(values, values).reshape(1)});
}

// Calls f(chunk) with every element of `values` in some chunk of at most
// `limit` elements: the chunks are narrowed views, each made contiguous on
// its own, so an expanded (stride 0) or non-contiguous tensor is never
// copied whole.
template <typename F>
void forEachChunk(const at::Tensor& values, int64_t limit, const F& f) {
  if (values.dim() <= 1) {
    const at::Tensor flat = values.reshape(-1); // a view: at most 1-D
    for (int64_t start = 0; start < flat.numel(); start += limit) {
      f(flat.narrow(0, start, std::min(limit, flat.numel() - start)));
    }
    return;
  }
  const int64_t rows = values.size(0);
  const int64_t perRow = rows == 0 ? 0 : values.numel() / rows;
  if (perRow > limit) {
    for (int64_t row = 0; row < rows; ++row) {
      forEachChunk(values.select(0, row), limit, f);
    }
    return;
  }
  const int64_t step =
      std::max<int64_t>(1, limit / std::max<int64_t>(perRow, 1));
  for (int64_t start = 0; start < rows; start += step) {
    f(values.narrow(0, start, std::min(step, rows - start)));
  }
}

// Merges two summaries of disjoint parts: counts and sums add up, min and
// max are those of both (NaN wins, as at::aminmax lets it).
void mergeSummary(double* into, const double* part, int64_t buckets) {
  for (int64_t i = 0; i < buckets; ++i) {
    into[i] += part[i];
  }
  double* extremes = into + buckets;
  const double* partExtremes = part + buckets;
  const auto nanOr = [](double a, double b, double value) {
    return std::isnan(a) || std::isnan(b)
        ? std::numeric_limits<double>::quiet_NaN()
        : value;
  };
  extremes[0] = nanOr(
      extremes[0], partExtremes[0], std::min(extremes[0], partExtremes[0]));
  extremes[1] = nanOr(
      extremes[1], partExtremes[1], std::max(extremes[1], partExtremes[1]));
  extremes[2] += partExtremes[2];
  extremes[3] += partExtremes[3];
}

} // namespace

at::Tensor histogramSummary(const at::Tensor& input) {
  checkValues(input);
  at::Tensor values = input.detach();
  if (values.device().is_mps()) {
    values = values.cpu(); // MPS has no float64
  }
  if (!values.is_cpu()) {
    // Queued on the device; the caller reads it once.
    return summarise(values.reshape(-1).to(at::kDouble).contiguous());
  }
  // In chunks: a float64 copy of the whole tensor would double the memory
  // that logging a large tensor needs (and materialise an expanded one).
  const int64_t buckets =
      static_cast<int64_t>(defaultHistogramEdges().size()) - 1;
  at::Tensor summary;
  forEachChunk(values, kHistogramChunk, [&](const at::Tensor& chunk) {
    const at::Tensor part =
        summarise(chunk.reshape(-1).to(at::kDouble).contiguous());
    if (!summary.defined()) {
      summary = part;
    } else {
      mergeSummary(
          summary.mutable_data_ptr<double>(),
          part.const_data_ptr<double>(),
          buckets);
    }
  });
  return summary;
}

Histogram histogramFromSummary(const double* summary, int64_t numel) {
  const std::vector<double>& edgeList = defaultHistogramEdges();
  const int64_t buckets = static_cast<int64_t>(edgeList.size()) - 1;
  const double* data = summary;
  const double* const countsEnd = data + buckets;

  const auto nonEmpty = [](double c) { return c != 0; };
  const double* first = std::find_if(data, countsEnd, nonEmpty);
  TORCH_CHECK_VALUE(
      first != countsEnd,
      "add_histogram: no value lies within the histogram's range [",
      edgeList.front(),
      ", ",
      edgeList.back(),
      "] (all are NaN, infinite or beyond it); SummaryWriter rejects such a "
      "tensor too. Filter the values first, e.g. values[values.isfinite()]");
  const double* last =
      std::find_if(std::make_reverse_iterator(countsEnd),
                   std::make_reverse_iterator(first),
                   nonEmpty)
          .base() -
      1;

  Histogram h;
  h.min = countsEnd[0];
  h.max = countsEnd[1];
  h.num = static_cast<double>(numel);
  h.sum = countsEnd[2];
  h.sumSquares = countsEnd[3];
  // TensorBoard keeps only upper limits; an empty bucket before the first
  // non-empty one marks where the data starts (its upper limit is the first
  // bucket's lower edge: edge 0 when the first bucket is bucket 0).
  const int64_t begin = (first - data) - 1;
  const int64_t end = last - data; // inclusive
  for (int64_t i = begin; i <= end; ++i) {
    h.bucketLimits.push_back(edgeList[static_cast<size_t>(i + 1)]);
    h.bucketCounts.push_back(i < 0 ? 0.0 : data[i]);
  }
  return h;
}

Histogram computeHistogram(const at::Tensor& values) {
  const at::Tensor host = histogramSummary(values).cpu(); // the one host read
  return histogramFromSummary(host.const_data_ptr<double>(), values.numel());
}

} // namespace torch_monitor::sinks
