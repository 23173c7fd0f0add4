#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <torch_monitor/engine/accumulator.h>

namespace torch_monitor::detail {

// The samples a Stat's open window got as tensors on a device other than
// the CPU, kept on that device so that adding them never waits for it.
//
// An add costs the calling thread one small device op: the tensor's
// elements are copied, converted to the Stat's type, into a buffer of
// pending elements on the device (one copy kernel; for a loss, a single
// element). Nothing reads device memory until take(), which copies the
// buffer to the host once per window and folds the elements there exactly
// as Accumulator::add folds single samples (the first sample sets MAX and
// MIN, so a NaN first sample poisons them; later NaNs are ignored): for
// up to kMaxPending samples a window's aggregates are those of adding its
// elements one by one.
//
// Memory stays bounded without a host read: when the pending buffer is full
// its elements are folded on the device into one summary row (sum, max and
// min over the non-NaN elements, last element, first element; about seven
// small kernels, once per kMaxPending samples), and a tensor of more than
// kMaxPending elements is summarised that way at its add. Rows are folded
// into one when kMaxRows of them collect. Sums of folded rows are taken in
// the Stat's type on the device, so such a window may differ from adding
// the elements one by one in the last bits.
//
// Alongside the samples it keeps what the Stat needs to order them against
// the ones its threads add as numbers: which thread's shard added the last
// tensor, and how many samples that shard held at the time.
//
// The host reads the buffers on the stream that wrote the last of them, so a
// window closed by another thread still waits for that write.
//
// Thread safety: none of its own; its Stat calls it under the Stat's mutex.
template <typename T>
class TensorWindow {
 public:
  // Elements kept before they are folded into a row on the device (512 KiB
  // for a float Stat, allocated only as far as a window needs it).
  static constexpr int64_t kMaxPending = int64_t(1) << 16;
  // Rows kept before they are folded into one on the device.
  static constexpr int64_t kMaxRows = 1024;

  // Appends the elements of `values` (non-empty; autograd is ignored) as
  // samples added at `nowMs`. A tensor on another device than the window's
  // is copied over without waiting.
  // `shard` is the adding thread's shard (nullptr when it has none) and
  // `shardCount` the samples it holds now.
  void add(
      const at::Tensor& values,
      int64_t nowMs,
      const void* shard,
      int64_t shardCount);

  // Samples added since the last take().
  int64_t count() const noexcept {
    return count_;
  }
  // The shard that added the last tensor, for Stat::harvest's probe.
  const void* lastShard() const noexcept {
    return lastShard_;
  }

  // Reads the samples (one host synchronisation), forgets them, and returns
  // the whole window: these samples merged with `host`, the samples the
  // Stat's threads added as numbers. `lastShardCountNow` is what
  // lastShard() held when `host` was harvested: more than at the last
  // tensor add means that thread added a number after its tensor.
  Accumulator<T> take(const Accumulator<T>& host, int64_t lastShardCountNow);

 private:
  // Makes room for `n` more pending elements like `values`: a larger
  // buffer, or the pending ones folded into a row.
  void growOrFoldPending(const at::Tensor& values, int64_t n);
  // Folds the pending elements into a row.
  void foldPending();
  // Appends the summary row of `flat` (1-D), after the pending elements
  // (folded into a row first: they came before it).
  void appendRow(const at::Tensor& flat);
  // This window's samples, read and folded on the host; `startsWindow` when
  // their first sample is the window's first (which sets MAX and MIN even
  // if NaN).
  Accumulator<T> fold(bool startsWindow) const;

  at::Tensor pending_; // [capacity] elements on the window's device, T's dtype
  at::Tensor rows_; // [capacity, 5] on the same device, in T's dtype
  // The stream the last sample was written on (adds of one stat are
  // expected to come from one stream, as a training loop's do).
  std::optional<c10::Stream> stream_;
  int64_t pendingUsed_ = 0; // elements in pending_
  int64_t used_ = 0; // rows written; their samples precede pending_'s
  int64_t count_ = 0; // samples in both
  int64_t lastMs_ = 0;
  const void* lastShard_ = nullptr;
  int64_t lastShardCount_ = 0;
  // Whether the first tensor's thread had added numbers before it, i.e.
  // whether the window's first sample is a number.
  bool hostFirst_ = false;
};

} // namespace torch_monitor::detail
