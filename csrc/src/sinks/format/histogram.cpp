#include <torch_monitor/sinks/format/histogram.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

// The edges on `device` without a host synchronisation: a blocking
// host-to-device copy waits for the stream, which add_histogram of a CUDA
// tensor must never do. The copy is non-blocking from a pinned host copy
// that lives as long as the process (never freed: a static destructor would
// free pinned memory after CUDA has shut down). Where pinning is not
// supported, the copy from pageable memory blocks, as it must.
at::Tensor edgesOn(const at::Device& device) {
  if (device.is_cpu()) {
    return edgesOnCpu();
  }
  static const at::Tensor* const source = []() -> const at::Tensor* {
    try {
      return new at::Tensor(edgesOnCpu().pin_memory());
    } catch (const c10::Error&) {
      return &edgesOnCpu();
    }
  }();
  return source->to(device, /*non_blocking=*/true);
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
  // Refused here, at the call: read later (a device tensor's values are
  // read when the writer writes), they failed with ATen's own words.
  TORCH_CHECK_TYPE(
      !values.is_nested(),
      "add_histogram: values is a nested tensor; pass its values, e.g. "
      "torch.cat([t.flatten() for t in values.unbind()])");
  TORCH_CHECK_TYPE(
      values.layout() == at::kStrided,
      "add_histogram: values must be a dense tensor, got layout ",
      values.layout(),
      "; pass .to_dense() (or a sparse tensor's .values())");
  TORCH_CHECK_VALUE(
      !values.is_meta(),
      "add_histogram: values is on the meta device, which holds no values; "
      "pass the tensor once it holds them");
  TORCH_CHECK_VALUE(
      values.numel() > 0,
      "add_histogram: values is empty (shape ",
      values.sizes(),
      "); a histogram needs at least one value");
}


// About log(|x| * 1e12) / log(1.1), the bucket of x counted from zero: the
// exponent bits give log2 |x| and the mantissa m in [1, 2) adds m - 1 (off
// by at most 0.086 of a unit, under one bucket). No libm call: a std::log
// per element made a watch's histograms cost more than wandb's (docs/watch.md).
inline double bucketSteps(double x) {
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const int exponent = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  uint64_t mantissaBits =
      (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
  double mantissa;
  std::memcpy(&mantissa, &mantissaBits, sizeof mantissa);
  const double log2Magnitude = exponent + (mantissa - 1.0);
  constexpr double kLog2Of1e12 = 39.86313713864835;
  constexpr double kStepsPerLog2 = 7.272540897341713; // 1 / log2(1.1)
  return (log2Magnitude + kLog2Of1e12) * kStepsPerLog2;
}

// One pass over a CPU tensor: the bucket counts and the histogram's min,
// max, sum and sum of squares (NaN when a value is NaN, as aminmax and sum
// give them).
struct CpuScan {
  std::vector<double> counts;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0;
  double sumSquares = 0;
  bool nan = false;
};

// Counts are kept in four interleaved rows (element i in row i % 4): one row
// would chain every value of a bucket on the previous one's increment.
constexpr int kCountRows = 4;
// Elements per block between folding the 32-bit counts into doubles.
constexpr int64_t kCountBlock = int64_t(1) << 30;

template <typename T>
CpuScan scanOnCpu(const T* v, int64_t n) {
  const std::vector<double>& edges = defaultHistogramEdges();
  const int64_t last = static_cast<int64_t>(edges.size()) - 1; // edge index
  const int64_t zero = last / 2; // edges[zero] == 0, 1e-12 * 1.1^k around it
  const double* e = edges.data();
  const int64_t threads = at::get_num_threads();
  std::vector<CpuScan> perThread(threads);
  at::parallel_for(0, n, int64_t(1) << 16, [&](int64_t begin, int64_t end) {
    CpuScan& out = perThread[at::get_thread_num()];
    if (out.counts.empty()) {
      out.counts.assign(last, 0.0);
    }
    std::vector<uint32_t> rows(kCountRows * last);
    double lo = out.min, hi = out.max, sum = out.sum, squares = out.sumSquares;
    bool nan = out.nan;
    for (int64_t blockBegin = begin; blockBegin < end;
         blockBegin += kCountBlock) {
      const int64_t blockEnd = std::min(end, blockBegin + kCountBlock);
      for (int64_t i = blockBegin; i < blockEnd; ++i) {
        const double x = static_cast<double>(v[i]);
        sum += x;
        squares += x * x;
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
        nan |= x != x;
        if (!(x >= e[0] && x <= e[last])) {
          continue; // NaN too
        }
        const double steps = bucketSteps(x);
        const int64_t k =
            steps > 0 ? std::min(static_cast<int64_t>(steps), zero - 1) : 0;
        // Buckets mirror around 0: [-1.1^(k+1), -1.1^k) is zero - 2 - k.
        const int64_t guess =
            x >= 0 ? zero + 1 + k : std::max<int64_t>(zero - 2 - k, 0);
        // Settle on the last edge <= x. The guess is off by at most one
        // bucket: the bucket is guess - 1 plus how many of the next two
        // edges are <= x, three independent loads and no branch (loops
        // mispredicted on every other value, 4x slower on random data). The
        // loops after it only guard the invariant.
        const int64_t base = std::max<int64_t>(guess - 1, 0);
        int64_t g = base +
            static_cast<int64_t>(e[std::min(base + 1, last)] <= x) +
            static_cast<int64_t>(e[std::min(base + 2, last)] <= x);
        g = std::min(g, last);
        while (g < last && e[g + 1] <= x) {
          ++g;
        }
        while (e[g] > x) {
          --g;
        }
        ++rows[(i % kCountRows) * last + std::min(g, last - 1)];
      }
      for (int r = 0; r < kCountRows; ++r) {
        for (int64_t b = 0; b < last; ++b) {
          out.counts[b] += rows[r * last + b];
          rows[r * last + b] = 0;
        }
      }
    }
    out.min = lo;
    out.max = hi;
    out.sum = sum;
    out.sumSquares = squares;
    out.nan = nan;
  });
  CpuScan all;
  all.counts.assign(last, 0.0);
  for (const CpuScan& part : perThread) {
    if (part.counts.empty()) {
      continue;
    }
    for (int64_t b = 0; b < last; ++b) {
      all.counts[b] += part.counts[b];
    }
    all.min = std::min(all.min, part.min);
    all.max = std::max(all.max, part.max);
    all.sum += part.sum;
    all.sumSquares += part.sumSquares;
    all.nan = all.nan || part.nan;
  }
  if (all.nan) {
    all.min = all.max = std::numeric_limits<double>::quiet_NaN();
  }
  return all;
}

} // namespace

namespace detail {

// In both counters a bucket holds [lower edge, upper edge), the last one
// also its upper edge; values outside the edges, NaN included, are in none
// (numpy.histogram's rule, which SummaryWriter uses).

// The edges grow by 1.1 from 1e-12 outwards, so log|x| guesses the bucket
// (bucketSteps) and a step or two along the exact edges settles it (the
// guess only affects speed, never the result). Runs on torch's intra-op
// threads; several times faster on the CPU than bucketize + bincount.
at::Tensor countBucketsOnCpu(const at::Tensor& values) {
  const CpuScan scan =
      scanOnCpu(values.const_data_ptr<double>(), values.numel());
  at::Tensor counts = at::empty(
      {static_cast<int64_t>(scan.counts.size())}, at::TensorOptions(at::kDouble));
  std::memcpy(
      counts.mutable_data_ptr<double>(),
      scan.counts.data(),
      scan.counts.size() * sizeof(double));
  return counts;
}

// bucketize + index_add_ on the tensor's device, with no host read (bincount
// would read its input's range back to size its output).
at::Tensor countBucketsWithTensorOps(const at::Tensor& values) {
  const std::vector<double>& edgeList = defaultHistogramEdges();
  const at::Tensor edges = edgesOn(values.device());
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

// summarise() for a CPU chunk: a float or double one in one pass in its
// own dtype (a watch writes one histogram per layer: this path is most of
// its cost), others as float64.
at::Tensor summariseOnCpu(const at::Tensor& chunk) {
  const at::Tensor flat = chunk.reshape(-1).contiguous();
  if (flat.scalar_type() != at::kFloat && flat.scalar_type() != at::kDouble) {
    return summarise(flat.to(at::kDouble));
  }
  const CpuScan scan = flat.scalar_type() == at::kFloat
      ? scanOnCpu(flat.const_data_ptr<float>(), flat.numel())
      : scanOnCpu(flat.const_data_ptr<double>(), flat.numel());
  const int64_t buckets = static_cast<int64_t>(scan.counts.size());
  at::Tensor out = at::empty({buckets + 4}, at::TensorOptions(at::kDouble));
  double* data = out.mutable_data_ptr<double>();
  std::copy(scan.counts.begin(), scan.counts.end(), data);
  data[buckets] = scan.min;
  data[buckets + 1] = scan.max;
  data[buckets + 2] = scan.sum;
  data[buckets + 3] = scan.sumSquares;
  return out;
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
    const at::Tensor part = summariseOnCpu(chunk);
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
