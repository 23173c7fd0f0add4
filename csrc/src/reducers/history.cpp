#include <torch_monitor/reducers/history.h>

#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/GradMode.h>

#include <torch_monitor/detail/in_place.h>

namespace torch_monitor {
namespace {

// Python's modulo: the result has the sign of the divisor.
int64_t wrap(int64_t value, int64_t size) noexcept {
  const int64_t r = value % size;
  return r < 0 ? r + size : r;
}

std::vector<int64_t> withRows(int64_t rows, at::IntArrayRef stateShape) {
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), stateShape.begin(), stateShape.end());
  return shape;
}

} // namespace

int64_t historySize(double stepTime, double duration, bool inclusive) {
  TORCH_CHECK_VALUE(
      std::isfinite(stepTime) && stepTime > 0,
      "step_time must be a finite number greater than 0 (the time between "
      "two recorded states), got ",
      stepTime);
  TORCH_CHECK_VALUE(
      std::isfinite(duration) && duration >= 0,
      "duration must be a finite number of at least 0 (the time the history "
      "covers), got ",
      duration);
  const double steps = std::ceil(duration / stepTime);
  // Checked here, where a saved or new reducer is made, rather than by an
  // allocation failing at every forward.
  TORCH_CHECK_VALUE(
      steps + (inclusive ? 1 : 0) <= static_cast<double>(kMaxHistorySize),
      "duration / step_time = ",
      duration / stepTime,
      " asks for more recorded states than a history may hold (at most ",
      kMaxHistorySize,
      "); use a shorter duration or a longer step_time");
  const int64_t size = static_cast<int64_t>(steps) + (inclusive ? 1 : 0);
  return size < 1 ? 1 : size;
}

History::History(int64_t size, double fill)
    : storage_(at::empty({0}, at::TensorOptions().dtype(at::kFloat))),
      size_(size),
      fill_(fill) {
  TORCH_INTERNAL_ASSERT(size_ >= 1);
}

at::IntArrayRef History::stateShape() const {
  TORCH_INTERNAL_ASSERT(allocated_, "no state shape before the first push");
  return storage_.sizes().slice(1);
}

bool History::storageUnshared() const {
  // A view handed out earlier (peek(), an exact view()) or the tensor itself
  // held elsewhere (storage() from Python) shares the TensorImpl or the
  // StorageImpl; writing in place would change what its holder sees.
  if (storage_.use_count() != 1 || storage_.storage().use_count() != 1) {
    return false;
  }
  return detail::writableInPlace(storage_) && !storage_.requires_grad();
}

bool History::exclusivelyOwned(const at::Tensor& incoming) const {
  return storageUnshared() &&
      !(c10::GradMode::is_enabled() && incoming.requires_grad());
}

void History::allocate(at::IntArrayRef shape) {
  storage_ = at::full(withRows(size_, shape), fill_, storage_.options());
  allocated_ = true;
  next_ = 0;
}

at::Tensor History::nextRowToWrite(at::IntArrayRef shape) {
  if (!allocated_) {
    allocate(shape);
  } else if (!storageUnshared()) {
    return at::Tensor();
  }
  return storage_.select(0, next_);
}

void History::push(const at::Tensor& state, bool inplace) {
  if (!allocated_) {
    allocate(state.sizes());
  }
  TORCH_INTERNAL_ASSERT(
      state.sizes() == stateShape() &&
      state.scalar_type() == storage_.scalar_type() &&
      state.device() == storage_.device());
  if ((inplace && detail::writableInPlace(storage_)) || exclusivelyOwned(state)) {
    // inferno writes in place without autograd; when nobody can observe the
    // difference an out-of-place write would only cost a copy of all N rows.
    at::NoGradGuard noGrad;
    storage_.select(0, next_).copy_(state);
  } else {
    storage_ = at::select_scatter(storage_, state, 0, next_);
  }
  advance();
}

int64_t History::rowIndex(int64_t back) const noexcept {
  return wrap(next_ - back, size_);
}

at::Tensor History::row(int64_t back) const {
  TORCH_INTERNAL_ASSERT(allocated_);
  return storage_.select(0, rowIndex(back));
}

at::Tensor History::newestFirst() const {
  TORCH_INTERNAL_ASSERT(allocated_);
  // Reversed, the newest row (next_ - 1) lands at N - next_; rolling by
  // next_ brings it to the front, the older ones following in time order.
  return storage_.flip({0}).roll({next_}, {0});
}

void History::resize(int64_t size) {
  TORCH_INTERNAL_ASSERT(size >= 1);
  if (size == size_) {
    return;
  }
  if (allocated_) {
    at::NoGradGuard noGrad;
    // Oldest first, newest last; then cut or pad on the oldest side.
    at::Tensor ordered = storage_.roll({-next_}, {0});
    if (size < size_) {
      storage_ = ordered.slice(0, size_ - size).contiguous();
    } else {
      at::Tensor pad = at::full(
          withRows(size - size_, storage_.sizes().slice(1)),
          fill_,
          storage_.options());
      storage_ = at::cat({pad, ordered}, 0);
    }
    next_ = 0;
  }
  size_ = size;
}

void History::refill() {
  if (allocated_) {
    if (storage_.use_count() == 1 && storage_.storage().use_count() == 1 &&
        detail::writableInPlace(storage_) && !storage_.requires_grad()) {
      at::NoGradGuard noGrad;
      storage_.fill_(fill_);
    } else {
      // Someone still holds a view of the old rows: leave them intact.
      storage_ = at::full(storage_.sizes(), fill_, storage_.options());
    }
  }
  next_ = 0;
}

void History::release() {
  storage_ = at::empty({0}, storage_.options().requires_grad(false));
  allocated_ = false;
  next_ = 0;
}

void History::setStorage(at::Tensor storage) {
  TORCH_CHECK_VALUE(
      storage.defined() && storage.sizes() == storage_.sizes(),
      "a reducer's history can change dtype or device but not shape: "
      "expected a tensor of shape ",
      storage_.sizes(),
      ", got ",
      storage.defined() ? c10::str(storage.sizes()) : std::string("None"));
  TORCH_CHECK_TYPE(
      at::isFloatingType(storage.scalar_type()),
      "a reducer's history holds floating-point states; got dtype ",
      storage.scalar_type(),
      ". Use float32, float64, float16 or bfloat16.");
  storage_ = std::move(storage);
}

void History::restore(at::Tensor storage, bool allocated, int64_t next) {
  TORCH_CHECK_TYPE(
      storage.defined() && at::isFloatingType(storage.scalar_type()),
      "a saved reducer history must be a floating-point tensor");
  // What a history could not be used with: each would load, then fail at
  // every forward (or at dump()).
  TORCH_CHECK_VALUE(
      storage.layout() == at::kStrided,
      "a saved reducer history must be a dense tensor, got layout ",
      storage.layout(),
      " (convert it with .to_dense())");
  TORCH_CHECK_VALUE(
      !storage.is_meta(),
      "a saved reducer history is on the meta device, which holds no values; "
      "load it onto a real device");
  if (allocated) {
    TORCH_CHECK_VALUE(
        !storage.requires_grad(),
        "a saved reducer history requires grad; histories are kept out of "
        "autograd: pass it detached (.detach())");
    TORCH_CHECK_VALUE(
        at::has_internal_overlap(storage) != at::MemOverlap::Yes,
        "a saved reducer history has rows that share memory (a stride of 0, "
        "as expand() makes); pass a tensor of its own (.contiguous())");
    TORCH_CHECK_VALUE(
        storage.dim() >= 1 && storage.size(0) == size_,
        "a saved reducer history of shape ",
        storage.sizes(),
        " does not fit a history of ",
        size_,
        " states (expected ",
        size_,
        " rows along dim 0)");
    TORCH_CHECK_VALUE(
        next >= 0 && next < size_,
        "a saved reducer history has ring position ",
        next,
        ", outside [0, ",
        size_,
        ")");
    storage_ = std::move(storage);
    next_ = next;
  } else {
    storage_ = at::empty({0}, storage.options().requires_grad(false));
    next_ = 0;
  }
  allocated_ = allocated;
}

} // namespace torch_monitor
