#include <torch_monitor/reducers/reducer.h>

namespace torch_monitor {
Reducer::~Reducer() = default;

bool Reducer::forwardInto(
    const at::Tensor& /*like*/,
    const std::function<void(at::Tensor& row)>& /*write*/) {
  return false;
}
} // namespace torch_monitor
