#include <torch_monitor/monitors/difference_monitor.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h> // at::internal::GRAIN_SIZE
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <torch_monitor/detail/in_place.h>
#include <torch_monitor/detail/text.h>

namespace torch_monitor {
namespace {

// A CPU tensor whose memory is its own to read: not a Python subclass or a
// functional wrapper.
bool plainCpu(const at::Tensor& t) {
  static const c10::DispatchKeySet kWrappers(
      {c10::DispatchKey::Python,
       c10::DispatchKey::PythonTLSSnapshot,
       c10::DispatchKey::Functionalize});
  return t.is_cpu() && t.layout() == at::kStrided && t.has_storage() &&
      !t.key_set().has_any(kWrappers) && !t.is_neg() && !t.is_conj();
}

// The per-forward ops on small CPU tensors (a layer's weight, a norm's
// running mean) cost more in TensorIterator's setup than in arithmetic, and
// a monitored forward makes two of them. Contiguous float tensors of the
// same dtype up to ATen's grain size (below which it runs one thread
// anyway) take plain loops, which give the same bits; the rest take ATen.
bool smallDenseFloats(const at::Tensor& a, const at::Tensor& b) {
  return plainCpu(a) && plainCpu(b) && a.scalar_type() == b.scalar_type() &&
      (a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble) &&
      a.numel() == b.numel() && a.numel() <= at::internal::GRAIN_SIZE &&
      a.is_contiguous() && b.is_contiguous();
}

// dst = src (dst our own buffer, of src's shape).
void copyValues(at::Tensor& dst, const at::Tensor& src) {
  if (smallDenseFloats(dst, src)) {
    std::memcpy(dst.mutable_data_ptr(), src.const_data_ptr(), src.nbytes());
  } else {
    dst.copy_(src);
  }
}

// out = a - b (out our own buffer, of a's shape, aliasing neither).
void subtractValues(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  if (!smallDenseFloats(a, b) || !smallDenseFloats(out, a)) {
    at::sub_out(out, a, b);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "DifferenceMonitor", [&] {
    const scalar_t* x = a.const_data_ptr<scalar_t>();
    const scalar_t* y = b.const_data_ptr<scalar_t>();
    scalar_t* z = out.mutable_data_ptr<scalar_t>();
    for (int64_t i = 0, n = a.numel(); i < n; ++i) {
      z[i] = x[i] - y[i];
    }
  });
}

// Whether a tensor should be copied with autograd: only when the monitor
// keeps graphs and autograd would record the copy anyway.
bool recordsGraph(const at::Tensor& t, bool keepGraph) {
  return keepGraph && t.requires_grad() && c10::GradMode::is_enabled();
}

// `t` copied, into `spare` when it has the same shape, dtype and device
// (and is unshared), else into new memory. Without autograd unless
// recordsGraph(): the copy is ours alone, so it skips autograd's kernels
// altogether (a detached copy is what they would make of it).
at::Tensor copyOf(const at::Tensor& t, bool keepGraph, at::Tensor spare) {
  if (recordsGraph(t, keepGraph)) {
    return t.clone();
  }
  const at::AutoDispatchBelowADInplaceOrView belowAutograd;
  if (spare.defined() && detail::writableInPlace(spare) &&
      spare.use_count() == 1 &&
      spare.storage().use_count() == 1 && spare.sizes() == t.sizes() &&
      spare.strides() == t.strides() && spare.dtype() == t.dtype() &&
      spare.device() == t.device()) {
    copyValues(spare, t);
    return spare;
  }
  return t.clone();
}

// The value before() keeps: tensors are copied, because the module may
// update the very tensor in place during forward() (BatchNorm's
// running_mean, `state.add_(x)`); a reference would then read the new value
// and every difference would be zero. Values that cannot change in place
// (None, numbers, strings, undefined tensors) are kept as they are.
c10::IValue capture(
    const c10::IValue& value,
    bool keepGraph,
    at::Tensor spare = at::Tensor()) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined()) {
      return value;
    }
    return copyOf(t, keepGraph, std::move(spare));
  }
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    std::vector<c10::IValue> copies;
    copies.reserve(elements.size());
    for (const c10::IValue& element : elements) {
      copies.push_back(capture(element, keepGraph));
    }
    return c10::ivalue::Tuple::create(std::move(copies));
  }
  if (value.isList()) {
    c10::impl::GenericList copies(value.toList().elementType());
    for (const c10::IValue& element : value.toListRef()) {
      copies.push_back(capture(element, keepGraph));
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
// zeros shaped like the other side (inferno's documented behaviour). Without
// autograd unless a graph is kept; the default op then writes post - pre
// into pre's memory when that capture is held by nobody else.
at::Tensor differenceOf(
    const c10::IValue& post,
    const c10::IValue& pre,
    const DifferenceMonitor::Op& op,
    size_t index,
    bool keepGraph) {
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
  if (op) {
    // A custom op gets zeros for a None side and decides about autograd
    // itself (after() detaches what it returns unless graphs are kept).
    const at::Tensor p =
        post.isNone() ? at::zeros_like(pre.toTensor()) : post.toTensor();
    const at::Tensor q =
        pre.isNone() ? at::zeros_like(post.toTensor()) : pre.toTensor();
    return op(p, q);
  }
  const bool graph = (post.isTensor() && recordsGraph(post.toTensor(), keepGraph)) ||
      (pre.isTensor() && recordsGraph(pre.toTensor(), keepGraph));
  std::optional<at::NoGradGuard> noGrad;
  if (!graph) {
    noGrad.emplace();
  }
  if (pre.isNone()) {
    return post.toTensor().clone(); // post - 0
  }
  const at::Tensor& q = pre.toTensor();
  if (post.isNone()) {
    return q.neg(); // 0 - pre
  }
  const at::Tensor& p = post.toTensor();
  if (!graph && p.defined() && q.defined() && detail::writableInPlace(q) &&
      q.use_count() == 1 &&
      q.storage().use_count() == 1 && q.sizes() == p.sizes() &&
      q.scalar_type() == at::result_type(p, q) && q.device() == p.device()) {
    // pre is our own capture, held only by the caller's IValue: writing the
    // difference into it saves an allocation.
    return at::sub_out(const_cast<at::Tensor&>(q), p, q);
  }
  return at::sub(p, q);
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

std::vector<at::Tensor> defaultDifferences(
    const c10::IValue& post,
    const c10::IValue& pre,
    const DifferenceMonitor::Op& op,
    bool keepGraph) {
  if (!post.isTuple() && !pre.isTuple()) {
    return {differenceOf(post, pre, op, 0, keepGraph)};
  }
  // Element-wise over tuples, the shorter one deciding the length (zip).
  const std::vector<c10::IValue> posts = elementsOf(post, pre);
  const std::vector<c10::IValue> pres = elementsOf(pre, post);
  const size_t n = std::min(posts.size(), pres.size());
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(differenceOf(posts[i], pres[i], op, i, keepGraph));
  }
  return out;
}

// Whether observe() skips a value by default: None, or an empty tuple or
// list (inferno's InputMonitor skips a call without arguments).
bool isEmptyObservation(const c10::IValue& value) {
  return value.isNone() ||
      (value.isTuple() && value.toTupleRef().elements().empty()) ||
      (value.isList() && value.toListRef().empty());
}

// observe()'s default map: a tuple's (or list's) tensors as the reducer's
// inputs, a single tensor as its one input, each as it is.
std::vector<at::Tensor> observedInputs(const c10::IValue& value) {
  if (value.isTensor()) {
    return {value.toTensor()};
  }
  TORCH_CHECK_TYPE(
      value.isTuple() || value.isList(),
      "the default map_ feeds a tensor or a tuple of tensors to the reducer; "
      "the observed value is a ",
      kindOf(value),
      ". Pass map_ to turn it into tensors.");
  const c10::ArrayRef<c10::IValue> elements = value.isTuple()
      ? value.toTupleRef().elements()
      : value.toListRef();
  std::vector<at::Tensor> out;
  out.reserve(elements.size());
  for (size_t i = 0; i < elements.size(); ++i) {
    TORCH_CHECK_TYPE(
        elements[i].isTensor(),
        "the default map_ feeds tensors to the reducer; element ",
        i,
        " of the observed value is a ",
        kindOf(elements[i]),
        ". Pass map_ to choose the tensors (or filter_ to skip the call).");
    out.push_back(elements[i].toTensor());
  }
  return out;
}

} // namespace

DifferenceMonitor::DifferenceMonitor(
    std::shared_ptr<Reducer> reducer,
    std::string name,
    bool trainUpdate,
    bool evalUpdate,
    bool keepGraph)
    : reducer_(std::move(reducer)),
      name_(std::move(name)),
      trainUpdate_(trainUpdate),
      evalUpdate_(evalUpdate),
      keepGraph_(keepGraph) {
  // The attribute path reaches Python (errors, monitors_of) and generated
  // hook code: a NUL would cut it short there.
  torch_monitor::detail::checkText(name_, "DifferenceMonitor attribute path");
  TORCH_CHECK_VALUE(
      reducer_ != nullptr,
      "DifferenceMonitor '",
      name_,
      "' needs a reducer to feed; got none");
}

c10::IValue DifferenceMonitor::takePending(std::thread::id thread) {
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->thread == thread) {
      c10::IValue value = std::move(it->value);
      pending_.erase(it);
      return value;
    }
  }
  return c10::IValue();
}

// A capture lives from a before() that ran to the after() of the same
// forward() call on the same thread: a skipped hook drops it too, so a value
// captured in one call never pairs with another call (as could happen when
// forward() changes the module's mode), and its memory is released at once.
// A thread whose forward() raised leaves its capture until its next
// before() replaces it.
void DifferenceMonitor::before(const c10::IValue& value, bool training) {
  const std::thread::id me = std::this_thread::get_id();
  detail::BlockingLock guard(mutex_);
  c10::IValue old = takePending(me);
  if (!runsWhen(training)) {
    return;
  }
  // The capture is made under the lock: it is one tensor copy, and the
  // spare buffer it may reuse is shared by the threads.
  c10::IValue captured = capture(value, keepGraph(), std::move(spare_));
  pending_.push_back(Pending{me, std::move(captured)});
}

void DifferenceMonitor::after(const c10::IValue& value, bool training) {
  const std::thread::id me = std::this_thread::get_id();
  c10::IValue pre; // None without a capture (before() skipped in this call)
  bool defaults = false;
  {
    detail::BlockingLock guard(mutex_);
    pre = takePending(me);
    if (!runsWhen(training)) {
      return;
    }
    defaults = callables_ == nullptr;
  }
  if (!(defaults && subtractIntoHistory(value, pre))) {
    feed(value, pre, /*paired=*/true);
  }
  // The capture's memory (done with: the reducer holds the difference)
  // serves the next capture when nobody else kept it.
  if (pre.isTensor()) {
    at::Tensor memory = std::move(pre).toTensor();
    if (memory.defined() && memory.use_count() == 1 &&
        memory.storage().use_count() == 1 && !memory.requires_grad()) {
      detail::BlockingLock guard(mutex_);
      spare_ = std::move(memory);
    }
  }
}

bool DifferenceMonitor::subtractIntoHistory(
    const c10::IValue& post,
    const c10::IValue& pre) {
  if (!post.isTensor() || !pre.isTensor() || keepGraph()) {
    return false;
  }
  const at::Tensor& p = post.toTensor();
  const at::Tensor& q = pre.toTensor();
  if (!p.defined() || !q.defined() || p.sizes() != q.sizes() ||
      p.scalar_type() != q.scalar_type() || p.device() != q.device()) {
    return false;
  }
  // What the default filter, map and op give for two such tensors is
  // p - q, detached: computed into the reducer's next row (without
  // autograd: the row is the reducer's alone), it needs no copy there.
  return reducer_->forwardInto(
      p, [&](at::Tensor& row) { subtractValues(row, p, q); });
}

void DifferenceMonitor::observe(const c10::IValue& value, bool training) {
  if (!runsWhen(training)) {
    return;
  }
  c10::IValue none;
  feed(value, none, /*paired=*/false);
}

void DifferenceMonitor::feed(
    const c10::IValue& post,
    c10::IValue& pre,
    bool paired) {
  std::shared_ptr<const Callables> callables;
  {
    detail::BlockingLock guard(mutex_);
    callables = callables_;
  }
  const Filter* filter = callables ? &callables->filter : nullptr;
  const bool pass = filter != nullptr && *filter ? (*filter)(post, pre)
      : paired ? !(post.isNone() && pre.isNone())
               : !isEmptyObservation(post);
  if (!pass) {
    return;
  }
  try {
    const bool keep = keepGraph();
    std::vector<at::Tensor> inputs = paired
        ? differences(post, pre, callables.get(), keep)
        : (callables && callables->map ? callables->map(post, pre)
                                       : observedInputs(post));
    if (!keep) {
      // A custom map_ or op_, or an observed tensor, may come with a graph.
      for (at::Tensor& input : inputs) {
        if (input.defined() && input.requires_grad()) {
          input = input.detach();
        }
      }
    }
    reducer_->forward(inputs);
  } catch (c10::Error& e) {
    // Keeps the error's type (ValueError stays ValueError) and says which
    // monitor failed: in a model with many monitors the reducer's own
    // message ("shape [3] does not match [2]") does not.
    e.add_context(
        paired ? "in DifferenceMonitor '" + name_ +
                "' (the difference of that attribute across forward())"
               : "in the monitor of '" + name_ +
                "' (the value it observes at forward())");
    throw;
  }
}

std::vector<at::Tensor> DifferenceMonitor::differences(
    const c10::IValue& post,
    c10::IValue& pre,
    const Callables* callables,
    bool keepGraph) const {
  if (callables != nullptr && callables->map) {
    return callables->map(post, pre);
  }
  return defaultDifferences(
      post, pre, callables != nullptr ? callables->op : Op(), keepGraph);
}

std::vector<at::Tensor> DifferenceMonitor::defaultMap(
    const c10::IValue& post,
    const c10::IValue& pre,
    const Op& op) {
  return defaultDifferences(post, pre, op, /*keepGraph=*/true);
}

void DifferenceMonitor::clear(bool keepshape) {
  forgetAll();
  reducer_->clear(keepshape);
}

void DifferenceMonitor::forget() {
  const std::thread::id me = std::this_thread::get_id();
  detail::BlockingLock guard(mutex_);
  takePending(me);
}

void DifferenceMonitor::forgetAll() {
  detail::BlockingLock guard(mutex_);
  pending_.clear();
  spare_ = at::Tensor();
}

bool DifferenceMonitor::hasCapture() const {
  const std::thread::id me = std::this_thread::get_id();
  detail::BlockingLock guard(mutex_);
  return std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) {
    return p.thread == me;
  });
}

const std::shared_ptr<Reducer>& DifferenceMonitor::reducer() const noexcept {
  return reducer_;
}

const std::string& DifferenceMonitor::name() const noexcept {
  return name_;
}

void DifferenceMonitor::replaceCallables(
    const std::function<void(Callables&)>& change) {
  detail::BlockingLock guard(mutex_);
  auto next = callables_ ? std::make_shared<Callables>(*callables_)
                         : std::make_shared<Callables>();
  change(*next);
  if (!next->filter && !next->map && !next->op) {
    callables_.reset();
  } else {
    callables_ = std::move(next);
  }
}

void DifferenceMonitor::setFilter(Filter filter) {
  replaceCallables([&](Callables& c) { c.filter = std::move(filter); });
}

void DifferenceMonitor::setMap(Map map) {
  replaceCallables([&](Callables& c) { c.map = std::move(map); });
}

void DifferenceMonitor::setOp(Op op) {
  replaceCallables([&](Callables& c) { c.op = std::move(op); });
}

bool DifferenceMonitor::hasCustomCallables() const {
  detail::BlockingLock guard(mutex_);
  return callables_ != nullptr;
}

DifferenceMonitor::Filter DifferenceMonitor::filter() const {
  detail::BlockingLock guard(mutex_);
  return callables_ ? callables_->filter : Filter();
}

DifferenceMonitor::Map DifferenceMonitor::map() const {
  detail::BlockingLock guard(mutex_);
  return callables_ ? callables_->map : Map();
}

DifferenceMonitor::Op DifferenceMonitor::op() const {
  detail::BlockingLock guard(mutex_);
  return callables_ ? callables_->op : Op();
}

} // namespace torch_monitor
