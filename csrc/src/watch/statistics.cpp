#include <torch_monitor/watch/statistics.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/diff.h>
#include <ATen/ops/div.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/segment_reduce.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/square.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

namespace torch_monitor::watch {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One pass over (part of) a tensor.
struct Partial {
  double nonFinite = 0;
  double zeros = 0;
  double sum = 0;
  double sumSquares = 0;
  double min = kInf;
  double max = -kInf;
  double absMax = -kInf;
  double beforeSquares = 0; // update: ||W before||^2, every element

  void merge(const Partial& o) noexcept {
    nonFinite += o.nonFinite;
    zeros += o.zeros;
    sum += o.sum;
    sumSquares += o.sumSquares;
    min = std::min(min, o.min);
    max = std::max(max, o.max);
    absMax = std::max(absMax, o.absMax);
    beforeSquares += o.beforeSquares;
  }
};

// The element of an update is the difference as torch computes it in the
// tensor's own dtype (so a float16 delta is rounded to float16, as
// `after - before` would be), then widened to double.
template <typename T, bool kDelta>
inline double elementAt(const T* x, const T* b, int64_t i) {
  using Wide = std::conditional_t<std::is_same_v<T, double>, double, float>;
  if constexpr (kDelta) {
    const Wide d = static_cast<Wide>(x[i]) - static_cast<Wide>(b[i]);
    if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
      return static_cast<double>(d);
    } else {
      return static_cast<double>(static_cast<Wide>(static_cast<T>(d)));
    }
  } else {
    return static_cast<double>(static_cast<Wide>(x[i]));
  }
}

// One element into a Partial (the tails, and dtypes without a vector path).
template <typename T, bool kDelta>
inline void addScalar(Partial& p, const T* x, const T* b, int64_t i) {
  const double v = elementAt<T, kDelta>(x, b, i);
  // v - v is 0 for a finite v and NaN for NaN and +-inf.
  if ((v - v) == 0.0) {
    p.sum += v;
    p.sumSquares += v * v;
    p.min = std::min(p.min, v);
    p.max = std::max(p.max, v);
    p.absMax = std::max(p.absMax, std::fabs(v));
    p.zeros += v == 0.0 ? 1.0 : 0.0;
  } else {
    p.nonFinite += 1.0;
  }
  if constexpr (kDelta) {
    const double w = static_cast<double>(b[i]);
    p.beforeSquares += w * w;
  }
}

// The scan of float and double tensors: eight elements at a time in
// float64 lanes (GCC vector extensions), every statistic in the same pass,
// without a branch. Compiled three times (target_clones): for AVX-512 and
// AVX2 where the CPU has them (one or two instructions per operation on
// eight lanes), else for the x86-64 baseline; the dynamic loader picks one.
// The lanes are the same in every clone, so the sums are too.
constexpr int kLanes = 8;
using VD = double __attribute__((vector_size(8 * kLanes)));
using MD = int64_t __attribute__((vector_size(8 * kLanes)));
using VF = float __attribute__((vector_size(4 * kLanes)));

template <typename T, bool kDelta>
[[gnu::always_inline]] inline Partial scanVector(
    const T* x,
    const T* b,
    int64_t begin,
    int64_t end) {
  const VD zero = {};
  const VD inf = zero + kInf;
  const MD noSign = MD{} + INT64_MAX;
  VD sum = zero, squares = zero, beforeSquares = zero;
  VD lo = inf, hi = -inf, absHi = -inf;
  MD nonFinite = {}, zeros = {};
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    VD v;
    if constexpr (std::is_same_v<T, float>) {
      VF xs;
      std::memcpy(&xs, x + i, sizeof xs);
      if constexpr (kDelta) {
        VF bs;
        std::memcpy(&bs, b + i, sizeof bs);
        xs = xs - bs; // in float, as torch subtracts float tensors
        const VD w = __builtin_convertvector(bs, VD);
        beforeSquares += w * w;
      }
      v = __builtin_convertvector(xs, VD);
    } else {
      std::memcpy(&v, x + i, sizeof v);
      if constexpr (kDelta) {
        VD w;
        std::memcpy(&w, b + i, sizeof w);
        v = v - w;
        beforeSquares += w * w;
      }
    }
    const MD finite = (v - v) == zero; // -1 where finite; 0 for NaN, +-inf
    const VD kept = (VD)((MD)v & finite);
    nonFinite += finite + 1;
    zeros -= v == zero;
    sum += kept;
    squares += kept * kept;
    const VD low = finite ? v : inf;
    const VD high = finite ? v : -inf;
    lo = low < lo ? low : lo;
    hi = high > hi ? high : hi;
    const VD magnitude = (VD)((MD)kept & noSign);
    absHi = magnitude > absHi ? magnitude : absHi;
  }
  Partial p;
  for (int j = 0; j < kLanes; ++j) {
    p.nonFinite += double(nonFinite[j]);
    p.zeros += double(zeros[j]);
    p.sum += sum[j];
    p.sumSquares += squares[j];
    p.min = std::min(p.min, lo[j]);
    p.max = std::max(p.max, hi[j]);
    p.absMax = std::max(p.absMax, absHi[j]);
    p.beforeSquares += beforeSquares[j];
  }
  for (; i < end; ++i) {
    addScalar<T, kDelta>(p, x, b, i);
  }
  return p;
}

// The common case, every element finite, in a third of scanVector's
// operations: min and max in the tensor's own dtype (exact: widening keeps
// the order), |max| from them, no masks; sums and squares in float64 as
// there. Its sums are those of every element, so a non-finite one (or
// squares past the float64 range) shows in them, and the caller then scans
// again with scanVector. Floats are widened a block at a time into a
// buffer by a plain loop, which GCC vectorizes into one conversion per
// vector (its lowering of __builtin_convertvector takes four, seen with
// GCC 12). The lanes are the same in every clone, so are the sums.
using VF16 = float __attribute__((vector_size(64)));
using MI16 = int32_t __attribute__((vector_size(64)));
constexpr int64_t kBlock = 64;

template <typename T, bool kDelta>
[[gnu::always_inline]] inline Partial scanFinite(
    const T* x,
    const T* b,
    int64_t begin,
    int64_t end) {
  constexpr bool kFloat = std::is_same_v<T, float>;
  using V = std::conditional_t<kFloat, VF16, VD>;
  using M = std::conditional_t<kFloat, MI16, MD>;
  constexpr int kWidth = sizeof(V) / sizeof(T);
  const V zero = {};
  V lo = zero + std::numeric_limits<T>::infinity();
  V hi = -lo;
  M zeros = {};
  VD sum[2] = {}, squares[2] = {}, beforeSquares[2] = {};
  alignas(64) double wide[kBlock];
  alignas(64) double wideBefore[kBlock];
  int64_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    for (int64_t j = 0; j < kBlock; ++j) {
      // The update in the dtype, as torch subtracts.
      wide[j] = kDelta ? double(T(x[i + j] - b[i + j])) : double(x[i + j]);
      if constexpr (kDelta) {
        wideBefore[j] = double(b[i + j]);
      }
    }
    for (int64_t j = 0; j < kBlock; j += kWidth) {
      V v;
      std::memcpy(&v, x + i + j, sizeof v);
      if constexpr (kDelta) {
        V w;
        std::memcpy(&w, b + i + j, sizeof w);
        v = v - w;
      }
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
      zeros -= v == zero;
    }
    for (int64_t j = 0; j < kBlock; j += 2 * kLanes) {
      for (int h = 0; h < 2; ++h) {
        VD d;
        std::memcpy(&d, wide + j + h * kLanes, sizeof d);
        sum[h] += d;
        squares[h] += d * d;
        if constexpr (kDelta) {
          std::memcpy(&d, wideBefore + j + h * kLanes, sizeof d);
          beforeSquares[h] += d * d;
        }
      }
    }
  }
  Partial p;
  for (int j = 0; j < kWidth; ++j) {
    p.zeros += double(zeros[j]);
    p.min = std::min(p.min, double(lo[j]));
    p.max = std::max(p.max, double(hi[j]));
  }
  p.absMax = std::max(p.max, -p.min);
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < kLanes; ++j) {
      p.sum += sum[h][j];
      p.sumSquares += squares[h][j];
      p.beforeSquares += beforeSquares[h][j];
    }
  }
  if (!std::isfinite(p.sum) || !std::isfinite(p.sumSquares)) {
    return scanVector<T, kDelta>(x, b, begin, end);
  }
  for (; i < end; ++i) {
    addScalar<T, kDelta>(p, x, b, i);
  }
  return p;
}

// Not under ThreadSanitizer: a clone is chosen by an IFUNC resolver, which
// the dynamic loader runs while it relocates the library, before the TSan
// runtime is set up; the instrumented resolver then crashes every program
// at start (seen with GCC 12).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define TORCH_MONITOR_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TORCH_MONITOR_CLONES
#endif

TORCH_MONITOR_CLONES Partial
scanFloat(const float* x, const float* b, int64_t begin, int64_t end) {
  return b == nullptr ? scanFinite<float, false>(x, b, begin, end)
                      : scanFinite<float, true>(x, b, begin, end);
}
TORCH_MONITOR_CLONES Partial
scanDouble(const double* x, const double* b, int64_t begin, int64_t end) {
  return b == nullptr ? scanFinite<double, false>(x, b, begin, end)
                      : scanFinite<double, true>(x, b, begin, end);
}

template <typename T, bool kDelta>
Partial scan(const T* x, const T* b, int64_t begin, int64_t end) {
  if constexpr (std::is_same_v<T, float>) {
    return scanFloat(x, kDelta ? b : nullptr, begin, end);
  } else if constexpr (std::is_same_v<T, double>) {
    return scanDouble(x, kDelta ? b : nullptr, begin, end);
  } else {
    // float16, bfloat16: one element at a time (rare on a CPU).
    Partial p;
    for (int64_t i = begin; i < end; ++i) {
      addScalar<T, kDelta>(p, x, b, i);
    }
    return p;
  }
}

// Elements per chunk: below it one thread scans the tensor; above, chunks
// are scanned by the intra-op threads and merged in chunk order (the
// result does not depend on the thread count).
constexpr int64_t kChunk = int64_t(1) << 16;

template <typename T, bool kDelta>
Partial scanAll(const T* x, const T* b, int64_t n) {
  if (n <= kChunk) {
    return scan<T, kDelta>(x, b, 0, n);
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<Partial> parts(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      parts[c] = scan<T, kDelta>(
          x, b, c * kChunk, std::min(n, (c + 1) * kChunk));
    }
  });
  Partial p;
  for (const Partial& part : parts) {
    p.merge(part);
  }
  return p;
}

// The step cell holds an int64's bits: memcpy reads and writes it exactly.
void setFirstNonFiniteStep(double* row, int64_t step) noexcept {
  std::memcpy(row + column::kFirstNonFinite, &step, sizeof(step));
}

// The int64 view of the step cells of `rows` ([k, kColumns] float64): ATen
// ops compute with them as integers, in place.
at::Tensor stepsOf(const at::Tensor& rows) {
  return rows.view(at::kLong).select(1, column::kFirstNonFinite);
}

} // namespace

int64_t firstNonFiniteStep(const double* row) noexcept {
  int64_t step = 0;
  std::memcpy(&step, row + column::kFirstNonFinite, sizeof(step));
  return step;
}

void fillIdentity(double* row) noexcept {
  for (int64_t c = 0; c < column::kFirstNonFinite; ++c) {
    row[c] = c < column::kSumColumns ? 0.0 : -kInf;
  }
  setFirstNonFiniteStep(row, column::kNoStep);
}

void resetSlots(const at::Tensor& slots) {
  using namespace column;
  slots.narrow(1, 0, kSumColumns).zero_();
  slots.narrow(1, kSumColumns, kFirstNonFinite - kSumColumns).fill_(-kInf);
  stepsOf(slots).fill_(kNoStep);
}

void mergeRow(double* into, const double* from) noexcept {
  using namespace column;
  for (int64_t c = 0; c < kSumColumns; ++c) {
    into[c] += from[c];
  }
  for (int64_t c = kSumColumns; c < kFirstNonFinite; ++c) {
    into[c] = std::max(into[c], from[c]);
  }
  setFirstNonFiniteStep(
      into, std::min(firstNonFiniteStep(into), firstNonFiniteStep(from)));
}

void observeOnHost(
    double* row,
    const at::Tensor& values,
    const at::Tensor* before,
    int64_t step) {
  const int64_t n = values.numel();
  if (n == 0) {
    return;
  }
  // In place when contiguous (parameters and gradients are); a copy
  // otherwise (a transposed output, say).
  const at::Tensor x = values.contiguous();
  at::Tensor b;
  if (before != nullptr) {
    TORCH_CHECK_VALUE(
        before->sizes() == values.sizes() &&
            before->scalar_type() == values.scalar_type() &&
            before->device() == values.device(),
        "torch_monitor.watch: an update needs the weight before the step "
        "with the weight's shape, dtype and device");
    b = before->contiguous();
  }
  Partial p;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, x.scalar_type(), "watch_observe", [&] {
        const auto* xs = x.const_data_ptr<scalar_t>();
        if (b.defined()) {
          p = scanAll<scalar_t, true>(xs, b.const_data_ptr<scalar_t>(), n);
        } else {
          p = scanAll<scalar_t, false>(xs, nullptr, n);
        }
      });
  using namespace column;
  const double norm = std::sqrt(p.sumSquares);
  row[kElements] += double(n);
  row[kNonFinite] += p.nonFinite;
  row[kZeros] += p.zeros;
  row[kSum] += p.sum;
  row[kSumSquares] += p.sumSquares;
  row[kNormSum] += norm;
  row[kObservations] += 1.0;
  if (b.defined()) {
    const double beforeNorm = std::sqrt(p.beforeSquares);
    // A weight that was 0 (a bias initialised to zeros) or not finite has
    // no relative update: that step is left out of the ratio's mean.
    if (std::isfinite(beforeNorm) && beforeNorm > 0.0) {
      row[kRatioSum] += norm / beforeNorm;
      row[kRatioCount] += 1.0;
    }
    row[kBeforeSquares] += p.beforeSquares;
  }
  row[kNegMin] = std::max(row[kNegMin], -p.min);
  row[kMax] = std::max(row[kMax], p.max);
  row[kAbsMax] = std::max(row[kAbsMax], p.absMax);
  row[kNormMax] = std::max(row[kNormMax], norm);
  if (p.nonFinite > 0) {
    setFirstNonFiniteStep(row, std::min(firstNonFiniteStep(row), step));
  }
}

at::Tensor rowsOnDevice(
    at::TensorList values,
    at::TensorList before,
    const at::Tensor& offsets) {
  const int64_t k = static_cast<int64_t>(values.size());
  TORCH_INTERNAL_ASSERT(k > 0 && (before.empty() || before.size() == values.size()));
  // float64 throughout, as on the host, so both paths give the same sums.
  // A complex tensor is observed as its magnitudes: an update's are those
  // of the change, and the ratio's norms are the complex norms.
  const auto real = [](const at::Tensor& t) {
    return t.is_complex() ? at::abs(t) : t;
  };
  const auto joined = [](at::TensorList tensors) {
    std::vector<at::Tensor> flat;
    flat.reserve(tensors.size());
    for (const at::Tensor& t : tensors) {
      flat.push_back(t.reshape({-1}));
    }
    return flat.size() == 1 ? flat[0] : at::cat(flat);
  };
  // One number per tensor: a whole reduction for one tensor, else one
  // reduction of each segment (CUB's segmented reduction on a GPU).
  const auto perTensor = [&](const at::Tensor& flat, c10::string_view reduce) {
    if (k == 1) {
      return (reduce == "sum" ? at::sum(flat) : at::amax(flat)).reshape({1});
    }
    // unsafe: the offsets are ours; the checks would read them on the host.
    return at::segment_reduce(
        flat, reduce, std::nullopt, std::nullopt, offsets, 0, /*unsafe=*/true);
  };
  const at::Tensor b = before.empty() ? at::Tensor() : joined(before);
  const at::Tensor after = joined(values);
  const at::Tensor x = real(b.defined() ? at::sub(after, b) : after).to(at::kDouble);
  const auto options = x.options();
  const at::Tensor finite = at::isfinite(x);
  const at::Tensor kept = at::where(finite, x, 0.0);
  const at::Tensor sumSquares = perTensor(at::square(kept), "sum");
  const at::Tensor norm = at::sqrt(sumSquares);
  at::Tensor ratioSum = at::zeros({k}, options);
  at::Tensor ratioCount = ratioSum;
  at::Tensor beforeSquares = ratioSum;
  if (b.defined()) {
    beforeSquares = perTensor(at::square(real(b).to(at::kDouble)), "sum");
    const at::Tensor beforeNorm = at::sqrt(beforeSquares);
    const at::Tensor counted = at::logical_and(
        at::isfinite(beforeNorm), at::gt(beforeNorm, 0.0));
    ratioSum = at::where(counted, at::div(norm, beforeNorm), 0.0);
    ratioCount = counted.to(at::kDouble);
  }
  const at::Tensor elements = k == 1
      ? at::full({1}, double(x.numel()), options)
      : at::diff(offsets).to(at::kDouble);
  return at::stack(
      {
          elements,
          perTensor(at::logical_not(finite).to(at::kDouble), "sum"),
          perTensor(at::eq(x, 0.0).to(at::kDouble), "sum"),
          perTensor(kept, "sum"),
          sumSquares,
          norm,
          at::ones({k}, options),
          ratioSum,
          ratioCount,
          beforeSquares,
          perTensor(at::where(finite, at::neg(x), -kInf), "max"),
          perTensor(at::where(finite, x, -kInf), "max"),
          perTensor(at::abs(kept), "max"),
          norm,
          at::full({k}, column::kNoStep, options.dtype(at::kLong))
              .view(at::kDouble),
      },
      1);
}

void mergeRowsOnDevice(
    const at::Tensor& slots,
    at::Tensor rows,
    const at::Tensor& gate) {
  using namespace column;
  if (rows.device() != slots.device()) {
    rows = rows.to(slots.device(), /*non_blocking=*/true);
  }
  const at::Tensor open = at::ge(gate, 0);
  slots.narrow(1, 0, kSumColumns)
      .add_(at::where(open, rows.narrow(1, 0, kSumColumns), 0.0));
  constexpr int64_t kMaxColumns = kFirstNonFinite - kSumColumns;
  at::Tensor extremes = slots.narrow(1, kSumColumns, kMaxColumns);
  at::maximum_out(
      extremes,
      extremes,
      at::where(open, rows.narrow(1, kSumColumns, kMaxColumns), -kInf));
  // A row with a non-finite element saw it at the gate's step.
  at::Tensor steps = stepsOf(slots);
  at::minimum_out(
      steps,
      steps,
      at::where(
          at::logical_and(open, at::gt(rows.select(1, kNonFinite), 0.0)),
          gate,
          kNoStep));
}

at::Tensor mergedRow(const at::Tensor& rows) {
  using namespace column;
  return at::cat(
      {rows.narrow(1, 0, kSumColumns).sum(0, /*keepdim=*/true),
       rows.narrow(1, kSumColumns, kFirstNonFinite - kSumColumns)
           .amax(0, /*keepdim=*/true),
       stepsOf(rows).amin(0, /*keepdim=*/true).view(at::kDouble).unsqueeze(1)},
      1);
}

void asOneObservation(double* row) noexcept {
  using namespace column;
  if (row[kObservations] > 0.0) {
    const double norm = std::sqrt(row[kSumSquares]);
    const double beforeNorm = std::sqrt(row[kBeforeSquares]);
    row[kNormSum] = norm;
    row[kNormMax] = norm;
    row[kObservations] = 1.0;
    // As for one update: a model whose weights were 0 or not finite has no
    // relative update at that step (gradients have no weights before).
    const bool ratio = std::isfinite(beforeNorm) && beforeNorm > 0.0;
    row[kRatioSum] = ratio ? norm / beforeNorm : 0.0;
    row[kRatioCount] = ratio ? 1.0 : 0.0;
  }
}

void asOneObservation(const at::Tensor& row) {
  using namespace column;
  const at::Tensor observed = at::gt(row.select(1, kObservations), 0.0);
  const at::Tensor norm = at::sqrt(row.select(1, kSumSquares));
  const at::Tensor beforeNorm = at::sqrt(row.select(1, kBeforeSquares));
  const at::Tensor ratio = at::logical_and(
      observed,
      at::logical_and(at::isfinite(beforeNorm), at::gt(beforeNorm, 0.0)));
  row.select(1, kNormSum).copy_(at::where(observed, norm, 0.0));
  row.select(1, kNormMax).copy_(at::where(observed, norm, -kInf));
  row.select(1, kObservations).copy_(observed);
  row.select(1, kRatioSum).copy_(at::where(ratio, at::div(norm, beforeNorm), 0.0));
  row.select(1, kRatioCount).copy_(ratio);
}

void appendStatistics(
    std::unordered_map<std::string, data_value_t>& data,
    const std::string& key,
    const double* row,
    bool withRatio) {
  using namespace column;
  const double observations = row[kObservations];
  if (!(observations > 0.0)) {
    return;
  }
  const double elements = row[kElements];
  const double finite = elements - row[kNonFinite];
  const bool anyFinite = finite > 0.0;
  auto put = [&](const char* statistic, data_value_t value) {
    data.insert_or_assign(key + "." + statistic, std::move(value));
  };
  put("rms", anyFinite ? std::sqrt(row[kSumSquares] / finite) : kNaN);
  put("mean", anyFinite ? row[kSum] / finite : kNaN);
  put("min", anyFinite ? -row[kNegMin] : kNaN);
  put("max", anyFinite ? row[kMax] : kNaN);
  put("abs_max", anyFinite ? row[kAbsMax] : kNaN);
  put("norm", row[kNormSum] / observations);
  put("norm_max", row[kNormMax]);
  put("nonfinite", static_cast<int64_t>(row[kNonFinite]));
  put("zero_frac", elements > 0.0 ? row[kZeros] / elements : kNaN);
  if (withRatio) {
    put("ratio",
        row[kRatioCount] > 0.0 ? row[kRatioSum] / row[kRatioCount] : kNaN);
  }
}

} // namespace torch_monitor::watch
