#pragma once

#include <memory>

#include <torch_monitor/event.h>
#include <torch_monitor/export.h>

namespace torch_monitor {

// Receives every logged event. Implementations may be called from any thread
// that logs, concurrently, so handle() must be thread-safe itself.
// Thread safety: the registry never calls handle() while holding a lock, so a
// handler may log events, (un)register handlers and read Stats.
class TORCH_MONITOR_API EventHandler {
 public:
  virtual ~EventHandler();
  virtual void handle(const Event& event) = 0;
};

// Calls every registered handler, synchronously on the calling thread, in
// registration order, on a snapshot of the registry. Every handler runs even
// if an earlier one throws; the first exception is then rethrown.
// Thread safety: callable from any thread, concurrently with (un)registration.
TORCH_MONITOR_API void logEvent(const Event& event);

// True when at least one handler is registered, so a caller can skip
// building an event that nobody would receive. A registration racing with
// the call may or may not be seen.
TORCH_MONITOR_API bool hasEventHandlers() noexcept;

// Adds a handler; registering the same handler twice makes it run twice.
TORCH_MONITOR_API void registerEventHandler(
    std::shared_ptr<EventHandler> handler);

// Removes the most recent registration of this handler; an unknown handler
// is a no-op.
TORCH_MONITOR_API void unregisterEventHandler(
    const std::shared_ptr<EventHandler>& handler);

} // namespace torch_monitor
