#include <torch_monitor/rank_sync/protocol.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <pthread.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <torch_monitor/background_warnings.h>
#include <torch_monitor/detail/lifecycle.h>
#include <torch_monitor/detail/text.h>
#include <torch_monitor/engine/live_stats.h>
#include <torch_monitor/event_handler.h>
#include <torch_monitor/rank_sync.h>
#include <torch_monitor/rank_sync/store_io.h>

namespace torch_monitor {
namespace detail {
namespace {

using SteadyClock = std::chrono::steady_clock;

// The rank sync thread polls the Store for the windows the root is merging
// this often: a Store check is one round trip, and a window's merge waits
// for the slowest rank anyway.
constexpr auto kPollInterval = std::chrono::milliseconds(2);
// A rank other than the root looks this often whether the root took the
// windows it posted (at exit: kExitWatchInterval).
constexpr auto kWatchInterval = std::chrono::milliseconds(200);
constexpr auto kExitWatchInterval = std::chrono::milliseconds(10);
// Keys of ranks that missed a window's deadline are marked late if they
// arrive later, looked for this often and for this many deadlines; a rank
// gives up on a window the root did not take after as many.
constexpr auto kLeftoverSweepInterval = std::chrono::milliseconds(500);
constexpr int kLeftoverDeadlines = 20;
// Windows queued for the thread at most; beyond, windows are logged locally
// (a Store that stopped answering must not grow memory without bound).
constexpr size_t kMaxQueuedWindows = 4096;
// Empty markers posted at most for the windows a rank skipped.
constexpr int64_t kMaxEmptyMarkers = 64;

using Bytes = StoreBytes;

void dispatchLogged(const Event& event) noexcept {
  try {
    dispatchEvent(event);
  } catch (const std::exception& e) {
    TORCH_WARN(
        "torch_monitor: an event handler failed on the rank sync thread: ",
        errorMessage(e));
  } catch (...) {
    TORCH_WARN("torch_monitor: an event handler failed on the rank sync thread");
  }
}

// One window to post, and on the root to merge.
struct Outgoing {
  std::shared_ptr<const RankGroup> group;
  std::string what; // "Stat 'loss'", for warnings
  std::string prefix; // "torch_monitor/<stat>/<window>/"; keys add the rank
  std::string stream; // "torch_monitor/<stat>/": its windows merge in order
  std::string shape;
  Bytes payload;
  MergedPayloadBuilder build; // merges (root) or logs this rank's own alone
};

// A window the root merges once every rank posted, or at its deadline.
struct Merge {
  std::shared_ptr<const RankGroup> group;
  std::string what;
  std::string prefix;
  std::string stream;
  std::string shape; // the root's: other ranks' must match it
  Bytes own; // the root's payload
  MergedPayloadBuilder build;
  SteadyClock::time_point deadline;
};

// Keys of ranks that missed their window's deadline, marked late if they
// come (their ranks then log those windows themselves).
struct Leftover {
  std::shared_ptr<const RankGroup> group;
  std::vector<std::string> keys;
  SteadyClock::time_point expiry;
};

// A window a rank other than the root posted, until the root took it or the
// rank took it back.
struct Watch {
  Outgoing posted;
  std::string key;
  Bytes bytes;
  SteadyClock::time_point postedAt;
};

struct SyncedStat {
  std::shared_ptr<const RankGroup> group; // nullptr: the default group
  int64_t lastIndex = 0;
  bool posted = false;
};

// Lock order: the mutex is taken last (postRankWindow runs under the
// live-stat registry's or the window timer's lock) and nothing is taken
// under it; Store calls and handlers run without it, so handlers may take
// the GIL and create or destroy Stats.
struct RankSync {
  std::mutex mutex;
  std::condition_variable wake; // the thread: new work, stop
  std::condition_variable idle; // flushRankSync: the work is done
  std::unordered_map<const void*, SyncedStat> stats;
  std::shared_ptr<const RankGroup> defaultGroup;
  std::deque<Outgoing> queue;
  size_t busy = 0; // windows the thread took but has not finished
  bool warnedFull = false;
  bool warnedNoGroup = false;
  bool running = false;
  bool stopping = false;
  bool shutDown = false; // stopped at exit: windows are logged locally
  bool forkedChild = false; // the parent's Store connections are not ours
  // Set by stopRankSync(): from then on a rank waits at most the deadline
  // for the root to take a window.
  std::optional<SteadyClock::time_point> exitStarted;

  // Set once the first synced Stat (or a default group) created it, so
  // that the exit flush costs programs that never sync nothing.
  static std::atomic<RankSync*> instance;

  // Never destroyed: Stats may post during static destruction.
  static RankSync& get() {
    static RankSync* sync = [] {
      auto* s = new RankSync();
      instance.store(s, std::memory_order_release);
      static constexpr ForkHooks kHooks{nullptr, nullptr, &afterForkInChild};
      onFork(ForkStage::kRankSync, kHooks);
      onExit(ExitStage::kRankSync, [] {
        // Before closeAllStats()'s stage: the last windows are closed here,
        // then merged, then the thread stops.
        closeAllLiveStats();
        stopRankSyncThread();
      });
      return s;
    }();
    return *sync;
  }

  // Callers hold the mutex. Throws if the thread cannot start.
  void startLocked() {
    if (running) {
      return;
    }
    stopping = false;
    // Detached: it ends by itself once stopped, and a forked child simply
    // does not have it.
    std::thread([this] { run(); }).detach();
    running = true;
  }

  // State only the thread touches.
  struct Work {
    std::vector<Merge> merges;
    std::vector<Leftover> leftovers;
    std::vector<Watch> watches;
    // Problems warned about once each: "<reason>/<stat>/<rank>".
    std::unordered_set<std::string> warned;
    SteadyClock::time_point nextSweep;
    SteadyClock::time_point nextWatch;
  };

  void run() {
    // Its warnings (a failing handler, a Store error) have no caller to see
    // them: in Python they become warnings on the main thread.
    routeThreadWarningsToBackgroundSink();
    Work work;
    work.nextSweep = work.nextWatch = SteadyClock::now();
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      std::vector<Outgoing> batch(
          std::make_move_iterator(queue.begin()),
          std::make_move_iterator(queue.end()));
      queue.clear();
      busy = work.merges.size() + work.watches.size() + batch.size();
      const bool stop = stopping;
      const auto exitStartedAt = exitStarted;
      if (stop && batch.empty() && work.merges.empty() &&
          work.watches.empty()) {
        break; // leftovers are dropped: their ranks are most likely gone
      }
      lock.unlock();
      for (Outgoing& out : batch) {
        post(out, work);
      }
      pollMerges(work);
      const auto now = SteadyClock::now();
      if (!work.leftovers.empty() && now >= work.nextSweep) {
        sweep(work.leftovers, now);
        work.nextSweep = now + kLeftoverSweepInterval;
      }
      if (!work.watches.empty() && (now >= work.nextWatch || stop)) {
        checkWatches(work, now, exitStartedAt, /*takeAllBack=*/stop);
        work.nextWatch =
            now + (exitStartedAt ? kExitWatchInterval : kWatchInterval);
      }
      lock.lock();
      busy = work.merges.size() + work.watches.size();
      if (!queue.empty() || (stopping && !stop)) {
        continue;
      }
      if (busy == 0) {
        idle.notify_all();
      }
      // Producers and stop requests notify under the mutex: no lost wake-up.
      if (!work.merges.empty()) {
        wake.wait_for(lock, kPollInterval);
      } else if (!work.watches.empty()) {
        wake.wait_until(lock, work.nextWatch);
      } else if (!work.leftovers.empty()) {
        wake.wait_for(lock, kLeftoverSweepInterval);
      } else if (!stopping) {
        wake.wait(lock);
      }
    }
    busy = 0;
    running = false;
    idle.notify_all();
  }

  // Warns once per `key` (a reason, the stat and a rank).
  static void warnOnce(Work& work, const std::string& key, const std::string& message) {
    if (work.warned.insert(key).second) {
      TORCH_WARN(message);
    }
  }

  // Logs a window of this rank that the root will not merge, here, as a
  // window of one rank.
  static void logLocally(const Outgoing& out) {
    dispatchAllLogged(out.build({out.payload}));
  }

  static void dispatchAllLogged(const std::vector<Event>& events) {
    for (const Event& event : events) {
      dispatchLogged(event);
    }
  }

  static void post(Outgoing& out, Work& work) {
    const std::string key = keyOf(out.prefix, out.group->rank);
    Bytes bytes = wrapPost(out.shape, out.payload);
    try {
      writeKey(*out.group->store, key, bytes);
    } catch (const std::exception& e) {
      warnOnce(
          work,
          "post/" + out.what,
          "torch_monitor: " + out.what +
              ": could not post a window to the rank group's Store (" +
              errorMessage(e) +
              "); this rank logs such windows itself, as windows of one "
              "rank");
      logLocally(out);
      return;
    }
    const auto now = SteadyClock::now();
    if (out.group->rank == 0) {
      const auto deadline = now + out.group->deadline;
      work.merges.push_back(Merge{
          out.group,
          out.what,
          out.prefix,
          out.stream,
          out.shape,
          out.payload,
          std::move(out.build),
          deadline});
    } else {
      work.watches.push_back(Watch{std::move(out), key, std::move(bytes), now});
    }
  }

  // Merges every window whose ranks all posted or whose deadline passed,
  // in order within each stream: a window waits while an earlier window of
  // its Stat (or watch) is still waiting, even when its own ranks are all
  // there, so that the merged points of one tag reach the sinks in step
  // order. (A rank's first window of a Stat comes without empty markers for
  // the windows before it, so a later window can be complete while an
  // earlier one waits for its deadline.) `merges` holds each stream's
  // windows in the order they were posted, which is window order.
  static void pollMerges(Work& work) {
    const auto now = SteadyClock::now();
    std::vector<const Merge*> waiting; // the first waiting window per stream
    const auto blocked = [&](const Merge& m) {
      return std::any_of(waiting.begin(), waiting.end(), [&](const Merge* w) {
        return w->group == m.group && w->stream == m.stream;
      });
    };
    for (auto it = work.merges.begin(); it != work.merges.end();) {
      if (!blocked(*it) && tryMerge(*it, now >= it->deadline, work)) {
        it = work.merges.erase(it);
      } else {
        waiting.push_back(&*it);
        ++it;
      }
    }
  }

  // True when the window is done (merged, or given up on). The root takes
  // another rank's share with compareSet (share -> kTakenMark), so that a rank
  // that took it back meanwhile (kGivenUpMark) is never merged as well.
  static bool tryMerge(Merge& merge, bool pastDeadline, Work& work) {
    const RankGroup& group = *merge.group;
    std::vector<std::string> keys;
    keys.reserve(group.worldSize);
    for (int64_t r = 0; r < group.worldSize; ++r) {
      keys.push_back(keyOf(merge.prefix, r));
    }
    try {
      std::vector<int64_t> present;
      std::vector<std::string> missing;
      if (keysExist(*group.store, keys)) {
        for (int64_t r = 0; r < group.worldSize; ++r) {
          present.push_back(r);
        }
      } else if (!pastDeadline) {
        return false;
      } else {
        for (int64_t r = 0; r < group.worldSize; ++r) {
          if (keysExist(*group.store, {keys[r]})) {
            present.push_back(r);
          } else {
            missing.push_back(keys[r]);
          }
        }
      }
      std::vector<Bytes> payloads;
      for (const int64_t r : present) {
        const std::string& key = keys[r];
        // Read without waiting: a rank that took its share back may have
        // deleted it since the check (multiGet would wait for the key).
        const Bytes value = peekKey(*group.store, key);
        auto posted = unwrapPost(value);
        if (!posted) {
          continue; // its rank took it back: not merged here
        }
        if (r == group.rank) {
          deleteKey(*group.store, key); // nobody else takes the root's own
          payloads.push_back(std::move(posted->payload));
          continue;
        }
        if (posted->shape != merge.shape) {
          swapKey(*group.store, key, value, kRefusedMark);
          warnOnce(
              work,
              "shape/" + merge.what + "/" + std::to_string(r),
              "torch_monitor: " + merge.what +
                  " is not the same on every rank of its group: rank " +
                  std::to_string(group.rank) + " has " + merge.shape +
                  ", rank " + std::to_string(r) + " " + posted->shape +
                  "; rank " + std::to_string(r) +
                  "'s windows are not merged (it logs them itself). Create "
                  "it the same way on every rank");
          continue;
        }
        if (swapKey(*group.store, key, value, kTakenMark) == kTakenMark) {
          deleteKey(*group.store, key);
          payloads.push_back(std::move(posted->payload));
        }
      }
      if (!missing.empty()) {
        work.leftovers.push_back(Leftover{
            merge.group,
            std::move(missing),
            SteadyClock::now() + kLeftoverDeadlines * group.deadline});
      }
      if (!payloads.empty()) {
        dispatchAllLogged(merge.build(payloads));
      }
    } catch (const std::exception& e) {
      warnOnce(
          work,
          "merge/" + merge.what,
          "torch_monitor: " + merge.what +
              ": could not merge a window across ranks (" +
              errorMessage(e) +
              "); rank 0 logs its own share of such windows, as windows of "
              "one rank");
      dispatchAllLogged(merge.build({merge.own}));
    }
    return true;
  }

  // Marks the shares that came after their window's merge as late, so that
  // their ranks log them themselves.
  static void sweep(
      std::vector<Leftover>& leftovers,
      SteadyClock::time_point now) {
    for (auto it = leftovers.begin(); it != leftovers.end();) {
      auto& keys = it->keys;
      c10d::Store& store = *it->group->store;
      try {
        keys.erase(
            std::remove_if(
                keys.begin(),
                keys.end(),
                [&](const std::string& key) {
                  const Bytes value = peekKey(store, key);
                  if (value == kAbsentKey) {
                    return false; // not come yet
                  }
                  if (unwrapPost(value)) {
                    swapKey(store, key, value, kLateMark);
                  }
                  return true;
                }),
            keys.end());
      } catch (const std::exception&) {
        keys.clear(); // the Store is gone: nothing left to mark
      }
      if (keys.empty() || now >= it->expiry) {
        it = leftovers.erase(it);
      } else {
        ++it;
      }
    }
  }

  // A rank other than the root: forgets the windows the root took, and
  // takes back (then logs itself) those it refused, marked late, or did not
  // take in time. `takeAllBack`: the thread stops, what is left is taken
  // back now.
  static void checkWatches(
      Work& work,
      SteadyClock::time_point now,
      std::optional<SteadyClock::time_point> exitStarted,
      bool takeAllBack) {
    for (auto it = work.watches.begin(); it != work.watches.end();) {
      if (resolveWatch(*it, work, now, exitStarted, takeAllBack)) {
        it = work.watches.erase(it);
      } else {
        ++it;
      }
    }
  }

  // True when the window is decided: the root took it, or this rank logged
  // it itself.
  static bool resolveWatch(
      Watch& watch,
      Work& work,
      SteadyClock::time_point now,
      std::optional<SteadyClock::time_point> exitStarted,
      bool takeAllBack) {
    const Outgoing& posted = watch.posted;
    c10d::Store& store = *posted.group->store;
    const std::string where = "torch_monitor: " + posted.what +
        ", window " + windowOf(posted.prefix) + " of rank " +
        std::to_string(posted.group->rank) + ", is not merged across ranks: ";
    const std::string fallback =
        "; this rank logs such windows itself, as windows of one rank";
    try {
      Bytes value = peekKey(store, watch.key);
      auto giveUp =
          watch.postedAt + kLeftoverDeadlines * posted.group->deadline;
      if (exitStarted) {
        giveUp = std::min(giveUp, *exitStarted + posted.group->deadline);
      }
      if (value == watch.bytes && (takeAllBack || now >= giveUp)) {
        // Ours again unless the root took it in the meantime (a key the
        // root took and deleted answers the expected value).
        value = swapKey(store, watch.key, watch.bytes, kGivenUpMark);
        if (value == watch.bytes) {
          return true;
        }
      }
      if (value == kAbsentKey || value == kTakenMark) {
        return true; // merged by the root
      }
      if (value == watch.bytes) {
        return false; // not taken yet
      }
      std::string reason;
      if (value == kGivenUpMark) {
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(
                now - watch.postedAt);
        warnOnce(
            work,
            "gone/" + posted.what,
            where + "rank 0 did not take it within " +
                std::to_string(waited.count()) +
                " ms (rank 0 is gone or stalled)" + fallback);
      } else if (value == kLateMark) {
        warnOnce(
            work,
            "late/" + posted.what,
            where +
                "it reached the Store after rank 0 had merged the window "
                "without it (this rank was later than the deadline)" +
                fallback);
      } else if (value == kRefusedMark) {
        warnOnce(
            work,
            "refused/" + posted.what,
            where +
                "rank 0 refused it because the Stat is not the same on "
                "every rank (rank 0's warning says how)" +
                fallback);
      } else {
        return true; // foreign data under our key: left alone
      }
      deleteKey(store, watch.key);
    } catch (const std::exception& e) {
      warnOnce(
          work,
          "store/" + posted.what,
          where +
              "the rank group's Store failed while this rank waited for rank "
              "0 to take the window (" +
              errorMessage(e) +
              ")" + fallback +
              " (a window rank 0 took just before may then appear twice)");
    }
    logLocally(posted);
    return true;
  }

  // The child shares the parent's Store connections and has no sync thread:
  // its synced Stats log locally; the parent posts what it queued. No
  // prepare hook takes the mutex before fork(): postRankWindow runs under
  // the live-stat registry's and the window timer's locks, whose own fork
  // hooks would then order those locks against ours. Instead the child,
  // where only the forking thread exists, starts from fresh state; the old
  // one (perhaps torn by a thread that held the mutex) is leaked, unread.
  static void afterForkInChild() {
    RankSync& s = get();
    new (&s.mutex) std::mutex();
    new (&s.wake) std::condition_variable();
    new (&s.idle) std::condition_variable();
    new (&s.stats) std::unordered_map<const void*, SyncedStat>();
    new (&s.defaultGroup) std::shared_ptr<const RankGroup>();
    new (&s.queue) std::deque<Outgoing>();
    s.running = false;
    s.busy = 0;
    s.forkedChild = true;
  }
};

std::atomic<RankSync*> RankSync::instance{nullptr};

} // namespace

void enableRankSync(
    const void* stat,
    std::shared_ptr<const RankGroup> group) {
  RankSync& s = RankSync::get();
  std::lock_guard<std::mutex> guard(s.mutex);
  s.stats[stat] = SyncedStat{std::move(group)};
}

void disableRankSync(const void* stat) noexcept {
  RankSync& s = RankSync::get();
  std::lock_guard<std::mutex> guard(s.mutex);
  s.stats.erase(stat);
}

bool postRankPayload(
    const void* stat,
    const std::string& name,
    const std::string& what,
    int64_t index,
    Bytes payload,
    Bytes emptyMarker,
    std::string shape,
    MergedPayloadBuilder build) {
  RankSync& s = RankSync::get();
  std::lock_guard<std::mutex> guard(s.mutex);
  const auto found = s.stats.find(stat);
  if (found == s.stats.end() || s.forkedChild || s.shutDown) {
    return false;
  }
  SyncedStat& synced = found->second;
  std::shared_ptr<const RankGroup> group =
      synced.group ? synced.group : s.defaultGroup;
  if (!group) {
    if (!s.warnedNoGroup) {
      s.warnedNoGroup = true;
      TORCH_WARN(
          "torch_monitor: ",
          what,
          " syncs ranks over the process default group, but none is set "
          "(torch_monitor::setDefaultRankGroup, or initialise "
          "torch.distributed before creating the Stat); its windows are "
          "logged on this rank only");
    }
    return false;
  }
  // An index posted before (a window reopened after closeAllStats()) would
  // overwrite a merged key: that window is logged locally.
  if (synced.posted && index <= synced.lastIndex) {
    return false;
  }
  const int64_t firstMarker = synced.posted
      ? std::max(synced.lastIndex + 1, index - kMaxEmptyMarkers)
      : index;
  const size_t windows = size_t(index - firstMarker + 1);
  if (s.queue.size() + windows > kMaxQueuedWindows) {
    if (!s.warnedFull) {
      s.warnedFull = true;
      TORCH_WARN(
          "torch_monitor: the rank sync queue is full (the group's Store "
          "does not keep up); windows are logged on this rank only");
    }
    return false;
  }
  try {
    s.startLocked();
  } catch (const std::exception& e) {
    TORCH_WARN(
        "torch_monitor: could not start the rank sync thread; the window is "
        "logged on this rank only: ",
        errorMessage(e));
    return false;
  }
  const std::string stream = streamPrefix(name);
  for (int64_t i = firstMarker; i <= index; ++i) {
    s.queue.push_back(Outgoing{
        group,
        what,
        windowPrefix(stream, i),
        stream,
        shape,
        i == index ? std::move(payload) : emptyMarker,
        build});
  }
  synced.lastIndex = index;
  synced.posted = true;
  s.wake.notify_all();
  return true;
}
void storeDefaultRankGroup(std::shared_ptr<const RankGroup> group) {
  RankSync& s = RankSync::get();
  std::lock_guard<std::mutex> guard(s.mutex);
  s.defaultGroup = std::move(group);
}

std::shared_ptr<const RankGroup> loadDefaultRankGroup() {
  RankSync& s = RankSync::get();
  std::lock_guard<std::mutex> guard(s.mutex);
  return s.defaultGroup;
}

void waitForRankSync() noexcept {
  RankSync* sync = RankSync::instance.load(std::memory_order_acquire);
  if (sync == nullptr) {
    return; // nothing was ever synced
  }
  RankSync& s = *sync;
  std::unique_lock<std::mutex> lock(s.mutex);
  // Bounded by the longest deadline of the groups in use, plus slack for
  // the handlers and Store round trips.
  auto longest = RankGroup::kDefaultDeadline;
  for (const auto& [stat, synced] : s.stats) {
    if (synced.group) {
      longest = std::max(longest, synced.group->deadline);
    }
  }
  if (s.defaultGroup) {
    longest = std::max(longest, s.defaultGroup->deadline);
  }
  s.idle.wait_for(lock, longest + std::chrono::seconds(5), [&] {
    return !s.running || (s.queue.empty() && s.busy == 0);
  });
}

void stopRankSyncThread() noexcept {
  RankSync* sync = RankSync::instance.load(std::memory_order_acquire);
  if (sync == nullptr) {
    return;
  }
  RankSync& s = *sync;
  {
    std::lock_guard<std::mutex> guard(s.mutex);
    if (s.shutDown) {
      return;
    }
    s.exitStarted = std::chrono::steady_clock::now();
    s.wake.notify_all();
  }
  waitForRankSync();
  std::lock_guard<std::mutex> guard(s.mutex);
  s.shutDown = true;
  s.stopping = true;
  s.wake.notify_all();
}

} // namespace detail
} // namespace torch_monitor
