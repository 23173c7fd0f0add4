#pragma once

// Shared helpers of the C++ tests: a recording EventHandler, RAII guards for
// the process-global handler registry and the fake monotonic clock, a latch,
// a temporary directory, and helpers to read event values, check
// c10::ValueError messages and judge a forked child's exit.

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <sys/wait.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <torch_monitor/torch_monitor.h>

namespace torch_monitor::test {

// Every aggregation, in enum order.
inline const std::vector<Aggregation> kAllAggregations = {
    Aggregation::VALUE,
    Aggregation::MEAN,
    Aggregation::COUNT,
    Aggregation::SUM,
    Aggregation::MAX,
    Aggregation::MIN};

// Whether this build runs under a sanitizer whose runtime cannot start a
// thread in a child forked from a multi-threaded process (GCC 12's ASan and
// TSan: the child hangs or dies inside the runtime's thread registry). Fork
// tests whose children start threads skip themselves there; the plain build
// of the same tests runs them in every test command.
inline bool sanitizerForbidsThreadsAfterFork() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#else
  return false;
#endif
}

// Records every event it receives. Thread-safe: handlers run on whichever
// thread logs.
class RecordingHandler : public EventHandler {
 public:
  void handle(const Event& event) override {
    std::lock_guard<std::mutex> guard(mutex_);
    events_.push_back(event);
  }

  std::vector<Event> events() const {
    std::lock_guard<std::mutex> guard(mutex_);
    return events_;
  }
  // Only the events named `name` (e.g. kStatEventName).
  std::vector<Event> eventsNamed(const std::string& name) const {
    std::lock_guard<std::mutex> guard(mutex_);
    std::vector<Event> out;
    for (const Event& e : events_) {
      if (e.name == name) {
        out.push_back(e);
      }
    }
    return out;
  }
  std::vector<Event> statEvents() const {
    return eventsNamed(kStatEventName);
  }
  size_t size() const {
    std::lock_guard<std::mutex> guard(mutex_);
    return events_.size();
  }
  void clear() {
    std::lock_guard<std::mutex> guard(mutex_);
    events_.clear();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Event> events_;
};

// Runs a callable for each event (for handlers that do something unusual).
class FunctionHandler : public EventHandler {
 public:
  explicit FunctionHandler(std::function<void(const Event&)> fn)
      : fn_(std::move(fn)) {}
  void handle(const Event& event) override {
    fn_(event);
  }

 private:
  std::function<void(const Event&)> fn_;
};

// Registers a handler for the guard's lifetime. The registry is
// process-global: every test must leave it as it found it, also when an
// assertion fails half-way.
class ScopedHandler {
 public:
  explicit ScopedHandler(std::shared_ptr<EventHandler> handler)
      : handler_(std::move(handler)) {
    registerEventHandler(handler_);
  }
  ~ScopedHandler() {
    if (handler_ != nullptr) {
      unregisterEventHandler(handler_);
    }
  }
  ScopedHandler(const ScopedHandler&) = delete;
  ScopedHandler& operator=(const ScopedHandler&) = delete;

  // Unregisters now (the destructor then does nothing).
  void release() {
    if (handler_ != nullptr) {
      unregisterEventHandler(handler_);
      handler_.reset();
    }
  }

 private:
  std::shared_ptr<EventHandler> handler_;
};

// A recording handler registered for the scope.
struct ScopedRecorder {
  std::shared_ptr<RecordingHandler> handler =
      std::make_shared<RecordingHandler>();
  ScopedHandler registration{handler};

  RecordingHandler* operator->() const {
    return handler.get();
  }
};

// Replaces the monotonic clock of every Stat by a fake one for the scope.
class FakeClock {
 public:
  explicit FakeClock(int64_t ms = 0) : now_(ms) {
    test_hooks::setFakeMonotonicMs(ms);
  }
  ~FakeClock() {
    test_hooks::clearFakeMonotonicClock();
  }
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  void set(int64_t ms) {
    now_ = ms;
    test_hooks::setFakeMonotonicMs(ms);
  }
  void advance(int64_t ms) {
    set(now_ + ms);
  }
  int64_t now() const {
    return now_;
  }

 private:
  int64_t now_;
};

// One-shot countdown latch (C++17 has no std::latch).
class Latch {
 public:
  explicit Latch(int64_t count) : count_(count) {}
  void countDown() {
    std::lock_guard<std::mutex> guard(mutex_);
    if (--count_ <= 0) {
      cv_.notify_all();
    }
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return count_ <= 0; });
  }
  void arriveAndWait() {
    countDown();
    wait();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int64_t count_;
};

// The value of `key` in `event`, which must hold a T (double or int64_t).
template <typename T>
T valueOf(const Event& event, const std::string& key) {
  const auto it = event.data.find(key);
  if (it == event.data.end()) {
    ADD_FAILURE() << "event '" << event.name << "' has no key '" << key << "'";
    return T();
  }
  if (!std::holds_alternative<T>(it->second)) {
    ADD_FAILURE() << "key '" << key << "' holds variant alternative "
                  << it->second.index() << ", not the expected type";
    return T();
  }
  return std::get<T>(it->second);
}

// The sorted keys of an event.
inline std::vector<std::string> keysOf(const Event& event) {
  std::vector<std::string> keys;
  for (const auto& kv : event.data) {
    keys.push_back(kv.first);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

// Runs `fn`, expects a c10::ValueError whose message contains every one of
// `fragments`.
inline void expectValueError(
    const std::function<void()>& fn,
    std::initializer_list<std::string> fragments) {
  try {
    fn();
  } catch (const c10::ValueError& e) {
    const std::string msg = e.what_without_backtrace();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(msg.find(fragment), std::string::npos)
          << "ValueError message '" << msg << "' lacks '" << fragment << "'";
    }
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected c10::ValueError, got another exception: "
                  << e.what();
    return;
  }
  ADD_FAILURE() << "expected c10::ValueError, nothing was thrown";
}

// A fresh directory under the system temp dir, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "tm_test_XXXXXX").string();
    TORCH_INTERNAL_ASSERT(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const {
    return path_;
  }
  std::string operator/(const std::string& name) const {
    return (path_ / name).string();
  }

 private:
  std::filesystem::path path_;
};

// Waits for the forked child `pid` and fails the test (naming `label`)
// unless it exited with status 0.
inline void expectChildExitedCleanly(pid_t pid, const std::string& label) {
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << label << ": child "
      << (WIFSIGNALED(status) ? "killed by signal " : "exited with ")
      << (WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

} // namespace torch_monitor::test
