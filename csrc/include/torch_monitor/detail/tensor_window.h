#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <torch_monitor/detail/accumulator.h>

namespace torch_monitor::detail {

// The samples a Stat's open window got as tensors on a device other than
// the CPU, kept on that device so that adding them never waits for it.
//
// Each add appends one summary row to a buffer on the device: (sum, max and
// min over the non-NaN elements, last element, first element). A scalar
// tensor's row is the scalar itself in all five places, so adding a loss
// enqueues a single copy kernel; a larger tensor takes about seven small
// kernels. Nothing reads device memory until take(), which copies the rows
// to the host once per window and folds them there with exactly the rules
// Accumulator::add applies to single samples (the first sample sets MAX and
// MIN, so a NaN first sample poisons them; later NaNs are ignored). Sums are
// taken in the Stat's type on the device, so a float window may differ from
// adding the elements one by one in the last bits.
//
// A window that collects many rows folds them into one on the device
// (kMaxRows), so its memory stays bounded without a host read.
//
// Alongside the rows it keeps what the Stat needs to order these samples
// against the ones its threads add as numbers: which thread's shard added
// the last tensor, and how many samples that shard held at the time.
//
// The host reads the rows on the stream that wrote the last of them, so a
// window closed by another thread still waits for that write.
//
// Thread safety: none of its own; its Stat calls it under the Stat's mutex.
template <typename T>
class TensorWindow {
 public:
  // Rows kept before they are folded on the device.
  static constexpr int64_t kMaxRows = 1024;

  // Appends the elements of `values` (detached, non-empty, not on the CPU)
  // as samples added at `nowMs`. A tensor on another device than the rows'
  // is summarised on its own device and copied over without waiting.
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

  // Reads the rows (one host synchronisation), forgets them, and returns
  // the whole window: these samples merged with `host`, the samples the
  // Stat's threads added as numbers. `lastShardCountNow` is what
  // lastShard() held when `host` was harvested: more than at the last
  // tensor add means that thread added a number after its tensor.
  Accumulator<T> take(const Accumulator<T>& host, int64_t lastShardCountNow);

 private:
  // This window's rows, folded on the host; `startsWindow` when their first
  // sample is the window's first (which sets MAX and MIN even if NaN).
  Accumulator<T> foldRows(bool startsWindow) const;

  at::Tensor rows_; // [capacity, 5] on the rows' device, in T's dtype
  // The stream the last row was written on (adds of one stat are expected
  // to come from one stream, as a training loop's do).
  std::optional<c10::Stream> stream_;
  int64_t used_ = 0; // rows written
  int64_t count_ = 0; // samples in them
  int64_t lastMs_ = 0;
  const void* lastShard_ = nullptr;
  int64_t lastShardCount_ = 0;
  // Whether the first tensor's thread had added numbers before it, i.e.
  // whether the window's first sample is a number.
  bool hostFirst_ = false;
};

} // namespace torch_monitor::detail
