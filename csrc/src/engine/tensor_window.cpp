#include <torch_monitor/engine/tensor_window.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <type_traits>

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
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
constexpr int64_t kInitialPending = 16;

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

// `n` elements read back from the device, as one share of the window. When
// they start it, they are added one by one exactly as numbers are; else,
// like a row, their MAX and MIN ignore every NaN (and merge() ignores the
// -inf and +inf of an all-NaN share, as it ignores a NaN).
template <typename T>
Accumulator<T> foldElements(const T* elements, int64_t n, bool startsWindow) {
  Accumulator<T> share;
  if (startsWindow || !std::is_floating_point_v<T>) {
    for (int64_t i = 0; i < n; ++i) {
      share.add(elements[i], 0);
    }
    return share;
  }
  share.max = -std::numeric_limits<T>::infinity();
  share.min = std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const T v = elements[i];
    share.sum += v;
    share.max = v > share.max ? v : share.max;
    share.min = v < share.min ? v : share.min;
  }
  share.value = elements[n - 1];
  share.count = n;
  return share;
}

} // namespace

template <typename T>
void TensorWindow<T>::add(
    const at::Tensor& values,
    int64_t nowMs,
    const void* shard,
    int64_t shardCount) {
  // The window's buffers are ours alone: autograd has nothing to record or
  // check in them, and skipping its kernels (and a detach()) keeps an add
  // at one op's worth of dispatch on the calling thread.
  const at::AutoDispatchBelowADInplaceOrView belowAutograd;
  const int64_t n = values.numel();
  if (n > kMaxPending) {
    appendRow(values.reshape({-1}));
  } else {
    if (pendingUsed_ + n > (pending_.defined() ? pending_.size(0) : 0)) {
      growOrFoldPending(values, n);
    }
    // The elements go straight into the buffer, in row-major order,
    // converted to T by the copy: one kernel.
    const at::Tensor into = values.dim() == 0
        ? pending_.as_strided({}, {}, pendingUsed_)
        : pending_.as_strided(
              values.sizes(),
              c10::contiguous_strides(values.sizes()),
              pendingUsed_);
    into.copy_(values, /*non_blocking=*/true);
    pendingUsed_ += n;
  }
  const at::Device device =
      pending_.defined() ? pending_.device() : rows_.device();
  stream_ = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
  if (count_ == 0) {
    hostFirst_ = shardCount > 0;
  }
  count_ += n;
  lastMs_ = nowMs;
  lastShard_ = shard;
  lastShardCount_ = shardCount;
}

template <typename T>
void TensorWindow<T>::growOrFoldPending(const at::Tensor& values, int64_t n) {
  const int64_t capacity = pending_.defined() ? pending_.size(0) : 0;
  if (capacity == kMaxPending) {
    foldPending();
    return;
  }
  int64_t size = std::max(2 * capacity, kInitialPending);
  while (size < pendingUsed_ + n && size < kMaxPending) {
    size *= 2;
  }
  at::Tensor grown = at::empty(
      {std::min(size, kMaxPending)},
      values.options().dtype(kRowType<T>).memory_format(
          at::MemoryFormat::Contiguous));
  if (pendingUsed_ + n > grown.size(0)) {
    foldPending(); // even the largest buffer cannot hold both
  } else if (pendingUsed_ > 0) {
    grown.narrow(0, 0, pendingUsed_).copy_(pending_.narrow(0, 0, pendingUsed_));
  }
  pending_ = std::move(grown);
}

template <typename T>
void TensorWindow<T>::foldPending() {
  if (pendingUsed_ == 0) {
    return;
  }
  const at::Tensor elements = pending_.narrow(0, 0, pendingUsed_);
  pendingUsed_ = 0;
  appendRow(elements);
}

template <typename T>
void TensorWindow<T>::appendRow(const at::Tensor& flat) {
  foldPending();
  if (!rows_.defined()) {
    rows_ = at::empty(
        {kInitialRows, kColumns},
        flat.options().dtype(kRowType<T>).memory_format(
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
  const int64_t n = flat.numel();
  rows_[used_].copy_(
      rowOf<T>(flat, flat, flat, flat[n - 1], flat[0]), /*non_blocking=*/true);
  ++used_;
}

template <typename T>
Accumulator<T> TensorWindow<T>::fold(bool startsWindow) const {
  // The window's one synchronisation with the device, on the stream that
  // wrote the last sample: another thread (the closer, the time-close
  // thread) may be on another stream, which would not wait for that write.
  const c10::StreamGuard onWritersStream(*stream_);
  const at::AutoDispatchBelowADInplaceOrView belowAutograd;
  at::Tensor device;
  if (used_ > 0) {
    device = rows_.narrow(0, 0, used_).reshape({-1});
    if (pendingUsed_ > 0) {
      device = at::cat({device, pending_.narrow(0, 0, pendingUsed_)});
    }
  } else {
    device = pending_.narrow(0, 0, pendingUsed_);
  }
  const at::Tensor host = device.cpu();
  const T* data = host.const_data_ptr<T>();
  Accumulator<T> out;
  for (int64_t i = 0; i < used_; ++i) {
    const T* row = data + i * kColumns;
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
  if (pendingUsed_ > 0) { // the latest samples
    Accumulator<T> share = foldElements(
        data + used_ * kColumns, pendingUsed_, startsWindow && used_ == 0);
    share.lastMs = used_;
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
    tensors = fold(/*startsWindow=*/!numbersFirst);
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
  pendingUsed_ = 0;
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
