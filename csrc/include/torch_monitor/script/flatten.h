#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/custom_class.h>

namespace torch_monitor::script {

// An object's configuration as (key, value) pairs: what its constructor
// took, never what changes from step to step.
using Config = std::vector<std::pair<std::string, c10::IValue>>;

// ((key, value), ...) as PyTorch 2 expects from __obj_flatten__.
c10::IValue flattenConfig(Config config);

// Gives a custom class what torch.compile and torch.export need of it:
// * __obj_flatten__: they build the class's fake object (torch_monitor._fake)
//   from what it returns, and Dynamo guards on it. `config(self)` must
//   therefore list configuration only; a per-step number there would
//   recompile every step.
// * __eq__, by identity: PT2 compares the objects it lifts into a graph, and
//   torch.ScriptObject's == raises for a class without one.
template <class Holder, class ConfigOf>
torch::class_<Holder>& defineFlatten(
    torch::class_<Holder>& cls,
    ConfigOf config) {
  return cls
      .def(
          "__obj_flatten__",
          [config](const c10::intrusive_ptr<Holder>& self) -> c10::IValue {
            return flattenConfig(config(*self));
          })
      .def(
          "__eq__",
          [](const c10::intrusive_ptr<Holder>& self, const c10::IValue& other) {
            return other.isCustomClass() &&
                other.type() ==
                c10::getCustomClassType<c10::intrusive_ptr<Holder>>() &&
                other.toCustomClass<Holder>().get() == self.get();
          });
}

} // namespace torch_monitor::script
