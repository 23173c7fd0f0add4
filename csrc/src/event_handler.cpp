#include <torch_monitor/event_handler.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <vector>

#include <pthread.h>

#include <c10/util/Exception.h>

#include <torch_monitor/detail/text.h>

namespace torch_monitor {
namespace {

using HandlerList = std::vector<std::shared_ptr<EventHandler>>;

// Copy-on-write: logEvent takes a snapshot under the lock and calls handlers
// after releasing it, so handlers may re-enter the registry freely.
struct Registry {
  std::mutex mutex;
  std::shared_ptr<const HandlerList> handlers =
      std::make_shared<const HandlerList>();
  std::atomic<bool> empty{true};
};

// Never destroyed: Stats destroyed during static destruction still log.
Registry& registry() {
  static Registry* instance = [] {
    auto* r = new Registry();
    // A thread that logs or (un)registers during fork() would leave the
    // child a locked mutex and no thread to unlock it; holding it across
    // fork() means the child inherits it unlocked by its own thread.
    pthread_atfork(
        [] { registry().mutex.lock(); },
        [] { registry().mutex.unlock(); },
        [] { registry().mutex.unlock(); });
    return r;
  }();
  return *instance;
}

template <typename Edit>
void editHandlers(Edit edit) {
  Registry& r = registry();
  std::shared_ptr<const HandlerList> old;
  {
    std::lock_guard<std::mutex> guard(r.mutex);
    auto next = std::make_shared<HandlerList>(*r.handlers);
    edit(*next);
    r.empty.store(next->empty(), std::memory_order_release);
    old = std::exchange(r.handlers, std::move(next));
  }
  // `old` (and maybe a handler) is released here, outside the lock.
}

} // namespace

EventHandler::~EventHandler() = default;

void checkEvent(const Event& event) {
  detail::checkText(event.name, "Event name");
  for (const auto& [key, value] : event.data) {
    detail::checkText(key, "Event data key");
    const auto* text = std::get_if<std::string>(&value);
    if (text != nullptr && !detail::isValidText(*text)) {
      detail::checkText(*text, "Event data['" + key + "']");
    }
  }
}

void logEvent(const Event& event) {
  checkEvent(event);
  detail::dispatchEvent(event);
}

void detail::dispatchEvent(const Event& event) {
  Registry& r = registry();
  if (r.empty.load(std::memory_order_acquire)) {
    return;
  }
  std::shared_ptr<const HandlerList> snapshot;
  {
    std::lock_guard<std::mutex> guard(r.mutex);
    snapshot = r.handlers;
  }
  std::exception_ptr first;
  for (const auto& handler : *snapshot) {
    try {
      handler->handle(event);
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

void registerEventHandler(std::shared_ptr<EventHandler> handler) {
  TORCH_CHECK_VALUE(
      handler != nullptr, "registerEventHandler: the handler is null");
  editHandlers([&](HandlerList& list) { list.push_back(std::move(handler)); });
}

void unregisterEventHandler(const std::shared_ptr<EventHandler>& handler) {
  editHandlers([&](HandlerList& list) {
    auto it = std::find(list.rbegin(), list.rend(), handler);
    if (it != list.rend()) {
      list.erase(std::next(it).base());
    }
  });
}

} // namespace torch_monitor
