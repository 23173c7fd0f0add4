#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <torch_monitor/export.h>

namespace torch_monitor {

// The most states a history keeps: 2**31 (8 GiB for float32 scalars), far
// beyond what a monitor records, far below what an allocation could fail
// at only later (duration=1e14 once asked for 800 TB at the first forward).
inline constexpr int64_t kMaxHistorySize = int64_t(1) << 31;

// N = max(ceil(duration / stepTime) + (inclusive ? 1 : 0), 1), in double
// precision (2.1 / 0.3 is 7.000000000000001, so N is 8 there, as in inferno).
// Throws c10::ValueError for a step time that is not a finite number > 0, a
// duration that is not a finite number >= 0, or N > kMaxHistorySize.
TORCH_MONITOR_API int64_t
historySize(double stepTime, double duration, bool inclusive);

// The ring buffer under every FoldReducer: the last `size()` states of one
// shape, in one tensor of shape [N, *state shape]. Rows are written in a
// circle; `next()` is the row the next push overwrites, so the newest state
// is row next() - 1 (mod N). The index bookkeeping is on the host, so a push
// or a read never waits for the device.
//
// Before the first push no storage exists (allocated() is false); an empty
// tensor then stands in for it and carries the dtype and device the storage
// will get.
//
// Thread safety: none; no call may run concurrently with a push, resize or
// clear on the same History.
class TORCH_MONITOR_API History {
 public:
  History(int64_t size, double fill);

  int64_t size() const noexcept {
    return size_;
  }
  int64_t next() const noexcept {
    return next_;
  }
  bool allocated() const noexcept {
    return allocated_;
  }
  double fill() const noexcept {
    return fill_;
  }
  // [N, *state shape] once allocated, else an empty stand-in. Rows are in
  // storage order, not time order (dump() gives time order).
  const at::Tensor& storage() const noexcept {
    return storage_;
  }
  at::TensorOptions options() const {
    return storage_.options();
  }
  // The shape of one state; requires allocated().
  at::IntArrayRef stateShape() const;

  // Writes `state` over the oldest row (allocating [N, *state.shape] filled
  // with fill() on the first push) and advances next(). `state` must already
  // have the storage's dtype and device. In place when `inplace` (without
  // autograd, like inferno), else out of place (autograd flows through the
  // history) unless nothing could tell the difference.
  void push(const at::Tensor& state, bool inplace);
  // The row push() writes next, for a caller that computes a state of
  // `shape` (and the storage's dtype and device) straight into it: when
  // nobody can observe the write (see push(); the storage is allocated on
  // the first push), else an undefined tensor. advance() completes the push
  // once the row is written.
  at::Tensor nextRowToWrite(at::IntArrayRef shape);
  void advance() noexcept {
    next_ = next_ + 1 == size_ ? 0 : next_ + 1;
  }

  // The storage row `back` steps behind next() (1 = newest, N = oldest),
  // wrapping around like Python's modulo for any integer.
  int64_t rowIndex(int64_t back) const noexcept;
  // A view of that row.
  at::Tensor row(int64_t back) const;
  // All N rows, newest first (a new tensor).
  at::Tensor newestFirst() const;

  // Changes N, keeping the newest rows; growing adds fill() rows on the
  // oldest side. Without autograd (a resize is not part of any computation).
  void resize(int64_t size);
  // Every row back to fill(); keeps the shape (clear(keepshape=true)).
  void refill();
  // Drops the storage; the next push allocates again, with any shape.
  void release();
  // Replaces the storage by a tensor of the same shape (e.g. the storage
  // moved to another device or cast to another floating dtype).
  void setStorage(at::Tensor storage);
  // Restores a saved state (see FoldReducer::Snapshot). Throws
  // c10::TypeError for a storage that is not floating point and
  // c10::ValueError for one a history cannot use (sparse, on the meta
  // device, requiring grad, rows sharing memory), of the wrong size or with
  // `next` out of range.
  void restore(at::Tensor storage, bool allocated, int64_t next);

 private:
  // Whether writing into storage_ in place is invisible to everyone: no view
  // of it is alive and autograd does not track it (nor `incoming`).
  bool exclusivelyOwned(const at::Tensor& incoming) const;
  bool storageUnshared() const;
  // Allocates [N, *shape] filled with fill(), on the first push.
  void allocate(at::IntArrayRef shape);

  at::Tensor storage_;
  int64_t size_;
  int64_t next_ = 0;
  bool allocated_ = false;
  double fill_;
};

} // namespace torch_monitor
