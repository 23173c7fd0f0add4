#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include <torch/custom_class.h>

#include <torch_monitor/monitors/difference_monitor.h>
#include <torch_monitor/script/reducer.h>

namespace torch_monitor::script {

// The TorchScript face of a DifferenceMonitor:
// torch.classes.torch_monitor.DifferenceMonitor. A monitored module holds one
// as an attribute; its hooks call before()/after() on it, in eager Python
// (through the binding's fast path) and in scripted or loaded modules alike.
// It shares the reducer with the Python reducer object it was built from.
// Thread safety: as DifferenceMonitor (every method from any thread).
class ScriptDifferenceMonitor : public torch::CustomClassHolder {
 public:
  // Pickled state; the version comes first so later layouts can be read.
  // The captured pre-forward value is not part of it (a module is saved
  // between forward() calls).
  using State = std::tuple<
      int64_t, // version
      std::string, // name: the attribute path
      bool, // train_update
      bool, // eval_update
      c10::IValue, // the Reducer object, pickled by its class
      bool, // keep_graph (absent in version 1, which kept none)
      std::string>; // kind (absent before version 3: "DifferenceMonitor")
  static constexpr int64_t kStateVersion = 3;

  // The kind of a monitor built without one.
  static constexpr const char* kDefaultKind = "DifferenceMonitor";

  // `reducer` is a torch.classes.torch_monitor.Reducer object (an
  // intrusive_ptr<ScriptReducer> converts). The very object is kept, not
  // only the C++ reducer: torch.jit.save writes an object referenced twice
  // (by the module and by this monitor) once, so both still share one
  // reducer after loading. Throws c10::TypeError for anything else.
  // `kind` names the monitor class whose hooks drive it ("InputMonitor",
  // ...): one C++ core serves every monitor, and monitorsOf() reports it;
  // any other kind is a c10::ValueError (also when a saved state holds it).
  // A DifferenceMonitor's name is its attribute path: one that does not
  // parse (an empty part) is a c10::ValueError.
  ScriptDifferenceMonitor(
      c10::IValue reducer,
      std::string name,
      bool trainUpdate,
      bool evalUpdate,
      bool keepGraph = false,
      std::string kind = kDefaultKind);

  DifferenceMonitor& monitor() noexcept {
    return monitor_;
  }
  const DifferenceMonitor& monitor() const noexcept {
    return monitor_;
  }
  const c10::intrusive_ptr<ScriptReducer>& scriptReducer() const noexcept {
    return reducer_;
  }
  // Which monitor this is, e.g. "DifferenceMonitor" or "OutputMonitor".
  const std::string& kind() const noexcept {
    return kind_;
  }
  // The Reducer object given to the constructor.
  const c10::IValue& reducerObject() const noexcept {
    return reducerObject_;
  }
  // Keeps `object`, a Reducer object holding this monitor's C++ reducer,
  // as the one to save. TorchScript's constructor receives the C++ reducer
  // only and wraps it in a new object; a binding that knows the object its
  // caller holds (a reducer module's) gives it here, right after
  // construction, so that a module holding both still shares one reducer
  // once saved and loaded. Throws c10::ValueError for another reducer.
  void keepReducerObject(c10::IValue object);

  // Throws c10::Error naming the monitor when it has custom (Python)
  // callables: those cannot be saved, and a silently different monitor after
  // loading would be worse than no save.
  State state() const;
  // Reads versions 1 to 3 (version 1's tuple has no keep_graph, versions 1
  // and 2 no kind).
  static c10::intrusive_ptr<ScriptDifferenceMonitor> fromState(
      c10::IValue state);

 private:
  c10::IValue reducerObject_;
  c10::intrusive_ptr<ScriptReducer> reducer_;
  DifferenceMonitor monitor_;
  std::string kind_;
};

} // namespace torch_monitor::script
