#pragma once

// The C++ API of torch_monitor: Stat, Event, event handlers, sinks, reducers
// and the DifferenceMonitor. Hooks on torch::nn modules are in
// <torch_monitor/nn.h> (heavier: it needs the torch::nn headers).
#include <torch_monitor/aggregation.h>
#include <torch_monitor/background_warnings.h>
#include <torch_monitor/clock.h>
#include <torch_monitor/event.h>
#include <torch_monitor/event_handler.h>
#include <torch_monitor/process_rank.h>
#include <torch_monitor/pytorch_counters.h>
#include <torch_monitor/rank_sync.h>
#include <torch_monitor/stat.h>
#include <torch_monitor/step.h>
#include <torch_monitor/version.h>
#include <torch_monitor/wait_counter.h>
// Sinks: standard-library headers only (their internals are out of line).
#include <torch_monitor/sinks/sinks.h>
// Reducers and monitors: need only <ATen/core/Tensor.h>-level headers.
#include <torch_monitor/monitors/difference_monitor.h>
#include <torch_monitor/reducers/reducers.h>
#include <torch_monitor/watch/watch.h>
