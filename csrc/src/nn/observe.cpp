// The hook behind attachInput/attachOutput/attachState/attachMultiState:
// turn what it observes into one IValue and hand it to
// DifferenceMonitor::observe with the module's train/eval mode.

#include <torch_monitor/nn/observe.h>

#include <optional>
#include <string>
#include <typeinfo>

#include <torch/nn/module.h>

#include <torch_monitor/monitors/difference_monitor.h>
#include <torch_monitor/nn/attribute_path.h>

namespace torch_monitor::nn::detail {
namespace {

// One argument (`index...` = i) or the output (no index) as an IValue, when
// its type is one a monitor can take.
template <typename View, typename... Index>
std::optional<c10::IValue> ivalueOf(const View& view, Index... index) {
  if (const auto* t = view.template getIf<at::Tensor>(index...)) {
    return c10::IValue(*t);
  }
  if (const auto* v = view.template getIf<c10::IValue>(index...)) {
    return *v;
  }
  if (const auto* d = view.template getIf<double>(index...)) {
    return c10::IValue(*d);
  }
  if (const auto* n = view.template getIf<int64_t>(index...)) {
    return c10::IValue(*n);
  }
  if (const auto* b = view.template getIf<bool>(index...)) {
    return c10::IValue(*b);
  }
  if (const auto* list = view.template getIf<std::vector<at::Tensor>>(index...)) {
    return c10::ivalue::Tuple::create(
        std::vector<c10::IValue>(list->begin(), list->end()));
  }
  return std::nullopt;
}

// The error for an argument or output of another type.
std::string unsupported(const std::string& what, const std::type_info& type) {
  return "torch_monitor: a monitor cannot take " + what + ", a " +
      typeName(type) +
      "; it takes torch::Tensor, double, int64_t, bool, c10::IValue or "
      "std::vector<torch::Tensor>. Observe an attribute instead, or wrap the "
      "module so that forward() uses those types";
}

c10::IValue inputsOf(const ForwardArgs& args) {
  std::vector<c10::IValue> elements;
  elements.reserve(args.size());
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::optional<c10::IValue> value = ivalueOf(args, i);
    TORCH_CHECK_TYPE(
        value.has_value(),
        unsupported("forward argument " + std::to_string(i), args.type(i)));
    elements.push_back(std::move(*value));
  }
  return c10::ivalue::Tuple::create(std::move(elements));
}

c10::IValue outputOf(const ForwardOutput& output) {
  if (!output.hasValue()) {
    return c10::IValue(); // void forward(): None, skipped by default
  }
  std::optional<c10::IValue> value = ivalueOf(output);
  TORCH_CHECK_TYPE(
      value.has_value(), unsupported("what forward() returned", output.type()));
  return std::move(*value);
}

} // namespace

HookHandle attachObserver(
    torch::nn::Module& module,
    std::shared_ptr<DifferenceMonitor> monitor,
    Observed what,
    std::vector<std::string> paths,
    bool asPrehook,
    bool prepend) {
  TORCH_CHECK_VALUE(
      monitor != nullptr,
      "torch_monitor: attaching a monitor needs one, got a null pointer; "
      "create it with std::make_shared<torch_monitor::DifferenceMonitor>(...)");
  const bool needsPaths = what == Observed::State || what == Observed::States;
  TORCH_CHECK_VALUE(
      !needsPaths || !paths.empty(),
      "torch_monitor: attachMultiState() needs at least one attribute path");
  // Parsed once (a malformed path fails here), resolved at every call.
  std::vector<AttributePath> parsed(paths.begin(), paths.end());
  auto value = [what, parsed = std::move(parsed)](
                   torch::nn::Module& m,
                   const ForwardArgs& args,
                   const ForwardOutput* output) -> c10::IValue {
    switch (what) {
      case Observed::Inputs:
        return inputsOf(args);
      case Observed::Output:
        return outputOf(*output);
      case Observed::State:
        return parsed.front().resolve(m);
      case Observed::States:
        break;
    }
    std::vector<c10::IValue> elements;
    elements.reserve(parsed.size());
    for (const AttributePath& path : parsed) {
      elements.push_back(path.resolve(m));
    }
    return c10::ivalue::Tuple::create(std::move(elements));
  };
  if (what == Observed::Inputs || (needsPaths && asPrehook)) {
    return registerForwardPreHook(
        module,
        [monitor, value](torch::nn::Module& m, const ForwardArgs& args) {
          const bool training = m.is_training();
          if (monitor->runsWhen(training)) {
            monitor->observe(value(m, args, nullptr), training);
          }
        },
        prepend);
  }
  return registerForwardHook(
      module,
      [monitor, value](
          torch::nn::Module& m, const ForwardArgs& args, ForwardOutput& out) {
        const bool training = m.is_training();
        if (monitor->runsWhen(training)) {
          monitor->observe(value(m, args, &out), training);
        }
      },
      prepend);
}

} // namespace torch_monitor::nn::detail
