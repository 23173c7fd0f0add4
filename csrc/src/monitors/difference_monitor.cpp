#include <torch_monitor/monitors/difference_monitor.h>

#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace torch_monitor {
namespace {

// The value before() keeps: tensors are copied, because the module may
// update the very tensor in place during forward() (BatchNorm's
// running_mean, `state.add_(x)`); a reference would then read the new value
// and every difference would be zero. clone() is recorded by autograd when
// the tensor requires grad and grad mode is on, so post - pre stays
// differentiable. Values that cannot change in place (None, numbers,
// strings, undefined tensors) are kept as they are.
c10::IValue capture(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined()) {
      return value;
    }
    return t.clone();
  }
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    std::vector<c10::IValue> copies;
    copies.reserve(elements.size());
    for (const c10::IValue& element : elements) {
      copies.push_back(capture(element));
    }
    return c10::ivalue::Tuple::create(std::move(copies));
  }
  if (value.isList()) {
    c10::impl::GenericList copies(value.toList().elementType());
    for (const c10::IValue& element : value.toListRef()) {
      copies.push_back(capture(element));
    }
    return copies;
  }
  return value;
}

std::string kindOf(const c10::IValue& value) {
  return value.isPyObject() ? std::string("Python object")
                            : std::string(value.tagKind());
}

// One pair of the default map: op(post, pre), with a None side counting as
// zeros shaped like the other side (inferno's documented behaviour).
at::Tensor differenceOf(
    const c10::IValue& post,
    const c10::IValue& pre,
    const DifferenceMonitor::Op& op,
    size_t index) {
  TORCH_CHECK_TYPE(
      (post.isTensor() || post.isNone()) && (pre.isTensor() || pre.isNone()),
      "the default map_ takes tensors, None or tuples of them; element ",
      index,
      " is a ",
      kindOf(post),
      " after forward() and a ",
      kindOf(pre),
      " before it. Pass map_ (or filter_) to handle other values.");
  TORCH_CHECK_TYPE(
      !(post.isNone() && pre.isNone()),
      "element ",
      index,
      " of the value is None both before and after forward(), so there is "
      "no tensor to compare; pass map_ to handle it");
  if (pre.isNone()) {
    const at::Tensor& p = post.toTensor();
    // post - 0, without materialising the zeros for the default op.
    return op ? op(p, at::zeros_like(p)) : p.clone();
  }
  if (post.isNone()) {
    const at::Tensor& q = pre.toTensor();
    return op ? op(at::zeros_like(q), q) : q.neg();
  }
  const at::Tensor& p = post.toTensor();
  const at::Tensor& q = pre.toTensor();
  return op ? op(p, q) : at::sub(p, q);
}

// A tuple's elements; a single value (or None facing a tuple) as one.
std::vector<c10::IValue> elementsOf(
    const c10::IValue& value,
    const c10::IValue& other) {
  if (value.isTuple()) {
    return value.toTupleRef().elements().vec();
  }
  if (value.isNone() && other.isTuple()) {
    // None as a whole counts as zeros shaped like the other side: one None
    // per element of the other tuple.
    return std::vector<c10::IValue>(other.toTupleRef().elements().size());
  }
  return {value};
}

std::vector<at::Tensor> defaultMap(
    const c10::IValue& post,
    const c10::IValue& pre,
    const DifferenceMonitor::Op& op) {
  if (!post.isTuple() && !pre.isTuple()) {
    return {differenceOf(post, pre, op, 0)};
  }
  // Element-wise over tuples, the shorter one deciding the length (zip).
  const std::vector<c10::IValue> posts = elementsOf(post, pre);
  const std::vector<c10::IValue> pres = elementsOf(pre, post);
  const size_t n = std::min(posts.size(), pres.size());
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(differenceOf(posts[i], pres[i], op, i));
  }
  return out;
}

} // namespace

DifferenceMonitor::DifferenceMonitor(
    std::shared_ptr<Reducer> reducer,
    std::string name,
    bool trainUpdate,
    bool evalUpdate)
    : reducer_(std::move(reducer)),
      name_(std::move(name)),
      trainUpdate_(trainUpdate),
      evalUpdate_(evalUpdate) {
  TORCH_CHECK_VALUE(
      reducer_ != nullptr,
      "DifferenceMonitor '",
      name_,
      "' needs a reducer to feed; got none");
}

// A capture lives from a before() that ran to the after() of the same
// forward() call: a skipped hook drops it too, so a value captured in one
// call never pairs with another call (as could happen when forward() changes
// the module's mode), and its memory is released at once.
void DifferenceMonitor::before(const c10::IValue& value, bool training) {
  if (!runsWhen(training)) {
    pre_.reset();
    return;
  }
  pre_ = capture(value);
}

void DifferenceMonitor::after(const c10::IValue& value, bool training) {
  if (!runsWhen(training)) {
    pre_.reset();
    return;
  }
  // Without a capture (before() was skipped in this call), the value before
  // counts as None.
  c10::IValue pre;
  if (pre_.has_value()) {
    pre = std::move(*pre_);
    pre_.reset();
  }
  const bool pass =
      filter_ ? filter_(value, pre) : !(value.isNone() && pre.isNone());
  if (!pass) {
    return;
  }
  try {
    const std::vector<at::Tensor> inputs =
        map_ ? map_(value, pre) : defaultMap(value, pre, op_);
    reducer_->forward(inputs);
  } catch (c10::Error& e) {
    // Keeps the error's type (ValueError stays ValueError) and says which
    // monitor failed: in a model with many monitors the reducer's own
    // message ("shape [3] does not match [2]") does not.
    e.add_context(
        "in DifferenceMonitor '" + name_ +
        "' (the difference of that attribute across forward())");
    throw;
  }
}

void DifferenceMonitor::clear(bool keepshape) {
  forget();
  reducer_->clear(keepshape);
}

void DifferenceMonitor::forget() noexcept {
  pre_.reset();
}

const std::shared_ptr<Reducer>& DifferenceMonitor::reducer() const noexcept {
  return reducer_;
}

const std::string& DifferenceMonitor::name() const noexcept {
  return name_;
}

bool DifferenceMonitor::trainUpdate() const noexcept {
  return trainUpdate_;
}

void DifferenceMonitor::setTrainUpdate(bool value) noexcept {
  trainUpdate_ = value;
}

bool DifferenceMonitor::evalUpdate() const noexcept {
  return evalUpdate_;
}

void DifferenceMonitor::setEvalUpdate(bool value) noexcept {
  evalUpdate_ = value;
}

void DifferenceMonitor::setFilter(Filter filter) {
  filter_ = std::move(filter);
}

void DifferenceMonitor::setMap(Map map) {
  map_ = std::move(map);
}

void DifferenceMonitor::setOp(Op op) {
  op_ = std::move(op);
}

bool DifferenceMonitor::hasCustomCallables() const noexcept {
  return static_cast<bool>(filter_) || static_cast<bool>(map_) ||
      static_cast<bool>(op_);
}

} // namespace torch_monitor
