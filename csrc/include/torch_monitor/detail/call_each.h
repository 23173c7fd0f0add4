#pragma once

#include <exception>

namespace torch_monitor::detail {

// Calls f(item) for every item of `items`, also after one throws, then
// rethrows the first exception: the rule of every fan-out of the library
// (handlers, step listeners, closed windows), so that one failing consumer
// never keeps the others from their event. (logEvent's own loop over the
// handlers, a measured hot path, is the same rule written without the
// exception_ptr: event_handler.cpp.)
// Thread safety: as f and the range.
template <typename Range, typename F>
void callEach(const Range& items, const F& f) {
  std::exception_ptr first;
  for (const auto& item : items) {
    try {
      f(item);
    } catch (...) {
      if (!first) {
        first = std::current_exception();
      }
    }
  }
  if (first) {
    std::rethrow_exception(first);
  }
}

} // namespace torch_monitor::detail
