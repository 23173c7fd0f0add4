#pragma once

// The whole C++ API of torch_monitor: Stat, Event, event handlers.
#include <torch_monitor/aggregation.h>
#include <torch_monitor/clock.h>
#include <torch_monitor/event.h>
#include <torch_monitor/event_handler.h>
#include <torch_monitor/stat.h>
