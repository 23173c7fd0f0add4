#include <torch_monitor/event_handler.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include <torch_monitor/detail/lifecycle.h>
#include <torch_monitor/detail/text.h>
#include <torch_monitor/detail/thread_slots.h>

namespace torch_monitor {
namespace {

using HandlerList = std::vector<std::shared_ptr<EventHandler>>;

// Copy-on-write: an edit publishes a new list; logEvent calls the handlers of
// the list it found, outside every lock, so handlers may re-enter the
// registry freely.
//
// logEvent does no atomic read-modify-write (torch::monitor's takes a mutex;
// copying a shared_ptr to the list would cost two atomic increments): a
// reader marks the list it is calling in a per-thread slot, re-checks that it
// is still the published one, and clears the mark when done. An edit keeps
// every replaced list that some mark names ("retired") and releases the
// others; the last reader of a retired list releases it on its way out. Mark
// and re-check on one side, publish and scan on the other, are the
// asymmetric Dekker handshake of Stat::add (detail/thread_slots.h): a
// compiler barrier for the reader, membarrier(2) for the editor.
//
// Nesting levels per thread on that path (a handler that logs uses the next
// level); deeper calls, and threads without a slot, copy a reference to the
// list under the lock instead.
constexpr int kMaxNesting = 4;

// Written only by the thread owning the slot; a cache line per slot.
struct alignas(64) ReaderMarks {
  std::atomic<const HandlerList*> reading[kMaxNesting] = {};
};

struct Registry {
  std::mutex mutex; // serialises edits and guards `current` and `retired`
  std::shared_ptr<const HandlerList> current =
      std::make_shared<const HandlerList>();
  std::atomic<const HandlerList*> published{current.get()};
  std::atomic<bool> empty{true};
  std::vector<std::shared_ptr<const HandlerList>> retired;
  ReaderMarks readers[detail::kMaxThreadSlots];
};

// Never destroyed: Stats destroyed during static destruction still log.
Registry& registry() {
  static Registry* instance = [] {
    auto* r = new Registry();
    // A thread that logs or (un)registers during fork() would leave the
    // child a locked mutex and no thread to unlock it; holding it across
    // fork() means the child inherits it unlocked by its own thread.
    static constexpr detail::ForkHooks kHooks{
        [] { registry().mutex.lock(); },
        [] { registry().mutex.unlock(); },
        [] { registry().mutex.unlock(); }};
    detail::onFork(detail::ForkStage::kEventHandlers, kHooks);
    return r;
  }();
  return *instance;
}

// Built when the library loads: else the first event of a program that never
// registers a handler may reach registry() on the window timer's thread, and
// a fork() (a DataLoader worker) while that thread is inside the lazy
// initialisation would leave every logEvent of the child blocked on its guard
// (the same hazard as backgroundWarningHandler()'s).
const bool kRegistryBuiltAtLoad = (registry(), true);

// Moves out the retired lists that no reader marks (callers hold the mutex;
// the caller releases them after unlocking, since releasing a handler may run
// arbitrary code).
std::vector<std::shared_ptr<const HandlerList>> takeUnmarkedLocked(
    Registry& r) {
  std::vector<std::shared_ptr<const HandlerList>> out;
  if (r.retired.empty()) {
    return out;
  }
  std::vector<const HandlerList*> marked;
  for (const ReaderMarks& marks : r.readers) {
    for (const auto& mark : marks.reading) {
      if (const HandlerList* list = mark.load(std::memory_order_acquire)) {
        marked.push_back(list);
      }
    }
  }
  auto unmarked = std::stable_partition(
      r.retired.begin(), r.retired.end(), [&](const auto& list) {
        return std::find(marked.begin(), marked.end(), list.get()) !=
            marked.end();
      });
  out.assign(
      std::make_move_iterator(unmarked),
      std::make_move_iterator(r.retired.end()));
  r.retired.erase(unmarked, r.retired.end());
  return out;
}

template <typename Edit>
void editHandlers(Edit edit) {
  detail::ensureAsymmetricBarrier();
  Registry& r = registry();
  std::vector<std::shared_ptr<const HandlerList>> released;
  {
    std::lock_guard<std::mutex> guard(r.mutex);
    auto next = std::make_shared<HandlerList>(*r.current);
    edit(*next);
    r.published.store(next.get(), std::memory_order_release);
    r.empty.store(next->empty(), std::memory_order_release);
    r.retired.push_back(std::exchange(r.current, std::move(next)));
    // From here on, a reader either has its mark on a replaced list visible
    // to the scan, or finds the new list when it re-checks.
    detail::heavyBarrier();
    released = takeUnmarkedLocked(r);
  }
  // Replaced lists (and maybe handlers) are released here, outside the lock.
}

// Calls every handler of `list`. When one throws, the others still run and
// the first exception is rethrown after them; the usual case, where none
// throws, is a plain loop (no exception_ptr to make, test or destroy).
__attribute__((always_inline)) inline void callHandlers(
    const HandlerList& list,
    const Event& event) {
  for (size_t i = 0; i < list.size(); ++i) {
    try {
      list[i]->handle(event);
    } catch (...) {
      const std::exception_ptr first = std::current_exception();
      for (size_t j = i + 1; j < list.size(); ++j) {
        try {
          list[j]->handle(event);
        } catch (...) {
        }
      }
      std::rethrow_exception(first);
    }
  }
}

// The free mark of the calling thread, or nullptr (no slot, or too deep).
std::atomic<const HandlerList*>* freeMark(Registry& r) {
  const int slot = detail::threadSlot();
  if (slot == detail::kOverflowSlot) {
    return nullptr;
  }
  for (auto& mark : r.readers[slot].reading) {
    if (mark.load(std::memory_order_relaxed) == nullptr) {
      return &mark;
    }
  }
  return nullptr;
}

void logWithReference(Registry& r, const Event& event) {
  std::shared_ptr<const HandlerList> snapshot;
  {
    std::lock_guard<std::mutex> guard(r.mutex);
    snapshot = r.current;
  }
  callHandlers(*snapshot, event);
}

// A reader's mark on the list it calls, cleared when logEvent leaves,
// returning or unwinding from a handler's exception.
class MarkedList {
 public:
  MarkedList(Registry& r, std::atomic<const HandlerList*>& mark)
      : registry_(r), mark_(mark) {
    list_ = r.published.load(std::memory_order_acquire);
    for (;;) {
      mark_.store(list_, std::memory_order_release);
      detail::lightBarrier();
      const HandlerList* again = r.published.load(std::memory_order_acquire);
      if (again == list_) {
        break;
      }
      list_ = again;
    }
  }
  MarkedList(const MarkedList&) = delete;
  MarkedList& operator=(const MarkedList&) = delete;
  ~MarkedList() {
    mark_.store(nullptr, std::memory_order_release);
    detail::lightBarrier();
    if (__builtin_expect(
            list_ != registry_.published.load(std::memory_order_relaxed), 0)) {
      // The list was replaced meanwhile; an edit may have kept it for us.
      std::vector<std::shared_ptr<const HandlerList>> released;
      std::lock_guard<std::mutex> guard(registry_.mutex);
      released = takeUnmarkedLocked(registry_);
    }
  }
  const HandlerList& list() const noexcept {
    return *list_;
  }

 private:
  Registry& registry_;
  std::atomic<const HandlerList*>& mark_;
  const HandlerList* list_;
};

// Whether `text` is ASCII without NUL, as names and keys nearly always
// are: valid, and settled inline in a few instructions, 8 bytes a step. A string
// shorter than a word is read as one word with the bytes past its end
// replaced: its buffer holds at least 8 bytes whenever capacity() >= 7
// (libstdc++ keeps up to 15 characters inside the string); a longer one
// ends with a word that overlaps the last full one.
__attribute__((always_inline)) inline bool asciiString(
    const std::string& text) noexcept {
  const char* p = text.data();
  const size_t n = text.size();
  if (n < 8) {
    if (text.capacity() < 7) {
      return detail::isValidText(text);
    }
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));
    const uint64_t keep = n == 0 ? 0 : ~uint64_t(0) >> (64 - 8 * n);
    return detail::plainAsciiWord(
        (word & keep) | (0x0101010101010101ULL & ~keep));
  }
  bool plain = detail::plainAscii8(p + n - 8);
  for (size_t i = 0; i + 8 < n; i += 8) {
    plain = plain && detail::plainAscii8(p + i);
  }
  return plain;
}

// Whether `text` is valid: ASCII settles it inline, the rest takes the
// full UTF-8 check.
__attribute__((always_inline)) inline bool validText(
    const std::string& text) noexcept {
  return asciiString(text) || detail::isValidText(text);
}

// Whether every string of the event is valid text: the common case, tested
// without building any error context. logEvent runs it on every event it
// delivers, so ASCII text costs a few instructions per string.
__attribute__((always_inline)) inline bool textIsValid(
    const Event& event) noexcept {
  if (!validText(event.name)) {
    return false;
  }
  for (const auto& [key, value] : event.data) {
    const auto* text = std::get_if<std::string>(&value);
    if (!validText(key) || (text != nullptr && !validText(*text))) {
      return false;
    }
  }
  return true;
}

// logEvent once a handler is registered (kCheck: with the event's text
// checked first); apart, so that the check for none stays a few
// instructions.
template <bool kCheck>
__attribute__((noinline)) void logToHandlers(Registry& r, const Event& event) {
  if (kCheck && __builtin_expect(!textIsValid(event), 0)) {
    checkEvent(event); // throws, naming the field
  }
  std::atomic<const HandlerList*>* mark = freeMark(r);
  if (__builtin_expect(mark == nullptr, 0)) {
    logWithReference(r, event);
    return;
  }
  const MarkedList marked(r, *mark);
  callHandlers(marked.list(), event);
}

} // namespace

EventHandler::~EventHandler() = default;

void checkEvent(const Event& event) {
  if (textIsValid(event)) {
    return;
  }
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
  // An event no handler receives goes nowhere, so its text is only checked
  // on its way to one: with no handler, logEvent stays a few instructions.
  Registry& r = registry();
  if (!r.empty.load(std::memory_order_acquire)) {
    logToHandlers</*kCheck=*/true>(r, event);
  }
}

void detail::dispatchEvent(const Event& event) {
  Registry& r = registry();
  if (!r.empty.load(std::memory_order_acquire)) {
    logToHandlers</*kCheck=*/false>(r, event);
  }
}

bool hasEventHandlers() noexcept {
  return !registry().empty.load(std::memory_order_acquire);
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
