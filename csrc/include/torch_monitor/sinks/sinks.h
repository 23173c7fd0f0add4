#pragma once

// The event sinks: TensorBoard event files, JSON Lines files, console lines
// and an in-memory ring buffer. Each is an EventHandler (register it with
// registerEventHandler or sink->registerSelf()). See docs/sinks.md.
#include <torch_monitor/sinks/console_handler.h>
#include <torch_monitor/sinks/json_lines_writer.h>
#include <torch_monitor/sinks/memory_handler.h>
#include <torch_monitor/sinks/sink.h>
#include <torch_monitor/sinks/tensorboard_writer.h>
