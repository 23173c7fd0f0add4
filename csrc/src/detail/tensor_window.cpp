#include <torch_monitor/detail/tensor_window.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <type_traits>

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <torch_monitor/detail/text.h>

namespace torch_monitor::detail {
namespace {

// The columns of a summary row.
constexpr int64_t kSum = 0;
constexpr int64_t kMax = 1;
constexpr int64_t kMin = 2;
constexpr int64_t kLast = 3;
constexpr int64_t kFirst = 4;
constexpr int64_t kColumns = 5;
constexpr int64_t kInitialRows = 16;

template <typename T>
constexpr at::ScalarType kRowType =
    std::is_same_v<T, double> ? at::kDouble : at::kLong;

// The largest (or smallest) element that is not NaN, as a 0-d tensor on the
// device; -inf (+inf) when every element is NaN, which the host fold then
// ignores as it ignores a NaN sample.
at::Tensor extremeIgnoringNaN(const at::Tensor& v, bool largest) {
  if (!at::isFloatingType(v.scalar_type())) {
    return largest ? v.amax() : v.amin();
  }
  constexpr double inf = std::numeric_limits<double>::infinity();
  const at::Tensor cleaned = at::nan_to_num(v, largest ? -inf : inf, inf, -inf);
  return largest ? cleaned.amax() : cleaned.amin();
}

// One summary row, on the device of its inputs. Stacking promotes to the
// row type because the sum already has it.
template <typename T>
at::Tensor rowOf(
    const at::Tensor& sumOf,
    const at::Tensor& maxOf,
    const at::Tensor& minOf,
    const at::Tensor& last,
    const at::Tensor& first) {
  return at::stack(
      {at::sum(sumOf, kRowType<T>),
       extremeIgnoringNaN(maxOf, /*largest=*/true),
       extremeIgnoringNaN(minOf, /*largest=*/false),
       last,
       first});
}

template <typename T>
bool isNaN(T v) noexcept {
  return v != v; // never true for integers
}

} // namespace

template <typename T>
void TensorWindow<T>::add(
    const at::Tensor& values,
    int64_t nowMs,
    const void* shard,
    int64_t shardCount) {
  const int64_t n = values.numel();
  if (!rows_.defined()) {
    rows_ = at::empty(
        {kInitialRows, kColumns},
        values.options().dtype(kRowType<T>).memory_format(
            at::MemoryFormat::Contiguous));
  }
  if (used_ == rows_.size(0)) {
    if (used_ < kMaxRows) {
      at::Tensor grown = at::empty({2 * used_, kColumns}, rows_.options());
      grown.narrow(0, 0, used_).copy_(rows_);
      rows_ = std::move(grown);
    } else {
      // Fold every row into the first, on the device: the folded row is
      // what one tensor holding all these samples would have given.
      const at::Tensor folded = rowOf<T>(
          rows_.select(1, kSum),
          rows_.select(1, kMax),
          rows_.select(1, kMin),
          rows_[used_ - 1][kLast],
          rows_[0][kFirst]);
      rows_[0].copy_(folded);
      used_ = 1;
    }
  }
  at::Tensor row;
  if (n == 1) {
    // A scalar is its own sum, extremes, last and first: one copy kernel.
    row = values.reshape({1}).expand({kColumns});
  } else {
    const at::Tensor flat = values.reshape({-1});
    row = rowOf<T>(flat, flat, flat, flat[n - 1], flat[0]);
  }
  rows_[used_].copy_(row, /*non_blocking=*/true);
  stream_ = c10::impl::VirtualGuardImpl(rows_.device().type())
                .getStream(rows_.device());
  if (count_ == 0) {
    hostFirst_ = shardCount > 0;
  }
  ++used_;
  count_ += n;
  lastMs_ = nowMs;
  lastShard_ = shard;
  lastShardCount_ = shardCount;
}

template <typename T>
Accumulator<T> TensorWindow<T>::foldRows(bool startsWindow) const {
  // The window's one synchronisation with the device, on the stream that
  // wrote the last row: another thread (the closer, the time-close thread)
  // may be on another stream, which would not wait for that write.
  const c10::StreamGuard onWritersStream(*stream_);
  const at::Tensor host = rows_.narrow(0, 0, used_).cpu();
  const T* rows = host.const_data_ptr<T>();
  Accumulator<T> out;
  for (int64_t i = 0; i < used_; ++i) {
    const T* row = rows + i * kColumns;
    Accumulator<T> share;
    share.sum = row[kSum];
    share.value = row[kLast];
    share.count = 1; // the true total is set below
    share.lastMs = i; // orders VALUE by row
    // A window's first sample sets MAX and MIN even when it is NaN; the
    // extremes of a later row ignore its NaNs, as merge() ignores a NaN.
    const bool firstIsNaN = startsWindow && i == 0 && isNaN(row[kFirst]);
    share.max = firstIsNaN ? row[kFirst] : row[kMax];
    share.min = firstIsNaN ? row[kFirst] : row[kMin];
    out.merge(share);
  }
  out.count = count_;
  out.lastMs = lastMs_;
  return out;
}

template <typename T>
Accumulator<T> TensorWindow<T>::take(
    const Accumulator<T>& host,
    int64_t lastShardCountNow) {
  const bool numbersFirst = hostFirst_ && host.count > 0;
  Accumulator<T> tensors;
  try {
    tensors = foldRows(/*startsWindow=*/!numbersFirst);
  } catch (const std::exception& e) {
    // The device failed (a CUDA error is sticky: training is failing too).
    // The window closes with the numbers alone: at exit, on the window
    // timer's thread or in a destructor there is nobody to throw to.
    TORCH_WARN(
        "torch_monitor: could not read a Stat window's tensor samples from "
        "their device; the window is logged without its ",
        count_,
        " tensor samples: ",
        errorMessage(e));
    tensors = Accumulator<T>();
  }
  Accumulator<T> out = host.count > 0 ? host : tensors;
  if (host.count > 0 && tensors.count > 0) {
    out = numbersFirst ? host : tensors;
    out.merge(numbersFirst ? tensors : host);
    // VALUE is the latest sample: the tensor's last element unless its
    // thread added a number after it or another thread added one later.
    const bool numberAfter = lastShardCountNow > lastShardCount_;
    const bool tensorLast = !numberAfter && lastMs_ >= host.lastMs;
    out.value = tensorLast ? tensors.value : host.value;
    out.lastMs = std::max(lastMs_, host.lastMs);
  }
  used_ = 0;
  count_ = 0;
  lastMs_ = 0;
  lastShard_ = nullptr;
  lastShardCount_ = 0;
  hostFirst_ = false;
  return out;
}

template class TensorWindow<double>;
template class TensorWindow<int64_t>;

} // namespace torch_monitor::detail
