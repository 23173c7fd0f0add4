#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>

namespace torch_monitor::detail {

// Whether our own buffer `t` may be written in place here. A tensor made
// inside torch.inference_mode() is an inference tensor, which torch lets
// nobody update in place outside that mode; a model evaluated under
// inference_mode and then trained leaves such buffers behind.
inline bool writableInPlace(const at::Tensor& t) {
  return !t.is_inference() || c10::InferenceMode::is_enabled();
}

} // namespace torch_monitor::detail
