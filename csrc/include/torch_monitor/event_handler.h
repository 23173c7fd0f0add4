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
// if an earlier one throws; the first exception is then rethrown. Throws
// c10::ValueError, before any handler runs, for an event checkEvent rejects
// (checked only when a handler is registered: an event nobody receives is
// not inspected).
// Thread safety: callable from any thread, concurrently with (un)registration
// and with fork() (the registry's lock is reset in the child).
TORCH_MONITOR_API void logEvent(const Event& event);

// Throws c10::ValueError naming the field unless the event's name, data keys
// and text values are valid UTF-8 without NUL bytes: every handler may hand
// them to Python, JSON or C string APIs.
TORCH_MONITOR_API void checkEvent(const Event& event);

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

namespace detail {
// logEvent without checkEvent, for events whose text is already known to be
// valid: a Stat's own events (its name is checked once, at construction) and
// events built through the Python and TorchScript APIs, which check every
// string as it is set.
TORCH_MONITOR_API void dispatchEvent(const Event& event);
} // namespace detail

} // namespace torch_monitor
