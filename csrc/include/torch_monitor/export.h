#pragma once

// Marks the symbols that libtorch_monitor.so exports to C++ programs and to the
// Python binding.
#define TORCH_MONITOR_API __attribute__((visibility("default")))
