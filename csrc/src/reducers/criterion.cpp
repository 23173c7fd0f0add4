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

// The built-in criteria: their names, in the order messages list them, and
// what each computes. builtinNames() and builtin() both read this table.
struct BuiltinCriterion {
  const char* name;
  at::Tensor (*apply)(const at::Tensor& x, double threshold);
};

const std::vector<BuiltinCriterion>& builtinTable() {
  static const std::vector<BuiltinCriterion> table{
      {"eq", [](const at::Tensor& x, double t) { return at::eq(x, t); }},
      {"ne", [](const at::Tensor& x, double t) { return at::ne(x, t); }},
      {"gt", [](const at::Tensor& x, double t) { return at::gt(x, t); }},
      {"ge", [](const at::Tensor& x, double t) { return at::ge(x, t); }},
      {"lt", [](const at::Tensor& x, double t) { return at::lt(x, t); }},
      {"le", [](const at::Tensor& x, double t) { return at::le(x, t); }},
      // Bool inputs are their own mask; the comparison would give the same.
      {"nonzero",
       [](const at::Tensor& x, double) {
         return x.scalar_type() == at::kBool ? x : at::ne(x, 0);
       }}};
  return table;
}

} // namespace

const std::vector<std::string>& Criterion::builtinNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const BuiltinCriterion& c : builtinTable()) {
      out.emplace_back(c.name);
    }
    return out;
  }();
  return names;
}

Criterion Criterion::builtin(const std::string& name, double threshold) {
  for (const BuiltinCriterion& c : builtinTable()) {
    if (name == c.name) {
      // "nonzero" takes no threshold: it is 0 in its repr and state.
      const double t = name == "nonzero" ? 0.0 : threshold;
      auto apply = c.apply;
      return Criterion(
          [apply, t](const at::Tensor& x) { return apply(x, t); },
          name,
          t,
          /*builtin=*/true);
    }
  }
  TORCH_CHECK_VALUE(
      false,
      "unknown criterion '",
      name,
      "'; the built-in criteria are ",
      joined(builtinNames()),
      " (compared with a threshold), or pass a callable from Python");
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
