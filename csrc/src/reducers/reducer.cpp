#include <torch_monitor/reducers/reducer.h>

namespace torch_monitor {
Reducer::~Reducer() = default;
} // namespace torch_monitor
