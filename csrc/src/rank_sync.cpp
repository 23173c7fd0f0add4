#include <torch_monitor/rank_sync.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <pthread.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <torch_monitor/background_warnings.h>
#include <torch_monitor/detail/rank_post.h>
#include <torch_monitor/event_handler.h>
#include <torch_monitor/stat.h>

namespace torch_monitor {
namespace detail {
namespace {

using SteadyClock = std::chrono::steady_clock;

// The rank sync thread polls the Store for the windows the root is merging
// this often: a Store check is one round trip, and a window's merge waits
// for the slowest rank anyway.
constexpr auto kPollInterval = std::chrono::milliseconds(2);
// Keys of ranks that missed a window's deadline are deleted if they arrive
// later, looked for this often and for this many deadlines.
constexpr auto kLeftoverSweepInterval = std::chrono::milliseconds(500);
constexpr int kLeftoverDeadlines = 20;
// Windows queued for the thread at most; beyond, windows are logged locally
// (a Store that stopped answering must not grow memory without bound).
constexpr size_t kMaxQueuedWindows = 4096;
// Empty markers posted at most for the windows a rank skipped.
constexpr int64_t kMaxEmptyMarkers = 64;

constexpr size_t kShareBytes = 6 * sizeof(uint64_t);

std::vector<uint8_t> encode(const RankShare& share) {
  const uint64_t fields[6] = {
      uint64_t(share.count),
      share.sum,
      share.min,
      share.max,
      share.value,
      uint64_t(share.step)};
  std::vector<uint8_t> bytes(kShareBytes);
  std::memcpy(bytes.data(), fields, kShareBytes);
  return bytes;
}

std::optional<RankShare> decode(const std::vector<uint8_t>& bytes) {
  if (bytes.size() != kShareBytes) {
    return std::nullopt; // not ours: ignored rather than misread
  }
  uint64_t fields[6];
  std::memcpy(fields, bytes.data(), kShareBytes);
  RankShare share;
  share.count = int64_t(fields[0]);
  share.sum = fields[1];
  share.min = fields[2];
  share.max = fields[3];
  share.value = fields[4];
  share.step = int64_t(fields[5]);
  return share;
}

void dispatchLogged(const Event& event) noexcept {
  try {
    dispatchEvent(event);
  } catch (const std::exception& e) {
    TORCH_WARN(
        "torch_monitor: an event handler failed on the rank sync thread: ",
        e.what());
  } catch (...) {
    TORCH_WARN("torch_monitor: an event handler failed on the rank sync thread");
  }
}

// One window to post, and on the root to merge.
struct Outgoing {
  std::shared_ptr<const RankGroup> group;
  std::string prefix; // "torch_monitor/<stat>/<window>/"; keys add the rank
  std::string stream; // "torch_monitor/<stat>/": the windows kept in order
  std::vector<uint8_t> share;
  MergedPayloadBuilder build; // the root's only
};

// A window the root merges once every rank posted, or at its deadline.
struct Merge {
  std::shared_ptr<const RankGroup> group;
  std::string prefix;
  std::string stream;
  MergedPayloadBuilder build;
  SteadyClock::time_point deadline;
};

// Keys of ranks that missed their window's deadline, deleted if they come.
struct Leftover {
  std::shared_ptr<const RankGroup> group;
  std::vector<std::string> keys;
  SteadyClock::time_point expiry;
};

struct SyncedStat {
  std::shared_ptr<const RankGroup> group; // nullptr: the default group
  int64_t lastIndex = 0;
  bool posted = false;
};

std::string keyOf(const std::string& prefix, int64_t rank) {
  return prefix + std::to_string(rank);
}

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

  // Set once the first synced Stat (or a default group) created it, so
  // that the exit flush costs programs that never sync nothing.
  static std::atomic<RankSync*> instance;

  // Never destroyed: Stats may post during static destruction.
  static RankSync& get() {
    static RankSync* sync = [] {
      auto* s = new RankSync();
      instance.store(s, std::memory_order_release);
      pthread_atfork(nullptr, nullptr, &afterForkInChild);
      std::atexit([] {
        // This hook runs before closeAllStats()'s (registered earlier), so
        // the last windows are closed here, then merged, then the thread
        // stops.
        closeAllStats();
        flushRankSync();
        RankSync& s = get();
        std::unique_lock<std::mutex> lock(s.mutex);
        s.shutDown = true;
        s.stopping = true;
        s.wake.notify_all();
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

  void run() {
    // Its warnings (a failing handler, a Store error) have no caller to see
    // them: in Python they become warnings on the main thread.
    routeThreadWarningsToBackgroundSink();
    std::vector<Merge> merges;
    std::vector<Leftover> leftovers;
    auto nextSweep = SteadyClock::now();
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      std::vector<Outgoing> batch(
          std::make_move_iterator(queue.begin()),
          std::make_move_iterator(queue.end()));
      queue.clear();
      busy = merges.size() + batch.size();
      if (stopping && batch.empty() && merges.empty()) {
        break; // leftovers are dropped: their ranks are most likely gone
      }
      lock.unlock();
      for (Outgoing& out : batch) {
        post(out, merges);
      }
      pollMerges(merges, leftovers);
      const auto now = SteadyClock::now();
      if (!leftovers.empty() && now >= nextSweep) {
        sweep(leftovers, now);
        nextSweep = now + kLeftoverSweepInterval;
      }
      lock.lock();
      busy = merges.size();
      if (!queue.empty() || (stopping && merges.empty())) {
        continue;
      }
      if (busy == 0) {
        idle.notify_all();
      }
      // Producers and stop requests notify under the mutex: no lost wake-up.
      if (!merges.empty()) {
        wake.wait_for(lock, kPollInterval);
      } else if (!leftovers.empty()) {
        wake.wait_for(lock, kLeftoverSweepInterval);
      } else {
        wake.wait(lock);
      }
    }
    busy = 0;
    running = false;
    idle.notify_all();
  }

  static void post(Outgoing& out, std::vector<Merge>& merges) {
    try {
      out.group->store->set(keyOf(out.prefix, out.group->rank), out.share);
    } catch (const std::exception& e) {
      TORCH_WARN(
          "torch_monitor: could not post a window to the rank group's "
          "Store (",
          out.prefix,
          "): ",
          e.what());
      return;
    }
    if (out.build) {
      const auto deadline = SteadyClock::now() + out.group->deadline;
      merges.push_back(Merge{
          std::move(out.group),
          std::move(out.prefix),
          std::move(out.stream),
          std::move(out.build),
          deadline});
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
  static void pollMerges(
      std::vector<Merge>& merges,
      std::vector<Leftover>& leftovers) {
    const auto now = SteadyClock::now();
    std::vector<const Merge*> waiting; // the first waiting window per stream
    auto blocked = [&](const Merge& m) {
      return std::any_of(waiting.begin(), waiting.end(), [&](const Merge* w) {
        return w->group == m.group && w->stream == m.stream;
      });
    };
    for (auto it = merges.begin(); it != merges.end();) {
      if (!blocked(*it) && tryMerge(*it, now >= it->deadline, leftovers)) {
        it = merges.erase(it);
      } else {
        waiting.push_back(&*it);
        ++it;
      }
    }
  }

  // True when the window is done (merged, or given up on).
  static bool tryMerge(
      Merge& merge,
      bool pastDeadline,
      std::vector<Leftover>& leftovers) {
    const RankGroup& group = *merge.group;
    std::vector<std::string> keys;
    keys.reserve(group.worldSize);
    for (int64_t r = 0; r < group.worldSize; ++r) {
      keys.push_back(keyOf(merge.prefix, r));
    }
    try {
      std::vector<std::string> present;
      std::vector<std::string> missing;
      if (group.store->check(keys)) {
        present = keys;
      } else if (!pastDeadline) {
        return false;
      } else {
        for (const std::string& key : keys) {
          (group.store->check({key}) ? present : missing).push_back(key);
        }
      }
      const auto values = group.store->multiGet(present);
      for (const std::string& key : present) {
        group.store->deleteKey(key);
      }
      if (!missing.empty()) {
        leftovers.push_back(Leftover{
            merge.group,
            std::move(missing),
            SteadyClock::now() + kLeftoverDeadlines * group.deadline});
      }
      if (!values.empty()) {
        for (const Event& event : merge.build(values)) {
          dispatchLogged(event);
        }
      }
    } catch (const std::exception& e) {
      TORCH_WARN(
          "torch_monitor: could not merge a window across ranks (",
          merge.prefix,
          "); it is not logged: ",
          e.what());
    }
    return true;
  }

  static void sweep(
      std::vector<Leftover>& leftovers,
      SteadyClock::time_point now) {
    for (auto it = leftovers.begin(); it != leftovers.end();) {
      auto& keys = it->keys;
      try {
        keys.erase(
            std::remove_if(
                keys.begin(),
                keys.end(),
                [&](const std::string& key) {
                  // deleteKey alone cannot tell: FileStore answers true for
                  // a key it never had.
                  return it->group->store->check({key}) &&
                      it->group->store->deleteKey(key);
                }),
            keys.end());
      } catch (const std::exception&) {
        keys.clear(); // the Store is gone: nothing left to clean
      }
      if (keys.empty() || now >= it->expiry) {
        it = leftovers.erase(it);
      } else {
        ++it;
      }
    }
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
    int64_t index,
    std::vector<uint8_t> payload,
    std::vector<uint8_t> emptyMarker,
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
          "torch_monitor: Stat '",
          name,
          "' syncs ranks over the process default group, but none is set "
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
        e.what());
    return false;
  }
  const bool root = group->rank == 0;
  const std::string statPrefix = "torch_monitor/" + name + "/";
  for (int64_t i = firstMarker; i <= index; ++i) {
    s.queue.push_back(Outgoing{
        group,
        statPrefix + std::to_string(i) + "/",
        statPrefix,
        i == index ? std::move(payload) : emptyMarker,
        root ? build : MergedPayloadBuilder()});
  }
  synced.lastIndex = index;
  synced.posted = true;
  s.wake.notify_all();
  return true;
}

bool postRankWindow(
    const void* stat,
    const std::string& name,
    int64_t index,
    const RankShare& share,
    MergedEventBuilder build) {
  MergedPayloadBuilder merge;
  if (build) {
    merge = [build = std::move(build)](
                const std::vector<std::vector<uint8_t>>& values) {
      std::vector<RankShare> shares;
      for (const auto& bytes : values) {
        if (auto decoded = decode(bytes)) {
          shares.push_back(*decoded);
        }
      }
      std::vector<Event> events;
      if (!shares.empty()) {
        if (auto event = build(shares)) {
          events.push_back(std::move(*event));
        }
      }
      return events;
    };
  }
  return postRankPayload(
      stat, name, index, encode(share), encode(RankShare()), std::move(merge));
}

} // namespace detail

void setDefaultRankGroup(std::shared_ptr<const RankGroup> group) {
  if (group) {
    TORCH_CHECK_VALUE(
        group->store, "RankGroup: a Store is required (the group's c10d Store)");
    TORCH_CHECK_VALUE(
        group->worldSize >= 1 && group->rank >= 0 &&
            group->rank < group->worldSize,
        "RankGroup: rank must be in [0, worldSize), got rank ",
        group->rank,
        " of ",
        group->worldSize);
    TORCH_CHECK_VALUE(
        group->deadline.count() >= 1,
        "RankGroup: the deadline must be at least 1 ms, got ",
        group->deadline.count(),
        " ms");
  }
  detail::RankSync& s = detail::RankSync::get();
  std::lock_guard<std::mutex> guard(s.mutex);
  s.defaultGroup = std::move(group);
}

std::shared_ptr<const RankGroup> defaultRankGroup() {
  detail::RankSync& s = detail::RankSync::get();
  std::lock_guard<std::mutex> guard(s.mutex);
  return s.defaultGroup;
}

void flushRankSync() noexcept {
  detail::RankSync* sync =
      detail::RankSync::instance.load(std::memory_order_acquire);
  if (sync == nullptr) {
    return; // nothing was ever synced
  }
  detail::RankSync& s = *sync;
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

} // namespace torch_monitor
