#include <torch_monitor/nn/forward_call.h>

#include <c10/util/Type.h>

namespace torch_monitor::nn::detail {

std::string typeName(const std::type_info& type) {
  return c10::demangle(type.name());
}

} // namespace torch_monitor::nn::detail
