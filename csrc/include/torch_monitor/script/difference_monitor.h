#pragma once

#include <cstdint>
#include <string>

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

 private:
  c10::IValue reducerObject_;
  c10::intrusive_ptr<ScriptReducer> reducer_;
  DifferenceMonitor monitor_;
  std::string kind_;
};

} // namespace torch_monitor::script
