#include <torch_monitor/reducers/criterion.h>

#include <ATen/ATen.h>

namespace torch_monitor {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) {
    out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

} // namespace

const std::vector<std::string>& Criterion::builtinNames() {
  static const std::vector<std::string> names{
      "eq", "ne", "gt", "ge", "lt", "le", "nonzero"};
  return names;
}

Criterion Criterion::builtin(const std::string& name, double threshold) {
  Function fn;
  if (name == "eq") {
    fn = [threshold](const at::Tensor& x) { return at::eq(x, threshold); };
  } else if (name == "ne") {
    fn = [threshold](const at::Tensor& x) { return at::ne(x, threshold); };
  } else if (name == "gt") {
    fn = [threshold](const at::Tensor& x) { return at::gt(x, threshold); };
  } else if (name == "ge") {
    fn = [threshold](const at::Tensor& x) { return at::ge(x, threshold); };
  } else if (name == "lt") {
    fn = [threshold](const at::Tensor& x) { return at::lt(x, threshold); };
  } else if (name == "le") {
    fn = [threshold](const at::Tensor& x) { return at::le(x, threshold); };
  } else if (name == "nonzero") {
    // Bool inputs are their own mask; the comparison would give the same.
    fn = [](const at::Tensor& x) {
      return x.scalar_type() == at::kBool ? x : at::ne(x, 0);
    };
    threshold = 0.0;
  } else {
    TORCH_CHECK_VALUE(
        false,
        "unknown criterion '",
        name,
        "'; the built-in criteria are ",
        joined(builtinNames()),
        " (compared with a threshold), or pass a callable from Python");
  }
  return Criterion(std::move(fn), name, threshold, /*builtin=*/true);
}

Criterion Criterion::custom(Function fn, std::string description) {
  TORCH_CHECK_VALUE(
      static_cast<bool>(fn), "a custom criterion needs a function, got none");
  return Criterion(std::move(fn), std::move(description), 0.0, false);
}

std::string Criterion::repr() const {
  if (!builtin_ || name_ == "nonzero") {
    return name_;
  }
  return c10::str(name_, "(", threshold_, ")");
}

at::Tensor Criterion::operator()(const at::Tensor& x) const {
  TORCH_CHECK_VALUE(valid(), "the reducer has no criterion to apply");
  at::Tensor mask = fn_(x);
  TORCH_CHECK_TYPE(
      mask.defined() && mask.scalar_type() == at::kBool,
      "criterion ",
      repr(),
      " must return a bool tensor (the mask of matching elements), got ",
      mask.defined() ? c10::str("dtype ", mask.scalar_type())
                     : std::string("an undefined tensor"));
  return mask;
}

} // namespace torch_monitor
