// The law of hostile tensors (issue 25), for every op of the torch_monitor
// library: the ops are enumerated through the dispatcher, so an op is
// covered by being registered; what a new op adds here is its entry in
// validCalls() (valid example arguments) and, in its `accepts`, the hostile
// variants it legitimately accepts. Each op is called with its valid
// arguments, then, for each Tensor or Tensor[] argument, with that argument
// (the first element of a list) replaced by a hostile variant: expanded
// (stride 0), transposed, a non-contiguous slice, empty, on the meta
// device, of the wrong dtype. It must throw a c10::Error (never crash or
// write out of bounds: this test also runs under ASan + UBSan), unless the
// entry says the op accepts that variant; the result must then be what the
// same values give as a plain contiguous tensor. test_law_hostile_tensors.py
// is the Python side (with torch.library.opcheck).

#include <functional>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <torch_monitor/script/event.h>
#include <torch_monitor/watch/recorder.h>

#include "test_support.h"

namespace torch_monitor::test {
namespace {

// One call of an op: its arguments, and what it did (printed), read after
// the call.
struct Call {
  torch::jit::Stack args;
  std::function<std::string()> result;
};

// An op's valid calls (each makes fresh state: a watch, a handler) and the
// hostile variants it accepts, by argument name, each with the reason.
struct Entry {
  std::vector<std::function<Call()>> calls;
  std::map<std::string, std::map<std::string, std::string>> accepts;
};

std::string printed(const at::Tensor& t) {
  std::ostringstream out;
  out << std::setprecision(17);
  const at::Tensor c = t.to(at::kDouble).contiguous();
  out << c.sizes() << ":";
  const double* p = c.const_data_ptr<double>();
  for (int64_t i = 0; i < c.numel(); ++i) {
    out << " " << p[i];
  }
  return out.str();
}

std::string printed(const std::vector<Event>& events) {
  std::ostringstream out;
  out << std::setprecision(17);
  for (const Event& e : events) {
    out << e.name << " {";
    for (const auto& key : keysOf(e)) {
      out << " " << key << "=";
      std::visit([&](const auto& v) { out << v; }, e.data.at(key));
      out << " (type " << e.data.at(key).index() << ")";
    }
    out << " }\n";
  }
  return out.str();
}

// A watch and one observation of it: `update` watches weights' updates
// (which need `before`), else module outputs.
std::function<Call()> watchCall(bool update) {
  return [update] {
    const watch::Kind kind = update ? watch::Kind::Update : watch::Kind::Output;
    watch::RecorderOptions options;
    options.windowSteps = 100;
    auto recorder = watch::Recorder::create(
        {watch::Key{"a", kind}, watch::Key{"b", kind}},
        options,
        c10::Device(c10::DeviceType::CPU));
    torch::manual_seed(0);
    c10::List<at::Tensor> values({torch::randn({3, 5}), torch::randn({4})});
    c10::List<at::Tensor> before;
    if (update) {
      before = c10::List<at::Tensor>({torch::randn({3, 5}), torch::randn({4})});
    }
    Call call;
    call.args = {
        recorder->slots(),
        recorder->gate(),
        values,
        c10::List<int64_t>({0, 1}),
        before,
        recorder->id()};
    // The recorder lives as long as the call; its slots are the result.
    call.result = [recorder] { return printed(recorder->slots()); };
    return call;
  };
}

// A handler that records what the call logs, for as long as the call lives.
std::function<Call()> eventCall(
    std::function<torch::jit::Stack()> args) {
  return [args] {
    auto handler = std::make_shared<RecordingHandler>();
    auto scope = std::make_shared<ScopedHandler>(handler);
    Call call;
    call.args = args();
    call.result = [handler, scope] { return printed(handler->events()); };
    return call;
  };
}

std::map<std::string, Entry> validCalls() {
  std::map<std::string, Entry> table;
  table["torch_monitor::watch_observe_"] = Entry{
      {watchCall(false), watchCall(true)},
      {{"values",
        {{"expanded", "scanned through a contiguous copy"},
         {"transposed", "scanned through a contiguous copy"},
         {"sliced", "scanned through a contiguous copy"},
         {"empty", "nothing to observe: skipped (docs/watch.md)"},
         {"wrong dtype",
          "not floating point: skipped, as an integer output is "
          "(docs/watch.md)"}}},
       {"before",
        {{"expanded", "read through a contiguous copy"},
         {"transposed", "read through a contiguous copy"},
         {"sliced", "read through a contiguous copy"}}}}};
  table["torch_monitor::log_event_values"] = Entry{
      {eventCall([] {
        return torch::jit::Stack{
            std::string("law"),
            c10::List<std::string>({"x", "y"}),
            c10::List<at::Tensor>(
                {torch::full({1, 1}, 2.5), torch::tensor(int64_t(3))}),
            c10::List<std::string>({"note"}),
            c10::List<std::string>({"text"})};
      })},
      {{"values",
        {{"transposed", "one element, read with item()"},
         {"sliced", "one element, read with item()"},
         {"wrong dtype", "an integer tensor logs an int (documented)"}}}}};
  table["torch_monitor::log_event"] = Entry{
      {eventCall([] {
        Event event;
        event.name = "law";
        event.data["x"] = 1.5;
        return torch::jit::Stack{
            c10::make_intrusive<script::ScriptEvent>(std::move(event))};
      })},
      {}};
  table["torch_monitor::set_step"] = Entry{
      {[] {
        Call call;
        call.args = {int64_t(7)};
        call.result = [] { return std::to_string(getStep().value_or(-1)); };
        return call;
      }},
      {}};
  table["torch_monitor::get_step"] = Entry{
      {[] {
        Call call;
        call.result = [] { return std::string(); };
        return call;
      }},
      {}};
  table["torch_monitor::live_stat_names"] = Entry{
      {[] {
        Call call;
        call.result = [] { return std::string(); };
        return call;
      }},
      {}};
  return table;
}

// The hostile variants of a valid tensor argument `t`; an empty optional
// with the reason where a variant cannot be made of it.
struct Variant {
  std::string name;
  std::optional<at::Tensor> tensor;
  std::string skipped;
};

std::vector<Variant> hostileVariants(const at::Tensor& t) {
  std::vector<Variant> out;
  if (t.numel() > 1) {
    // t's shape, every element the first one's memory (strides 0).
    out.push_back({"expanded", t.flatten()[0].expand(t.sizes()), ""});
  } else if (t.numel() == 1) {
    out.push_back({"expanded", t.reshape({1}).expand({2}), ""});
  } else {
    out.push_back({"expanded", std::nullopt, "no element to repeat"});
  }
  if (t.dim() >= 2) {
    out.push_back(
        {"transposed",
         t.transpose(-1, -2).contiguous().transpose(-1, -2),
         ""});
  } else {
    out.push_back(
        {"transposed", std::nullopt, "fewer than 2 dimensions: no transpose"});
  }
  if (t.dim() >= 1) {
    std::vector<int64_t> wide = t.sizes().vec();
    wide.back() *= 2;
    at::Tensor sliced =
        at::zeros(wide, t.options()).slice(-1, 0, c10::nullopt, 2);
    sliced.copy_(t);
    out.push_back({"sliced", sliced, ""});
    out.push_back({"empty", t.narrow(-1, 0, 0), ""});
  } else {
    out.push_back({"sliced", std::nullopt, "0-d: nothing to slice"});
    out.push_back({"empty", t.reshape({1}).narrow(0, 0, 0), ""});
  }
  out.push_back({"meta", at::empty_like(t, t.options().device(at::kMeta)), ""});
  out.push_back(
      {"wrong dtype",
       t.to(at::isFloatingType(t.scalar_type()) ? at::kLong : at::kDouble),
       ""});
  return out;
}

// Runs `op` on `args`; the c10::Error's message, or nothing when it ran.
std::optional<std::string> run(
    const c10::OperatorHandle& op,
    torch::jit::Stack args) {
  try {
    op.callBoxed(args);
  } catch (const c10::Error& e) {
    return std::string(e.what_without_backtrace());
  }
  return std::nullopt;
}

std::vector<c10::OperatorName> libraryOps() {
  std::vector<c10::OperatorName> ops;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("torch_monitor::", 0) == 0) {
      ops.push_back(name);
    }
  }
  return ops;
}

TEST(OpLaws, TheRegistryIsEnumerated) {
  // The five ops of the library today: a floor, so that a registry the
  // enumeration cannot see fails here instead of passing vacuously.
  std::set<std::string> names;
  for (const auto& op : libraryOps()) {
    names.insert(op.name);
  }
  for (const char* known :
       {"torch_monitor::watch_observe_",
        "torch_monitor::log_event_values",
        "torch_monitor::log_event",
        "torch_monitor::set_step",
        "torch_monitor::get_step",
        "torch_monitor::live_stat_names"}) {
    EXPECT_EQ(names.count(known), 1u) << known;
  }
}

TEST(OpLaws, EveryOpRefusesHostileTensorsWithAnError) {
  const auto table = validCalls();
  for (const auto& name : libraryOps()) {
    SCOPED_TRACE(name.name);
    const auto found = table.find(name.name);
    if (found == table.end()) {
      ADD_FAILURE() << name.name
                    << " has no valid arguments in validCalls(): add them "
                       "(and the hostile variants it accepts, if any)";
      continue;
    }
    const Entry& entry = found->second;
    const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(
        name.name.c_str(), name.overload_name.c_str());
    const auto& arguments = op.schema().arguments();
    for (size_t example = 0; example < entry.calls.size(); ++example) {
      SCOPED_TRACE("valid call " + std::to_string(example));
      {
        Call call = entry.calls[example]();
        const auto error = run(op, call.args);
        ASSERT_FALSE(error) << "its valid call was refused: " << *error;
      }
      for (size_t a = 0; a < arguments.size(); ++a) {
        const auto& argument = arguments[a];
        const auto kind = argument.type()->kind();
        const bool list = kind == c10::TypeKind::ListType &&
            argument.type()->containedType(0)->kind() ==
                c10::TypeKind::TensorType;
        if (kind != c10::TypeKind::TensorType && !list) {
          continue;
        }
        at::Tensor valid;
        {
          const Call probe = entry.calls[example]();
          if (list) {
            const auto tensors = probe.args[a].toTensorList();
            if (tensors.empty()) {
              continue; // this call passes no tensor there
            }
            valid = tensors.get(0);
          } else {
            valid = probe.args[a].toTensor();
          }
        }
        for (const Variant& variant : hostileVariants(valid)) {
          if (!variant.tensor) {
            continue; // variant.skipped says why
          }
          SCOPED_TRACE(argument.name() + ": " + variant.name);
          // Each call on fresh state (a watch of its own), with the
          // argument replaced.
          auto replaced = [&](const at::Tensor& t) {
            Call call = entry.calls[example]();
            if (list) {
              auto tensors = call.args[a].toTensorList().copy();
              tensors.set(0, t);
              call.args[a] = tensors;
            } else {
              call.args[a] = t;
            }
            return call;
          };
          Call hostile = replaced(*variant.tensor);
          std::optional<std::string> error;
          try {
            error = run(op, hostile.args);
          } catch (const std::exception& e) {
            ADD_FAILURE() << "threw something else than a c10::Error: "
                          << e.what();
            continue;
          }
          if (error) {
            continue; // refused: the law holds
          }
          const auto accepts = entry.accepts.find(argument.name());
          const bool accepted = accepts != entry.accepts.end() &&
              accepts->second.count(variant.name) > 0;
          if (!accepted || variant.name == "meta") {
            ADD_FAILURE() << "accepted without an error (refuse it, or "
                             "list it in the op's `accepts` with the "
                             "reason, if it is read correctly)";
            continue;
          }
          // Accepted: it must give what the same values give as a plain
          // contiguous tensor (each result read before the next call, whose
          // state, a handler say, could see both).
          const std::string got = hostile.result();
          hostile = Call{};
          Call plain = replaced(variant.tensor->contiguous().clone());
          const auto plainError = run(op, plain.args);
          EXPECT_FALSE(plainError) << *plainError;
          EXPECT_EQ(got, plain.result())
              << "accepted (" << accepts->second.at(variant.name)
              << ") but read wrongly";
        }
      }
    }
  }
  clearStep();
}

} // namespace
} // namespace torch_monitor::test
