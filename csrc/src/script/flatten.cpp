#include <torch_monitor/script/flatten.h>

namespace torch_monitor::script {

c10::IValue flattenConfig(Config config) {
  std::vector<c10::IValue> items;
  items.reserve(config.size());
  for (auto& [key, value] : config) {
    items.emplace_back(
        c10::ivalue::Tuple::create(c10::IValue(key), std::move(value)));
  }
  return c10::ivalue::Tuple::create(std::move(items));
}

} // namespace torch_monitor::script
