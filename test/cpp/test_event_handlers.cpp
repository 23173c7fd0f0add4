// The handler registry: order, duplicates, unregistration, exceptions, and
// reentrancy (handlers that log, (un)register and read Stats).
//
// The registry is process-global: every test unregisters what it registers
// (test::ScopedHandler does it even when an assertion fails).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "test_support.h"

namespace torch_monitor {
namespace {

using namespace std::chrono_literals;
using test::FunctionHandler;
using test::Latch;
using test::RecordingHandler;
using test::ScopedHandler;
using test::ScopedRecorder;
using test::valueOf;

constexpr auto SUM = Aggregation::SUM;
constexpr auto COUNT = Aggregation::COUNT;

Event makeEvent(const std::string& name, int64_t n = 0) {
  Event e;
  e.name = name;
  e.timestamp = std::chrono::system_clock::now();
  e.data["n"] = n;
  e.data["s"] = std::string("text");
  e.data["d"] = 2.5;
  e.data["b"] = true;
  return e;
}

// Appends its id to a shared log for every event.
class OrderHandler : public EventHandler {
 public:
  OrderHandler(int id, std::vector<int>* log, std::mutex* mutex)
      : id_(id), log_(log), mutex_(mutex) {}
  void handle(const Event&) override {
    std::lock_guard<std::mutex> guard(*mutex_);
    log_->push_back(id_);
  }

 private:
  int id_;
  std::vector<int>* log_;
  std::mutex* mutex_;
};

class ThrowingHandler : public EventHandler {
 public:
  explicit ThrowingHandler(std::string message)
      : message_(std::move(message)) {}
  void handle(const Event&) override {
    ++calls;
    throw std::runtime_error(message_);
  }
  std::atomic<int> calls{0};

 private:
  std::string message_;
};

class HandlerTest : public ::testing::Test {
 protected:
  std::vector<int> log;
  std::mutex logMutex;

  std::shared_ptr<OrderHandler> order(int id) {
    return std::make_shared<OrderHandler>(id, &log, &logMutex);
  }
  // Logs one event and returns (and clears) the order log.
  std::vector<int> logAndCollect() {
    log.clear();
    logEvent(makeEvent("probe"));
    return log;
  }
};

// ---------------------------------------------------------------------------
// Event

TEST(Event, EqualityComparesNameTimestampAndData) {
  const Event a = makeEvent("e", 1);
  Event b = a;
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a != b);
  b.name = "f";
  EXPECT_NE(a, b);
  b = a;
  b.timestamp += std::chrono::microseconds(1);
  EXPECT_NE(a, b);
  b = a;
  b.data["n"] = int64_t(2);
  EXPECT_NE(a, b);
  b = a;
  b.data["n"] = 1.0; // same number, other type
  EXPECT_NE(a, b);
  b = a;
  b.data["b"] = int64_t(1); // a bool is not an int
  EXPECT_NE(a, b);
  b = a;
  b.data["extra"] = false;
  EXPECT_NE(a, b);
}

TEST(Event, EqualityComparesTheStep) {
  const Event a = makeEvent("e", 1);
  EXPECT_FALSE(a.step.has_value());
  Event b = a;
  b.step = 3;
  EXPECT_NE(a, b);
  Event c = b;
  EXPECT_EQ(b, c);
  c.step = 4;
  EXPECT_NE(b, c);
}

// The process-wide training step, and the step a Stat's event carries: the
// one current when its window closed.
TEST(Step, SetGetClearAndNegativeRejected) {
  clearStep();
  EXPECT_FALSE(getStep().has_value());
  setStep(0);
  EXPECT_EQ(getStep(), std::optional<int64_t>(0));
  setStep(std::numeric_limits<int64_t>::max());
  EXPECT_EQ(getStep(), std::numeric_limits<int64_t>::max());
  test::expectValueError([] { setStep(-1); }, {"[0, 2**63-1]", "got -1"});
  EXPECT_EQ(getStep(), std::numeric_limits<int64_t>::max()); // unchanged
  setOrClearStep(std::nullopt);
  EXPECT_FALSE(getStep().has_value());
}

TEST(Step, StatEventsCarryTheStepCurrentAtClose) {
  ScopedRecorder recorder;
  test::FakeClock clock(0);
  clearStep();
  Stat<double> stat("stepped", {SUM}, 1000ms);
  stat.add(1.0);
  clock.advance(1000);
  stat.add(2.0); // closes window 0 with no step set
  setStep(10);
  stat.add(3.0);
  setStep(19);
  clock.advance(1000);
  stat.add(4.0); // closes window 1 at step 19
  clearStep();
  const auto events = recorder->statEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_FALSE(events[0].step.has_value());
  EXPECT_EQ(events[1].step, std::optional<int64_t>(19));
  EXPECT_EQ(valueOf<double>(events[1], "stepped.sum"), 5.0);
}

TEST(Event, EpochMicrosRoundTrip) {
  for (int64_t us : {int64_t(0), int64_t(1), int64_t(-1),
                     int64_t(1700000000123456), int64_t(-86400000000),
                     int64_t(4102444800000000)}) {
    EXPECT_EQ(toEpochMicros(fromEpochMicros(us)), us) << us;
  }
  EXPECT_EQ(
      fromEpochMicros(1700000000123456).time_since_epoch(),
      std::chrono::microseconds(1700000000123456));
  // Sub-microsecond parts are dropped.
  const auto t = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(1700000000123456789)));
  EXPECT_EQ(toEpochMicros(t), 1700000000123456);
  // Agrees with the wall clock.
  const auto now = std::chrono::system_clock::now();
  EXPECT_EQ(
      toEpochMicros(now),
      std::chrono::duration_cast<std::chrono::microseconds>(
          now.time_since_epoch())
          .count());
}

// The range a system_clock time point holds; beyond it the value used to
// wrap to another century.
TEST(Event, EpochMicrosOutsideTheTimePointRangeAreRejected) {
  for (int64_t us : {kMinEpochMicros, kMaxEpochMicros}) {
    EXPECT_EQ(toEpochMicros(fromEpochMicros(us)), us) << us;
  }
  EXPECT_EQ(kMaxEpochMicros, int64_t(9223372036854775)); // 2262-04-11
  for (int64_t us : {kMinEpochMicros - 1, kMaxEpochMicros + 1,
                     int64_t(253402300800000000), // 10000-01-01
                     std::numeric_limits<int64_t>::min()}) {
    SCOPED_TRACE(us);
    test::expectValueError(
        [&] { fromEpochMicros(us); },
        {"outside the supported range", "1677-09-21", "2262-04-11"});
  }
}

// Names, keys and text values reach Python, JSON and C string APIs: logEvent
// rejects what they cannot hold before any handler sees it.
TEST(Event, LogEventRejectsInvalidUtf8AndNulBeforeAnyHandlerRuns) {
  ScopedRecorder recorder;
  const std::string nul("a\0b", 3);
  const std::string cut = std::string("\xc3\xa9").substr(0, 1); // half an "é"
  struct Case {
    std::function<void(Event&)> spoil;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[&](Event& e) { e.name = nul; }, "Event name contains a NUL byte at index 1"},
      {[&](Event& e) { e.name = cut; }, "Event name is not valid UTF-8: byte 0xC3"},
      {[&](Event& e) { e.data[nul] = 1.0; }, "Event data key contains a NUL"},
      {[&](Event& e) { e.data[cut] = true; }, "Event data key is not valid UTF-8"},
      {[&](Event& e) { e.data["k"] = nul; }, "Event data['k'] contains a NUL"},
      {[&](Event& e) { e.data["k"] = cut; }, "Event data['k'] is not valid UTF-8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    Event e = makeEvent("ok");
    c.spoil(e);
    test::expectValueError([&] { logEvent(e); }, {c.message});
    test::expectValueError([&] { checkEvent(e); }, {c.message});
  }
  EXPECT_EQ(recorder->size(), 0u);
  Event text = makeEvent("é✓𝄞");
  text.data["ключ"] = std::string("значение");
  logEvent(text);
  EXPECT_EQ(recorder->size(), 1u);
}

// logEvent reads text a word at a time (short strings as one masked word,
// long ones ending on an overlapping word): a bad byte is found at every
// place of every length around those edges, and the bytes past a string's
// end never count.
TEST(Event, LogEventFindsABadByteAtEveryPlace) {
  ScopedRecorder recorder;
  size_t delivered = 0;
  for (size_t n = 0; n <= 24; ++n) {
    SCOPED_TRACE(n);
    std::string clean(n, 'a');
    Event ok = makeEvent("n");
    ok.data[clean] = clean;
    logEvent(ok);
    EXPECT_EQ(recorder->size(), ++delivered);
    for (size_t i = 0; i < n; ++i) {
      SCOPED_TRACE(i);
      for (const char bad : {'\0', '\x80', '\xff'}) {
        std::string spoilt = clean;
        spoilt[i] = bad;
        Event e = makeEvent(spoilt);
        test::expectValueError([&] { logEvent(e); }, {"Event name"});
        Event key = makeEvent("k");
        key.data[spoilt] = 1.0;
        test::expectValueError([&] { logEvent(key); }, {"Event data key"});
      }
    }
  }
  EXPECT_EQ(recorder->size(), delivered);
}

// ---------------------------------------------------------------------------
// Registration

TEST_F(HandlerTest, LogEventWithoutHandlersIsANoOp) {
  EXPECT_NO_THROW(logEvent(makeEvent("nobody listens")));
  // And nothing was kept for a handler registered later.
  ScopedRecorder recorder;
  EXPECT_EQ(recorder->size(), 0u);
}

TEST_F(HandlerTest, HandlersReceiveTheLoggedEvent) {
  ScopedRecorder recorder;
  const Event e = makeEvent("my.event", 42);
  logEvent(e);
  const auto events = recorder->events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], e);
  EXPECT_EQ(std::get<int64_t>(events[0].data.at("n")), 42);
  EXPECT_EQ(std::get<bool>(events[0].data.at("b")), true);
  EXPECT_EQ(std::get<std::string>(events[0].data.at("s")), "text");
}

TEST_F(HandlerTest, RunInRegistrationOrder) {
  auto a = order(1), b = order(2), c = order(3);
  ScopedHandler ra(a), rb(b), rc(c);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1, 2, 3}));
}

TEST_F(HandlerTest, RunOnTheLoggingThread) {
  std::thread::id seen;
  auto h = std::make_shared<FunctionHandler>(
      [&](const Event&) { seen = std::this_thread::get_id(); });
  ScopedHandler r(h);
  std::thread::id logger;
  std::thread t([&] {
    logger = std::this_thread::get_id();
    logEvent(makeEvent("x"));
  });
  t.join();
  EXPECT_EQ(seen, logger);
}

TEST_F(HandlerTest, DuplicateRegistrationRunsTwiceAndUnregisterRemovesOne) {
  auto a = order(1), b = order(2);
  registerEventHandler(a);
  registerEventHandler(b);
  registerEventHandler(a);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1, 2, 1}));
  // Removes one registration (the most recent one, as documented).
  unregisterEventHandler(a);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1, 2}));
  unregisterEventHandler(a);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{2}));
  unregisterEventHandler(b);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{}));
}

TEST_F(HandlerTest, UnknownHandlerUnregisterIsANoOp) {
  auto a = order(1), b = order(2), stranger = order(9);
  ScopedHandler ra(a), rb(b);
  // torch.monitor removes the last registered handler here.
  unregisterEventHandler(stranger);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1, 2}));
  unregisterEventHandler(nullptr);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1, 2}));
}

TEST_F(HandlerTest, StaleUnregisterIsANoOp) {
  auto a = order(1), b = order(2), c = order(3);
  ScopedHandler rb(b);
  registerEventHandler(a);
  ScopedHandler rc(c);
  unregisterEventHandler(a);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{2, 3}));
  // `a` is stale now: unregistering it again touches nothing else.
  unregisterEventHandler(a);
  unregisterEventHandler(a);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{2, 3}));
}

TEST_F(HandlerTest, UnregisterOnAnEmptyRegistryIsANoOp) {
  // torch.monitor segfaults here. (No other test leaves handlers behind.)
  auto a = order(1);
  EXPECT_NO_THROW(unregisterEventHandler(a));
  EXPECT_NO_THROW(unregisterEventHandler(nullptr));
  EXPECT_EQ(logAndCollect(), (std::vector<int>{}));
  ScopedHandler ra(a);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1}));
}

TEST_F(HandlerTest, NullHandlerIsRejected) {
  auto a = order(1);
  ScopedHandler ra(a);
  test::expectValueError(
      [] { registerEventHandler(nullptr); }, {"registerEventHandler", "null"});
  // Nothing was added.
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1}));
}

TEST_F(HandlerTest, HandlerOutlivesTheCallersReference) {
  std::weak_ptr<RecordingHandler> weak;
  {
    auto h = std::make_shared<RecordingHandler>();
    weak = h;
    registerEventHandler(h);
  }
  auto h = weak.lock();
  ASSERT_NE(h, nullptr) << "the registry keeps its handlers alive";
  logEvent(makeEvent("kept"));
  EXPECT_EQ(h->size(), 1u);
  unregisterEventHandler(h);
  h.reset();
  EXPECT_TRUE(weak.expired()) << "unregistering releases it";
}

// ---------------------------------------------------------------------------
// Exceptions

TEST_F(HandlerTest, EveryHandlerRunsAndTheFirstExceptionPropagates) {
  auto first = std::make_shared<ThrowingHandler>("first failure");
  auto second = std::make_shared<ThrowingHandler>("second failure");
  ScopedHandler r1(order(1)), rf(first), r2(order(2)), rs(second),
      r3(order(3));
  log.clear();
  try {
    logEvent(makeEvent("boom"));
    ADD_FAILURE() << "logEvent did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "first failure");
  }
  EXPECT_EQ(log, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(first->calls.load(), 1);
  EXPECT_EQ(second->calls.load(), 1);
}

TEST_F(HandlerTest, ExceptionFromStatAddPropagatesAndTheSampleIsKept) {
  test::FakeClock clock(150);
  auto thrower = std::make_shared<ThrowingHandler>("from handler");
  ScopedRecorder recorder;
  ScopedHandler rt(thrower);
  {
    Stat<int64_t> s("x", {SUM, COUNT}, 100ms);
    s.add(3);
    clock.set(250);
    EXPECT_THROW(s.add(4), std::runtime_error);
    // The later handler still got the event of the closed window.
    auto events = recorder->statEvents();
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(valueOf<int64_t>(events[0], "x.sum"), 3);
    // The sample that triggered the close was added to the new window.
    EXPECT_EQ(s.count(), 1);
    EXPECT_EQ(s.get().at(SUM), 3);
    rt.release(); // let the destructor log cleanly
  }
  auto events = recorder->statEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(valueOf<int64_t>(events[1], "x.sum"), 4);
  EXPECT_EQ(valueOf<int64_t>(events[1], "x.count"), 1);
}

TEST_F(HandlerTest, ExceptionFromCappedStatAddPropagatesAndTheSampleIsKept) {
  test::FakeClock clock(150);
  auto thrower = std::make_shared<ThrowingHandler>("from handler");
  ScopedRecorder recorder;
  ScopedHandler rt(thrower);
  Stat<double> s("x", {SUM, COUNT}, 100ms, 2);
  s.add(1.0);
  // Reaches max_samples: closes now; the handler throws.
  EXPECT_THROW(s.add(2.0), std::runtime_error);
  auto events = recorder->statEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(valueOf<double>(events[0], "x.sum"), 3.0);
  EXPECT_EQ(s.get().at(SUM), 3.0) << "the sample is in the closed window";
  EXPECT_EQ(s.count(), 0);
  // The throw left the state machine consistent: rest of window discarded.
  EXPECT_NO_THROW(s.add(5.0));
  EXPECT_EQ(s.count(), 0);
  EXPECT_EQ(thrower->calls.load(), 1);
}

// Captures c10 warnings (TORCH_WARN) on this thread.
class WarningCollector : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    messages.push_back(warning.msg());
  }
  std::vector<std::string> messages;
};

TEST_F(HandlerTest, ThrowingHandlerDuringDestructionIsAWarning) {
  test::FakeClock clock(150);
  auto thrower = std::make_shared<ThrowingHandler>("failing in dtor");
  WarningCollector warnings;
  c10::WarningUtils::WarningHandlerGuard guard(&warnings);
  ScopedHandler rt(thrower);
  ScopedRecorder recorder;
  {
    Stat<double> s("dying.stat", {SUM}, 100ms);
    s.add(1.0);
  } // would std::terminate() if the exception escaped the destructor
  EXPECT_EQ(thrower->calls.load(), 1);
  // The handler after the throwing one still got the event.
  ASSERT_EQ(recorder->statEvents().size(), 1u);
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("dying.stat"), std::string::npos)
      << warnings.messages[0];
  EXPECT_NE(warnings.messages[0].find("failing in dtor"), std::string::npos)
      << warnings.messages[0];
}

TEST_F(HandlerTest, NonStdExceptionDuringDestructionIsAWarning) {
  auto thrower = std::make_shared<FunctionHandler>([](const Event&) {
    throw 42; // not a std::exception
  });
  WarningCollector warnings;
  c10::WarningUtils::WarningHandlerGuard guard(&warnings);
  ScopedHandler rt(thrower);
  {
    Stat<int64_t> s("odd.stat", {SUM}, 100ms);
    s.add(1);
  }
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("odd.stat"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Reentrancy: none of these may deadlock (torch.monitor deadlocks on each).
// A deadlock fails the test through its CTest timeout.

TEST_F(HandlerTest, HandlerCanLogAnotherEvent) {
  ScopedRecorder recorder;
  auto nester = std::make_shared<FunctionHandler>([](const Event& e) {
    if (e.name == "outer") {
      logEvent(makeEvent("inner"));
    }
  });
  ScopedHandler rn(nester);
  // `recorder` was registered before `nester`: it sees outer, then inner.
  logEvent(makeEvent("outer"));
  const auto events = recorder->events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].name, "outer");
  EXPECT_EQ(events[1].name, "inner");
}

TEST_F(HandlerTest, StatHandlerCanLogAnotherEvent) {
  test::FakeClock clock(110);
  ScopedRecorder recorder;
  auto nester = std::make_shared<FunctionHandler>([](const Event& e) {
    if (e.name == kStatEventName) {
      logEvent(makeEvent("derived"));
    }
  });
  ScopedHandler rn(nester);
  Stat<double> s("x", {SUM}, 100ms);
  s.add(1.0);
  clock.set(210);
  s.add(2.0);
  EXPECT_EQ(recorder->statEvents().size(), 1u);
  EXPECT_EQ(recorder->eventsNamed("derived").size(), 1u);
}

TEST_F(HandlerTest, HandlerCanRegisterAHandler) {
  auto late = order(2);
  std::atomic<int> registrations{0};
  auto registrar = std::make_shared<FunctionHandler>([&](const Event&) {
    if (registrations++ == 0) {
      registerEventHandler(late);
    }
  });
  ScopedHandler rr(registrar), r1(order(1));
  // The running log works on a snapshot: `late` misses this event...
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1}));
  // ...and gets the next one.
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1, 2}));
  unregisterEventHandler(late);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1}));
}

TEST_F(HandlerTest, HandlerCanUnregisterItself) {
  std::shared_ptr<FunctionHandler> self;
  std::atomic<int> calls{0};
  self = std::make_shared<FunctionHandler>([&](const Event&) {
    ++calls;
    unregisterEventHandler(self);
  });
  registerEventHandler(self);
  ScopedHandler r1(order(1)), r2(order(2));
  // The snapshot still runs everyone, including handlers after it.
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1, 2}));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(logAndCollect(), (std::vector<int>{1, 2}));
  EXPECT_EQ(calls.load(), 1) << "it is gone";
  self.reset(); // breaks the self-reference cycle
}

TEST_F(HandlerTest, HandlerCanUnregisterAnotherHandler) {
  auto victim = order(2);
  registerEventHandler(victim);
  auto killer = std::make_shared<FunctionHandler>(
      [&](const Event&) { unregisterEventHandler(victim); });
  ScopedHandler rk(killer);
  // The snapshot taken before the unregistration still calls `victim`.
  EXPECT_EQ(logAndCollect(), (std::vector<int>{2}));
  EXPECT_EQ(logAndCollect(), (std::vector<int>{}));
}

// A handler reads the very Stat whose event it is handling.
template <typename T>
void readSameStatFromItsEvent(int64_t maxSamples) {
  test::FakeClock clock(110);
  std::optional<Stat<T>> s;
  struct Seen {
    int calls = 0;
    std::unordered_map<Aggregation, T, AggregationHash> got;
    int64_t count = -1;
    T eventSum{};
  } seen;
  auto reader = std::make_shared<FunctionHandler>([&](const Event& e) {
    if (e.name != kStatEventName || !s.has_value()) {
      return;
    }
    ++seen.calls;
    seen.got = s->get();
    seen.count = s->count();
    seen.eventSum = valueOf<T>(e, "r.sum");
  });
  ScopedHandler rr(reader);
  s.emplace("r", std::vector<Aggregation>{SUM, COUNT}, 100ms, maxSamples);

  s->add(T(2));
  s->add(T(3));
  if (maxSamples == 3) {
    s->add(T(4)); // reaches max_samples: closes inside add
    ASSERT_EQ(seen.calls, 1);
    EXPECT_EQ(seen.eventSum, T(9));
    EXPECT_EQ(seen.got.at(SUM), T(9)) << "get() already shows the window";
    EXPECT_EQ(seen.count, 0) << "nothing open after a max_samples close";
  } else {
    clock.set(210);
    s->add(T(4)); // closes [100, 200)
    ASSERT_EQ(seen.calls, 1);
    EXPECT_EQ(seen.eventSum, T(5));
    EXPECT_EQ(seen.got.at(SUM), T(5)) << "get() already shows the window";
    EXPECT_EQ(seen.got.at(COUNT), T(2));
    // The triggering sample is added before handlers run (so that it is
    // kept even if one throws): the open window holds it.
    EXPECT_EQ(seen.count, 1);
  }
  // Still usable afterwards.
  clock.set(1000);
  s->add(T(1));
  EXPECT_EQ(s->count(), 1);
  rr.release();
}

TEST_F(HandlerTest, HandlerCanReadTheSameStatDouble) {
  readSameStatFromItsEvent<double>(Stat<double>::kUnlimitedSamples);
}
TEST_F(HandlerTest, HandlerCanReadTheSameStatInt) {
  readSameStatFromItsEvent<int64_t>(Stat<int64_t>::kUnlimitedSamples);
}
TEST_F(HandlerTest, HandlerCanReadTheSameCappedStatDouble) {
  readSameStatFromItsEvent<double>(3);
}
TEST_F(HandlerTest, HandlerCanReadTheSameCappedStatInt) {
  readSameStatFromItsEvent<int64_t>(3);
}

// A handler adds to the stat whose event it handles.
TEST_F(HandlerTest, HandlerCanAddToTheSameStat) {
  for (int64_t maxSamples : {Stat<int64_t>::kUnlimitedSamples, int64_t(2)}) {
    SCOPED_TRACE("max_samples " + std::to_string(maxSamples));
    test::FakeClock clock(110);
    ScopedRecorder recorder;
    std::optional<Stat<int64_t>> s;
    std::atomic<int> calls{0};
    auto adder = std::make_shared<FunctionHandler>([&](const Event& e) {
      if (e.name == kStatEventName && calls++ == 0) {
        s->add(100);
      }
    });
    ScopedHandler ra(adder);
    s.emplace("a", std::vector<Aggregation>{SUM, COUNT}, 100ms, maxSamples);
    s->add(1);
    clock.set(210);
    // Closes [100, 200) = {1}; the handler then adds 100 to [200, 300),
    // which already holds 2 (the triggering sample is added before handlers
    // run). Capped: that reentrant add reaches max_samples and closes
    // [200, 300) from inside the handler.
    s->add(2);
    ra.release();
    s.reset(); // unlimited: emits [200, 300); capped: nothing left
    const auto events = recorder->statEvents();
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(valueOf<int64_t>(events[0], "a.sum"), 1);
    EXPECT_EQ(valueOf<int64_t>(events[1], "a.sum"), 2 + 100)
        << "the reentrant sample is kept";
    EXPECT_EQ(valueOf<int64_t>(events[1], "a.count"), 2);
    // Capped, the second event came from inside the handler (still
    // registered); unlimited, from the destructor after release().
    EXPECT_EQ(calls.load(), maxSamples == 2 ? 2 : 1);
  }
}

// Logging from several threads while handlers come and go: the permanent
// handler sees every event exactly once.
TEST_F(HandlerTest, ConcurrentLogAndRegistration) {
  ScopedRecorder permanent;
  constexpr int kThreads = 4;
  constexpr int kEvents = 5000;
  std::atomic<bool> stop{false};
  std::vector<std::thread> loggers;
  for (int t = 0; t < kThreads; ++t) {
    loggers.emplace_back([t] {
      for (int i = 0; i < kEvents; ++i) {
        logEvent(makeEvent("concurrent", t * kEvents + i));
      }
    });
  }
  std::thread churner([&] {
    while (!stop.load()) {
      auto h = std::make_shared<RecordingHandler>();
      registerEventHandler(h);
      registerEventHandler(h);
      unregisterEventHandler(h);
      unregisterEventHandler(h);
    }
  });
  for (auto& t : loggers) {
    t.join();
  }
  stop = true;
  churner.join();
  const auto events = permanent->eventsNamed("concurrent");
  ASSERT_EQ(events.size(), size_t(kThreads * kEvents));
  std::vector<bool> seen(kThreads * kEvents, false);
  for (const Event& e : events) {
    const int64_t n = std::get<int64_t>(e.data.at("n"));
    ASSERT_GE(n, 0);
    ASSERT_LT(n, kThreads * kEvents);
    EXPECT_FALSE(seen[n]) << "event " << n << " delivered twice";
    seen[n] = true;
  }
}

// ---------------------------------------------------------------------------
// The lock-free read path: a logEvent marks the list it calls; an edit keeps
// a replaced list while marked, and the last reader releases it.

// A handler that blocks until told to go on, to hold a logEvent in progress.
class GateHandler : public EventHandler {
 public:
  void handle(const Event& e) override {
    if (e.name != "gated") {
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    entered_ = true;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
  }
  void waitUntilEntered() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return entered_; });
  }
  void open() {
    std::lock_guard<std::mutex> guard(mutex_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool entered_ = false;
  bool open_ = false;
};

TEST_F(HandlerTest, ReplacedListIsReleasedByItsLastReader) {
  auto gate = std::make_shared<GateHandler>();
  ScopedHandler rg(gate);
  std::weak_ptr<RecordingHandler> weak;
  {
    auto victim = std::make_shared<RecordingHandler>();
    weak = victim;
    registerEventHandler(victim);
  }
  std::thread reader([] { logEvent(makeEvent("gated")); });
  gate->waitUntilEntered();
  // The reader is inside the list that holds the victim.
  unregisterEventHandler(weak.lock());
  EXPECT_FALSE(weak.expired()) << "released while a logEvent still calls it";
  gate->open();
  reader.join();
  // The reader called the victim (its list predates the unregistration),
  // then released the list on its way out: nothing else holds the victim.
  EXPECT_TRUE(weak.expired()) << "the replaced list outlived its last reader";
}

TEST_F(HandlerTest, UnregisteredHandlerIsNotCalledByALaterLogOnAnotherThread) {
  auto h = std::make_shared<RecordingHandler>();
  registerEventHandler(h);
  std::mutex m;
  std::condition_variable cv;
  int phase = 0; // 1: logged once; 2: unregistered
  std::thread logger([&] {
    logEvent(makeEvent("before"));
    {
      std::unique_lock<std::mutex> lock(m);
      phase = 1;
      cv.notify_all();
      cv.wait(lock, [&] { return phase == 2; });
    }
    logEvent(makeEvent("after"));
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return phase == 1; });
  }
  unregisterEventHandler(h);
  {
    std::lock_guard<std::mutex> guard(m);
    phase = 2;
    cv.notify_all();
  }
  logger.join();
  EXPECT_EQ(h->eventsNamed("before").size(), 1u);
  EXPECT_EQ(h->eventsNamed("after").size(), 0u);
}

// Deeper than the per-thread marks go: the deepest calls take the fallback.
TEST_F(HandlerTest, DeeplyNestedLogsReachEveryHandler) {
  constexpr int kDepth = 12;
  std::atomic<int> calls{0};
  auto nester = std::make_shared<FunctionHandler>([&](const Event& e) {
    ++calls;
    const int64_t n = std::get<int64_t>(e.data.at("n"));
    if (n + 1 < kDepth) {
      logEvent(makeEvent("nested", n + 1));
    }
  });
  ScopedRecorder recorder;
  ScopedHandler rn(nester);
  logEvent(makeEvent("nested", 0));
  EXPECT_EQ(calls.load(), kDepth);
  EXPECT_EQ(recorder->eventsNamed("nested").size(), size_t(kDepth));
  // Every mark was cleared: an unregistration releases the handler at once.
  std::weak_ptr<FunctionHandler> weak = nester;
  rn.release();
  nester.reset();
  EXPECT_TRUE(weak.expired());
}

// More live logging threads than thread slots: the surplus takes the
// fallback path; every event still reaches the handler once.
TEST_F(HandlerTest, ThreadsBeyondTheSlotsStillLog) {
  constexpr int kThreads = detail::kMaxThreadSlots + 8;
  ScopedRecorder recorder;
  Latch allStarted(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      logEvent(makeEvent("slot", t)); // takes a slot while all are alive
      allStarted.arriveAndWait();
      logEvent(makeEvent("slot", kThreads + t));
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  const auto events = recorder->eventsNamed("slot");
  ASSERT_EQ(events.size(), size_t(2 * kThreads));
  std::vector<bool> seen(2 * kThreads, false);
  for (const Event& e : events) {
    const int64_t n = std::get<int64_t>(e.data.at("n"));
    ASSERT_FALSE(seen.at(n)) << "event " << n << " delivered twice";
    seen[n] = true;
  }
}

// Handlers come and go while threads log: afterwards nothing but the
// registry's current list is kept, so every churned handler is released.
TEST_F(HandlerTest, NoReplacedListOutlivesConcurrentReaders) {
  ScopedRecorder permanent;
  constexpr int kLoggers = 3;
  constexpr int kEvents = 20000;
  std::vector<std::weak_ptr<RecordingHandler>> churned;
  std::atomic<bool> stop{false};
  std::vector<std::thread> loggers;
  for (int t = 0; t < kLoggers; ++t) {
    loggers.emplace_back([t] {
      for (int i = 0; i < kEvents; ++i) {
        logEvent(makeEvent("churn", t * kEvents + i));
      }
    });
  }
  std::thread churner([&] {
    while (!stop.load()) {
      auto h = std::make_shared<RecordingHandler>();
      churned.push_back(h);
      registerEventHandler(h);
      unregisterEventHandler(h);
    }
  });
  for (auto& t : loggers) {
    t.join();
  }
  stop = true;
  churner.join();
  EXPECT_EQ(
      permanent->eventsNamed("churn").size(), size_t(kLoggers * kEvents));
  ASSERT_FALSE(churned.empty());
  size_t alive = 0;
  for (const auto& weak : churned) {
    alive += !weak.expired();
  }
  EXPECT_EQ(alive, 0u) << "of " << churned.size() << " churned handlers";
}

} // namespace
} // namespace torch_monitor
