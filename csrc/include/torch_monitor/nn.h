#pragma once

// torch_monitor for C++ training programs: forward pre/post hooks on
// torch::nn modules, called through torch_monitor::nn::call, and monitors
// attached to module attribute paths. Separate from <torch_monitor/torch_monitor.h>
// because it needs the heavy torch::nn headers. See docs/cpp_hooks.md.
//
//   auto monitor = std::make_shared<torch_monitor::DifferenceMonitor>(
//       reducer, "fc.weight");
//   auto handle = torch_monitor::nn::attach(monitor, model, "fc.weight");
//   torch::Tensor y = torch_monitor::nn::call(model, x);

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <torch_monitor/monitors/difference_monitor.h>
#include <torch_monitor/nn/attach.h>
#include <torch_monitor/nn/attribute_path.h>
#include <torch_monitor/nn/call.h>
#include <torch_monitor/nn/forward_call.h>
#include <torch_monitor/nn/hooks.h>
#include <torch_monitor/nn/observe.h>
