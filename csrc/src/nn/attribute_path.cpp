#include <torch_monitor/nn/attribute_path.h>

#include <algorithm>
#include <array>
#include <sstream>
#include <string_view>
#include <utility>

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

namespace torch_monitor::nn {

namespace {

// "a.b" from the first `n` parts.
std::string joinParts(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i) {
      out += '.';
    }
    out += parts[i];
  }
  return out;
}

template <typename Dict>
std::string keyList(const Dict& dict) {
  if (dict.is_empty()) {
    return "none";
  }
  std::string out;
  for (const auto& item : dict) {
    if (!out.empty()) {
      out += ", ";
    }
    out += item.key();
  }
  return out;
}

// What `module` registered, for error messages.
std::string contents(const torch::nn::Module& module) {
  std::ostringstream out;
  out << "parameters: " << keyList(module.named_parameters(false))
      << "; buffers: " << keyList(module.named_buffers(false))
      << "; submodules: " << keyList(module.named_children());
  return out.str();
}

// "the module itself (Net)" or "the submodule 'block' (Block)".
std::string where(
    const torch::nn::Module& module,
    const std::vector<std::string>& parts,
    size_t depth) {
  if (depth == 0) {
    return "the module itself (" + module.name() + ")";
  }
  return "the submodule '" + joinParts(parts, depth) + "' (" + module.name() +
      ")";
}

// Python's hard keywords (keyword.kwlist): `self.class` does not compile as
// Python, so such a part is written as a key. The Python test compares this
// list with the keyword module of the running Python.
constexpr std::array<std::string_view, 35> kPythonKeywords = {
    "False",  "None",     "True",    "and",    "as",       "assert", "async",
    "await",  "break",    "class",   "continue", "def",    "del",    "elif",
    "else",   "except",   "finally", "for",    "from",     "global", "if",
    "import", "in",       "is",      "lambda", "nonlocal", "not",    "or",
    "pass",   "raise",    "return",  "try",    "while",    "with",   "yield"};

bool isAsciiLetterOrUnderscore(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

bool isAsciiDigit(char c) {
  return c >= '0' && c <= '9';
}

} // namespace

PathPartKind pathPartKind(const std::string& part) {
  if (!part.empty() && std::all_of(part.begin(), part.end(), isAsciiDigit)) {
    return PathPartKind::Index;
  }
  // TorchScript names are ASCII identifiers; anything else is a key.
  const bool identifier = !part.empty() &&
      isAsciiLetterOrUnderscore(part.front()) &&
      std::all_of(part.begin(), part.end(), [](char c) {
        return isAsciiLetterOrUnderscore(c) || isAsciiDigit(c);
      });
  const bool keyword =
      std::find(kPythonKeywords.begin(), kPythonKeywords.end(), part) !=
      kPythonKeywords.end();
  return identifier && !keyword ? PathPartKind::Attribute : PathPartKind::Key;
}

AttributePath::AttributePath(std::string path) : path_(std::move(path)) {
  size_t start = 0;
  while (true) {
    const size_t dot = path_.find('.', start);
    const size_t end = dot == std::string::npos ? path_.size() : dot;
    TORCH_CHECK_VALUE(
        end > start,
        "torch_monitor: attribute path '", path_,
        "' has an empty part; write names separated by single dots, e.g. "
        "'weight' or 'block.state'");
    parts_.push_back(path_.substr(start, end - start));
    if (dot == std::string::npos) {
      break;
    }
    start = dot + 1;
  }
}

c10::IValue AttributePath::resolve(const torch::nn::Module& module) const {
  const torch::nn::Module* current = &module;
  const size_t n = parts_.size();
  for (size_t i = 0; i + 1 < n; ++i) {
    const std::string& part = parts_[i];
    const auto children = current->named_children();
    if (const auto* child = children.find(part)) {
      current = child->get();
      continue;
    }
    const auto params = current->named_parameters(false);
    const auto buffers = current->named_buffers(false);
    const char* kind = params.contains(part) ? "parameter"
        : buffers.contains(part)              ? "buffer"
                                              : nullptr;
    TORCH_CHECK_VALUE(
        kind == nullptr,
        "torch_monitor: attribute path '", path_, "' does not resolve on ",
        module.name(), ": '", joinParts(parts_, i + 1), "' is a ", kind,
        " (a tensor), so '", parts_[i + 1],
        "' cannot follow it; end the path at the tensor");
    TORCH_CHECK_VALUE(
        false,
        "torch_monitor: attribute path '", path_, "' does not resolve on ",
        module.name(), ": ", where(*current, parts_, i),
        " has no submodule named '", part, "' (", contents(*current),
        "). C++ paths resolve only through what modules registered with "
        "register_module, register_parameter and register_buffer");
  }
  const std::string& last = parts_.back();
  // named_parameters/named_buffers return copies: keep them alive while
  // reading from them.
  const auto params = current->named_parameters(false);
  if (const auto* param = params.find(last)) {
    return c10::IValue(*param);
  }
  const auto buffers = current->named_buffers(false);
  if (const auto* buffer = buffers.find(last)) {
    return c10::IValue(*buffer);
  }
  TORCH_CHECK_VALUE(
      !current->named_children().contains(last),
      "torch_monitor: attribute path '", path_, "' names a submodule of ",
      module.name(), ", not a tensor; extend it to one of that submodule's "
      "parameters or buffers (e.g. '", path_, ".weight')");
  TORCH_CHECK_VALUE(
      false,
      "torch_monitor: attribute path '", path_, "' does not resolve on ",
      module.name(), ": ", where(*current, parts_, n - 1),
      " has no parameter or buffer named '", last, "' (", contents(*current),
      "). C++ paths resolve only through what modules registered with "
      "register_module, register_parameter and register_buffer; a tensor "
      "registered undefined is not listed by torch::nn::Module either, so "
      "register a defined one (e.g. at::zeros({0}))");
  return c10::IValue(); // unreachable
}

c10::IValue resolveAttribute(
    const torch::nn::Module& module,
    const std::string& path) {
  return AttributePath(path).resolve(module);
}

} // namespace torch_monitor::nn
