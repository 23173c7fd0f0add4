#pragma once

// The event sinks: TensorBoard event files, JSON Lines files, console lines,
// an in-memory ring buffer, and Prometheus (a /metrics endpoint or a .prom
// file). Each is an EventHandler (register it with
// registerEventHandler or sink->registerSelf()). See docs/sinks.md.
#include <torch_monitor/sinks/console_handler.h>
#include <torch_monitor/sinks/json_lines_writer.h>
#include <torch_monitor/sinks/memory_handler.h>
#include <torch_monitor/sinks/prometheus_exporter.h>
#include <torch_monitor/sinks/prometheus_text_file.h>
#include <torch_monitor/sinks/sink.h>
#include <torch_monitor/sinks/tensorboard_writer.h>
