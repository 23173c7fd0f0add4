#include <torch_monitor/rank_sync/protocol.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
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

// The root polls the Store for the bundles its open merges wait for this
// often: one check for all of them, and a window's merge waits for the
// slowest rank anyway.
constexpr auto kPollInterval = std::chrono::milliseconds(2);
// A rank other than the root looks this often whether the root settled the
// bundles it posted (at exit: kExitWatchInterval): with windows of a second
// or more, once per bundle.
constexpr auto kWatchInterval = std::chrono::milliseconds(200);
constexpr auto kExitWatchInterval = std::chrono::milliseconds(10);
// The root reads the bundles of ranks that missed a merged window this
// often and for this many deadlines, so that their late entries get a
// verdict; it waits as long for a window it has not closed, and a rank
// takes back a bundle the root did not claim within as many.
constexpr auto kLeftoverSweepInterval = std::chrono::milliseconds(500);
constexpr int kLeftoverDeadlines = 20;
// The thread takes queued windows once none came for this long (at most
// kGatherLimit after it woke): a burst of windows goes out as one bundle.
constexpr auto kGatherQuiet = std::chrono::microseconds(500);
constexpr auto kGatherLimit = std::chrono::milliseconds(10);
// Windows queued for the thread at most; beyond, windows are logged locally
// (a Store that stopped answering must not grow memory without bound: a
// queued window is about 300 bytes). Hundreds of Stats of one-step windows
// close thousands in the time a starved sync thread takes to run once.
constexpr size_t kMaxQueuedWindows = size_t(1) << 16;
// Empty markers posted at most for the windows a rank skipped.
constexpr int64_t kMaxEmptyMarkers = 64;
// Bundles the root reads at most from one rank in one pass (a rank that
// posted more is read on at the next pass).
constexpr int kMaxReadRounds = 64;

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

// One closed window to post, and on the root to merge.
struct Outgoing {
  std::shared_ptr<const RankGroup> group;
  std::string what; // "Stat 'loss'", for warnings
  std::string stream; // SyncedStat::stream(): its windows merge in order
  int64_t window = 0;
  std::string shape;
  Bytes payload;
  MergedPayloadBuilder build; // merges (root) or logs this rank's own alone
};

// Logs a window of this rank that the root will not merge, here, as a
// window of one rank.
void dispatchAllLogged(const std::vector<Event>& events) {
  for (const Event& event : events) {
    dispatchLogged(event);
  }
}
void logLocally(const Outgoing& out) {
  dispatchAllLogged(out.build({out.payload}));
}

// A rank's link to one group: the group's Store as this rank sees it (the
// same Store object, rank and size make one channel, however many
// RankGroup values name it).
using ChannelId = std::tuple<const c10d::Store*, int64_t, int64_t>;

ChannelId idOf(const RankGroup& group) {
  return {group.store.get(), group.rank, group.worldSize};
}

// A bundle this rank posted, until the root decided every entry (deleted
// the key, or wrote a verdict on the entries it did not merge) or the rank
// took it back.
struct Posted {
  int64_t seq = 0;
  std::string key;
  std::vector<Outgoing> entries;
  SteadyClock::time_point postedAt;
};

// A bundle the root claimed: deleted once every entry is decided, or
// replaced by the verdicts on those it did not merge.
struct Claimed {
  std::string key;
  size_t undecided = 0;
  std::vector<EntryVerdict> verdicts;
};

// Another rank's entry of a window, claimed by the root.
struct Share {
  int64_t rank = 0;
  std::string shape;
  Bytes payload;
  std::shared_ptr<Claimed> bundle;
  uint32_t entry = 0;
};

// One window of one stream on the root: its own share once it closed the
// window (then it has a deadline), and the other ranks' claimed shares.
// A window whose other ranks' shares came first waits for the root's own
// (an "orphan" until then).
struct Merge {
  bool hasOwn = false;
  std::shared_ptr<const RankGroup> group;
  std::string what;
  std::string shape;
  Bytes own;
  MergedPayloadBuilder build;
  SteadyClock::time_point deadline;
  SteadyClock::time_point firstSeen;
  std::vector<Share> shares;
  std::vector<bool> arrived; // per rank: its share came (merged or refused)
  bool readThisDeadline = false; // the missing ranks were looked for once more

  bool complete() const {
    return std::all_of(arrived.begin(), arrived.end(), [](bool a) { return a; });
  }
};

// What the root knows of a stream's own windows: the first and last it
// posted (the ones between were posted too, as windows or empty markers).
struct OwnRange {
  int64_t first = 0;
  int64_t last = -1;
};

// The thread's state for one channel.
struct Channel {
  // The newest group that named it, while the channel has work (an idle
  // channel lets its Store go); the Store, to tell a new Store at the
  // address of a freed one, which starts a channel afresh.
  std::shared_ptr<const RankGroup> group;
  std::optional<c10::weak_intrusive_ptr<c10d::Store>> store;
  // Any rank: its next bundle's number, and its undecided bundles, oldest
  // first.
  int64_t nextSeq = 1;
  std::deque<Posted> posted;
  // The root: each rank's next bundle to read, and the group's claims as
  // the root last wrote or found them (empty: not written yet); the windows
  // being merged, in stream then window order; each stream's own windows.
  std::vector<int64_t> next;
  Bytes claims;
  std::map<std::pair<std::string, int64_t>, Merge> merges;
  std::unordered_map<std::string, OwnRange> own;
  // Ranks that missed a merged window: their next bundles are read every
  // kLeftoverSweepInterval until then, so that late entries get their
  // verdict.
  std::map<int64_t, SteadyClock::time_point> lateRanks;
};

struct SyncedStat {
  std::shared_ptr<const RankGroup> group; // nullptr: the default group
  std::string name;
  // The channel of the group (the default one then) when enabled: owners
  // of one channel and name are numbered apart, whichever RankGroup object
  // each was given (Python makes one per Stat).
  std::optional<ChannelId> channel;
  // Among the live owners of this channel and name, in the order enabled
  // (enableRankSync): 1 merges as `name`, k > 1 as "<name>#<k>".
  int64_t ordinal = 1;

  std::string stream() const {
    return ordinal == 1 ? name : name + "#" + std::to_string(ordinal);
  }
};

// The newest window a stream posted on a channel. Kept after its owner is
// gone: a Stat made under the name of one destroyed mid-window closes that
// window too, and posted again it would take the other's place in rank 0's
// merge; it is logged locally instead.
struct StreamPosted {
  // Expired: the channel's Store is gone, and the stream starts afresh.
  c10::weak_intrusive_ptr<c10d::Store> store;
  int64_t lastIndex;
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
  std::map<std::pair<ChannelId, std::string>, StreamPosted> streams;
  std::shared_ptr<const RankGroup> defaultGroup;
  std::deque<Outgoing> queue;
  SteadyClock::time_point lastQueued; // when the newest window was queued
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
    std::map<ChannelId, Channel> channels;
    // Problems warned about once each: "<reason>/<stat>/<rank>".
    std::unordered_set<std::string> warned;
    SteadyClock::time_point nextSweep;
    SteadyClock::time_point nextWatch;

    // Windows still to finish: the root's own ones being merged, and the
    // bundles other ranks posted that the root has not decided.
    size_t pending() const {
      size_t n = 0;
      for (const auto& [id, channel] : channels) {
        n += channel.posted.size();
        for (const auto& [where, merge] : channel.merges) {
          n += merge.hasOwn ? 1 : 0;
        }
      }
      return n;
    }
    bool anyPosted() const {
      return std::any_of(channels.begin(), channels.end(), [](const auto& c) {
        return !c.second.posted.empty();
      });
    }
    bool anyMerges() const {
      return std::any_of(channels.begin(), channels.end(), [](const auto& c) {
        return !c.second.merges.empty();
      });
    }
    bool anyOwnMerges() const {
      return std::any_of(
          channels.begin(), channels.end(), [](const auto& c) {
            return std::any_of(
                c.second.merges.begin(),
                c.second.merges.end(),
                [](const auto& m) { return m.second.hasOwn; });
          });
    }
    bool anyLateRanks() const {
      return std::any_of(channels.begin(), channels.end(), [](const auto& c) {
        return !c.second.lateRanks.empty();
      });
    }
  };

  void run() {
    // Its warnings (a failing handler, a Store error) have no caller to see
    // them: in Python they become warnings on the main thread.
    routeThreadWarningsToBackgroundSink();
    Work work;
    work.nextSweep = work.nextWatch = SteadyClock::now();
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      gatherBurst(lock);
      std::vector<Outgoing> batch(
          std::make_move_iterator(queue.begin()),
          std::make_move_iterator(queue.end()));
      queue.clear();
      busy = work.pending() + batch.size();
      const bool stop = stopping;
      const auto exitStartedAt = exitStarted;
      if (stop && batch.empty() && !work.anyOwnMerges() && !work.anyPosted()) {
        finishAtStop(work);
        break;
      }
      lock.unlock();
      postBatch(batch, work);
      const auto now = SteadyClock::now();
      const bool sweep = now >= work.nextSweep;
      for (auto& [id, channel] : work.channels) {
        if (channel.group && channel.group->rank == 0) {
          readAndMerge(channel, work, now, sweep);
        }
      }
      if (sweep) {
        work.nextSweep = now + kLeftoverSweepInterval;
      }
      if (work.anyPosted() && (now >= work.nextWatch || stop)) {
        for (auto& [id, channel] : work.channels) {
          checkPosted(channel, work, now, exitStartedAt, /*takeAllBack=*/stop);
        }
        work.nextWatch =
            now + (exitStartedAt ? kExitWatchInterval : kWatchInterval);
      }
      for (auto& [id, channel] : work.channels) {
        if (channel.posted.empty() && channel.merges.empty() &&
            channel.lateRanks.empty()) {
          channel.group.reset();
        }
      }
      lock.lock();
      busy = work.pending();
      if (!queue.empty() || (stopping && !stop)) {
        continue;
      }
      if (busy == 0) {
        idle.notify_all();
      }
      // Producers and stop requests notify under the mutex: no lost wake-up.
      if (work.anyOwnMerges()) {
        wake.wait_for(lock, kPollInterval);
      } else if (work.anyPosted()) {
        wake.wait_until(lock, work.nextWatch);
      } else if (work.anyMerges() || work.anyLateRanks()) {
        wake.wait_until(lock, work.nextSweep);
      } else if (!stopping) {
        wake.wait(lock);
      }
    }
    busy = 0;
    running = false;
    idle.notify_all();
  }

  // Windows close in bursts (every Stat's at one step); the thread, woken
  // by the first, waits until none came for kGatherQuiet (at most
  // kGatherLimit), so that one bundle carries the whole burst.
  void gatherBurst(std::unique_lock<std::mutex>& lock) {
    const auto limit = SteadyClock::now() + kGatherLimit;
    while (!queue.empty() && !stopping) {
      const auto quietAt = lastQueued + kGatherQuiet;
      const auto now = SteadyClock::now();
      if (now >= quietAt || now >= limit) {
        return;
      }
      wake.wait_until(lock, std::min(quietAt, limit));
    }
  }

  // Warns once per `key` (a reason, the stat and a rank).
  static void warnOnce(Work& work, const std::string& key, const std::string& message) {
    if (work.warned.insert(key).second) {
      TORCH_WARN(message);
    }
  }

  static Channel& channelFor(Work& work, const std::shared_ptr<const RankGroup>& group) {
    Channel& channel = work.channels[idOf(*group)];
    if (channel.store && channel.store->expired()) {
      channel = Channel{};
    }
    if (!channel.store) {
      channel.store.emplace(group->store);
    }
    channel.group = group;
    if (group->rank == 0 && channel.next.empty()) {
      channel.next.assign(size_t(group->worldSize), 1);
    }
    return channel;
  }

  // Everything one pass closed goes out as one bundle per channel (the
  // root's own windows go straight to its merges): a rank's Store traffic
  // per pass does not grow with the number of Stats.
  static void postBatch(std::vector<Outgoing>& batch, Work& work) {
    std::map<ChannelId, std::vector<Outgoing>> bundles;
    for (Outgoing& out : batch) {
      if (out.group->rank == 0) {
        Channel& channel = channelFor(work, out.group);
        addOwn(channel, std::move(out), work);
      } else {
        bundles[idOf(*out.group)].push_back(std::move(out));
      }
    }
    for (auto& [id, entries] : bundles) {
      Channel& channel = channelFor(work, entries.back().group);
      post(channel, std::move(entries), work);
    }
  }

  static void post(Channel& channel, std::vector<Outgoing> entries, Work& work) {
    const RankGroup& group = *channel.group;
    std::vector<BundleEntry> bundle;
    bundle.reserve(entries.size());
    for (const Outgoing& out : entries) {
      bundle.push_back(BundleEntry{out.stream, out.window, out.shape, out.payload});
    }
    Posted posted{channel.nextSeq, postKey(group.rank, channel.nextSeq), {}, {}};
    try {
      writeKey(*group.store, posted.key, encodeBundle(bundle));
    } catch (const std::exception& e) {
      warnOnce(
          work,
          "post/" + std::to_string(group.rank),
          "torch_monitor: could not post windows to the rank group's Store (" +
              errorMessage(e) +
              "); this rank logs such windows itself, as windows of one "
              "rank");
      for (const Outgoing& out : entries) {
        logLocally(out);
      }
      return;
    }
    ++channel.nextSeq;
    posted.entries = std::move(entries);
    posted.postedAt = SteadyClock::now();
    channel.posted.push_back(std::move(posted));
  }

  // The root closed a window: it waits for the other ranks' shares from now
  // on, for at most the deadline.
  static void addOwn(Channel& channel, Outgoing out, Work& work) {
    OwnRange& range = channel.own[out.stream];
    if (range.last < range.first) {
      range.first = out.window;
    }
    range.last = out.window;
    const auto now = SteadyClock::now();
    Merge& merge = mergeOf(channel, out.stream, out.window, now);
    merge.hasOwn = true;
    merge.group = out.group;
    merge.what = std::move(out.what);
    merge.shape = std::move(out.shape);
    merge.own = std::move(out.payload);
    merge.build = std::move(out.build);
    merge.deadline = now + out.group->deadline;
    merge.arrived[0] = true;
    // Shares that came before: each is checked now that the shape is known.
    std::vector<Share> early = std::move(merge.shares);
    merge.shares.clear();
    for (Share& share : early) {
      admit(merge, std::move(share), work);
    }
    // Earlier windows of the stream the root never closed never will be.
    auto& merges = channel.merges;
    for (auto it = merges.lower_bound({out.stream, std::numeric_limits<int64_t>::min()});
         it != merges.end() && it->first.first == out.stream &&
         it->first.second < out.window;) {
      if (it->second.hasOwn) {
        ++it;
      } else {
        refuseAll(channel, it->second, Verdict::kOrphan, work);
        it = merges.erase(it);
      }
    }
  }

  static Merge& mergeOf(
      Channel& channel,
      const std::string& stream,
      int64_t window,
      SteadyClock::time_point now) {
    auto [it, made] = channel.merges.try_emplace({stream, window});
    if (made) {
      it->second.firstSeen = now;
      it->second.arrived.assign(size_t(channel.group->worldSize), false);
    }
    return it->second;
  }

  // Decides one entry of a claimed bundle; its key is settled once all are.
  static void decide(
      const std::shared_ptr<Claimed>& bundle,
      std::optional<EntryVerdict> verdict,
      c10d::Store& store,
      Work& work) {
    if (verdict) {
      bundle->verdicts.push_back(*verdict);
    }
    if (--bundle->undecided > 0) {
      return;
    }
    try {
      if (bundle->verdicts.empty()) {
        deleteKey(store, bundle->key);
      } else {
        writeKey(store, bundle->key, encodeVerdicts(bundle->verdicts));
      }
    } catch (const std::exception& e) {
      warnOnce(
          work,
          "verdict",
          "torch_monitor: could not settle a rank's posted windows on the "
          "rank group's Store (" +
              errorMessage(e) + "); that rank logs them itself");
    }
  }

  // A share of a window whose own share the root has: merged, unless its
  // shape differs.
  static void admit(Merge& merge, Share share, Work& work) {
    const int64_t r = share.rank;
    merge.arrived[size_t(r)] = true;
    if (share.shape == merge.shape) {
      merge.shares.push_back(std::move(share));
      return;
    }
    warnOnce(
        work,
        "shape/" + merge.what + "/" + std::to_string(r),
        "torch_monitor: " + merge.what +
            " is not the same on every rank of its group: rank " +
            std::to_string(merge.group->rank) + " has " + merge.shape +
            ", rank " + std::to_string(r) + " " + share.shape + "; rank " +
            std::to_string(r) +
            "'s windows are not merged (it logs them itself). Create it the "
            "same way on every rank");
    decide(
        share.bundle,
        EntryVerdict{share.entry, Verdict::kRefused},
        *merge.group->store,
        work);
  }

  // Through the channel's Store: a merge the root never closed has no
  // group of its own (merge.group is set by addOwn).
  static void refuseAll(Channel& channel, Merge& merge, Verdict reason, Work& work) {
    for (Share& share : merge.shares) {
      decide(share.bundle, EntryVerdict{share.entry, reason}, *channel.group->store, work);
    }
    merge.shares.clear();
  }

  // The root: reads the bundles its windows wait for (every 2 ms while one
  // does), merges what is complete or past its deadline, in window order
  // within each stream, and every kLeftoverSweepInterval reads the bundles
  // of ranks that missed a window, so that their late entries get a verdict.
  static void readAndMerge(
      Channel& channel,
      Work& work,
      SteadyClock::time_point now,
      bool sweep) {
    const int64_t world = channel.group->worldSize;
    std::vector<bool> wanted(size_t(world), false);
    std::vector<bool> thorough(size_t(world), false);
    for (auto& [where, merge] : channel.merges) {
      if (!merge.hasOwn) {
        continue;
      }
      const bool due = now >= merge.deadline && !merge.readThisDeadline;
      merge.readThisDeadline = merge.readThisDeadline || due;
      for (int64_t r = 1; r < world; ++r) {
        if (!merge.arrived[size_t(r)]) {
          wanted[size_t(r)] = true;
          thorough[size_t(r)] = thorough[size_t(r)] || due;
        }
      }
    }
    if (sweep) {
      for (auto it = channel.lateRanks.begin(); it != channel.lateRanks.end();) {
        thorough[size_t(it->first)] = wanted[size_t(it->first)] = true;
        it = now >= it->second ? channel.lateRanks.erase(it) : std::next(it);
      }
    }
    try {
      readBundles(channel, wanted, thorough, work, now);
    } catch (const std::exception& e) {
      warnOnce(
          work,
          "read",
          "torch_monitor: could not read the other ranks' windows from the "
          "rank group's Store (" +
              errorMessage(e) +
              "); rank 0 merges such windows from the ranks it could read");
    }
    mergeReady(channel, work, now);
  }

  // Reads and claims the next bundle of each wanted rank that posted one:
  // one check for all of them; when not all are there, a search only for
  // the ranks due a thorough look (a window past its deadline, a sweep).
  // A rank whose bundle came is read again at once, as it may have posted
  // more (it was late, or its windows closed faster than the root looked):
  // one more check, and a search only for the ranks due a thorough look.
  static void readBundles(
      Channel& channel,
      std::vector<bool> wanted,
      std::vector<bool> thorough,
      Work& work,
      SteadyClock::time_point now) {
    c10d::Store& store = *channel.group->store;
    for (int round = 0; round < kMaxReadRounds; ++round) {
      std::vector<int64_t> ranks;
      std::vector<std::string> keys;
      for (size_t r = 1; r < wanted.size(); ++r) {
        if (wanted[r]) {
          ranks.push_back(int64_t(r));
          keys.push_back(postKey(int64_t(r), channel.next[r]));
        }
      }
      if (keys.empty()) {
        return;
      }
      if (!keysExist(store, keys)) {
        if (round == 0 && std::any_of(thorough.begin(), thorough.end(), [](bool t) { return t; })) {
          // A rank may have taken bundles back while the root was stalled:
          // read past them.
          const Bytes found = peekKey(store, claimsKey());
          channel.claims = found == kAbsentKey ? Bytes{} : found;
          skipGivenUp(channel);
          for (size_t i = 0; i < ranks.size(); ++i) {
            keys[i] = postKey(ranks[i], channel.next[size_t(ranks[i])]);
          }
        }
        std::vector<int64_t> searched;
        std::vector<std::string> searchedKeys;
        for (size_t i = 0; i < ranks.size(); ++i) {
          if (thorough[size_t(ranks[i])]) {
            searched.push_back(ranks[i]);
            searchedKeys.push_back(keys[i]);
          }
        }
        const std::vector<bool> present = keysPresent(store, searchedKeys);
        ranks.clear();
        keys.clear();
        for (size_t i = 0; i < searched.size(); ++i) {
          if (present[i]) {
            ranks.push_back(searched[i]);
            keys.push_back(std::move(searchedKeys[i]));
          }
        }
      }
      wanted.assign(wanted.size(), false);
      const std::vector<int64_t> claimed = claimFound(channel, ranks);
      keys.clear();
      for (const int64_t r : claimed) {
        keys.push_back(postKey(r, channel.next[size_t(r)]++));
        wanted[size_t(r)] = true;
      }
      const std::vector<Bytes> bundles = readKeys(store, keys);
      for (size_t i = 0; i < keys.size(); ++i) {
        file(channel, claimed[i], keys[i], bundles[i], work, now);
      }
    }
  }

  // Claims the next bundle of each of `ranks` (found in the Store), all in
  // one compareSet of the group's claims unless a rank took its bundle back
  // meanwhile (then that rank is left out, and the call repeated: its next
  // bundle is not known to be there). Returns the ranks claimed.
  static std::vector<int64_t> claimFound(
      Channel& channel,
      const std::vector<int64_t>& ranks) {
    c10d::Store& store = *channel.group->store;
    const int64_t world = channel.group->worldSize;
    std::vector<int64_t> found;
    for (const int64_t r : ranks) {
      found.push_back(channel.next[size_t(r)]);
    }
    while (!ranks.empty()) {
      Claims claims = decodeClaims(channel.claims, world);
      std::vector<int64_t> claimed;
      for (size_t i = 0; i < ranks.size(); ++i) {
        const auto r = size_t(ranks[i]);
        if (claims.givenUp[r] < found[i] && channel.next[r] == found[i]) {
          claims.claimed[r] = found[i];
          claimed.push_back(ranks[i]);
        }
      }
      if (claimed.empty()) {
        return claimed;
      }
      const Bytes desired = encodeClaims(claims);
      const Bytes current = swapKey(store, claimsKey(), channel.claims, desired);
      if (current == desired) {
        channel.claims = desired;
        return claimed;
      }
      // Another value (a rank took a bundle back) or, for a key gone,
      // what was expected: either way start from what is there.
      channel.claims = current == channel.claims ? Bytes{} : current;
      skipGivenUp(channel);
    }
    return {};
  }

  // Reads past the bundles their ranks took back (and deleted).
  static void skipGivenUp(Channel& channel) {
    const Claims claims = decodeClaims(channel.claims, channel.group->worldSize);
    for (size_t r = 1; r < channel.next.size(); ++r) {
      channel.next[r] = std::max(channel.next[r], claims.givenUp[r] + 1);
    }
  }

  // Files the entries of a bundle the root claimed: each joins its window,
  // or gets its verdict.
  static void file(
      Channel& channel,
      int64_t rank,
      const std::string& key,
      const Bytes& value,
      Work& work,
      SteadyClock::time_point now) {
    c10d::Store& store = *channel.group->store;
    auto entries = decodeBundle(value);
    if (!entries) {
      return; // not a bundle: nothing to settle
    }
    auto bundle = std::make_shared<Claimed>();
    bundle->key = key;
    bundle->undecided = entries->size() + 1; // + 1: released below
    for (uint32_t i = 0; i < entries->size(); ++i) {
      BundleEntry& entry = (*entries)[i];
      Share share{rank, std::move(entry.shape), std::move(entry.payload), bundle, i};
      const auto merge = channel.merges.find({entry.stream, entry.window});
      if (merge != channel.merges.end() && merge->second.hasOwn) {
        if (merge->second.arrived[size_t(rank)]) {
          decide(bundle, EntryVerdict{i, Verdict::kLate}, store, work);
        } else {
          admit(merge->second, std::move(share), work);
        }
        continue;
      }
      const auto range = channel.own.find(entry.stream);
      if (range != channel.own.end() && entry.window <= range->second.last) {
        // The root closed that window and merged it, or never had it.
        const bool merged = entry.window >= range->second.first;
        decide(
            bundle,
            EntryVerdict{i, merged ? Verdict::kLate : Verdict::kOrphan},
            store,
            work);
        continue;
      }
      Merge& early = mergeOf(channel, entry.stream, entry.window, now);
      if (early.arrived[size_t(rank)]) {
        decide(bundle, EntryVerdict{i, Verdict::kLate}, store, work);
      } else {
        early.arrived[size_t(rank)] = true;
        early.shares.push_back(std::move(share));
      }
    }
    decide(bundle, std::nullopt, store, work);
  }

  // Merges every window whose ranks all came or whose deadline passed, in
  // order within each stream: a window waits while an earlier window of its
  // stream is still waiting, even when its own ranks are all there, so that
  // the merged points of one tag reach the sinks in step order. Windows the
  // root has not closed wait for it up to kLeftoverDeadlines deadlines.
  static void mergeReady(Channel& channel, Work& work, SteadyClock::time_point now) {
    const std::string* blocked = nullptr;
    for (auto it = channel.merges.begin(); it != channel.merges.end();) {
      Merge& merge = it->second;
      const std::string& stream = it->first.first;
      if (!merge.hasOwn) {
        if (now >= merge.firstSeen + kLeftoverDeadlines * channel.group->deadline) {
          refuseAll(channel, merge, Verdict::kOrphan, work);
          it = channel.merges.erase(it);
        } else {
          ++it;
        }
        continue;
      }
      if ((blocked != nullptr && *blocked == stream) ||
          !(merge.complete() || now >= merge.deadline)) {
        blocked = &stream;
        ++it;
        continue;
      }
      finish(channel, merge, work, now);
      it = channel.merges.erase(it);
    }
  }

  // Logs a merged window and settles its shares; ranks that missed it are
  // read for a while, for their late entries.
  static void finish(
      Channel& channel,
      Merge& merge,
      Work& work,
      SteadyClock::time_point now) {
    std::sort(merge.shares.begin(), merge.shares.end(), [](const Share& a, const Share& b) {
      return a.rank < b.rank;
    });
    std::vector<Bytes> payloads{std::move(merge.own)};
    for (Share& share : merge.shares) {
      payloads.push_back(std::move(share.payload));
    }
    for (size_t r = 1; r < merge.arrived.size(); ++r) {
      if (!merge.arrived[r]) {
        channel.lateRanks[int64_t(r)] =
            now + kLeftoverDeadlines * merge.group->deadline;
      }
    }
    dispatchAllLogged(merge.build(payloads));
    for (Share& share : merge.shares) {
      decide(share.bundle, std::nullopt, *merge.group->store, work);
    }
  }

  // The thread stops: entries still waiting for a window the root never
  // closed get their verdict.
  static void finishAtStop(Work& work) {
    for (auto& [id, channel] : work.channels) {
      for (auto& [where, merge] : channel.merges) {
        refuseAll(channel, merge, Verdict::kOrphan, work);
      }
      channel.merges.clear();
    }
  }

  // A rank other than the root: learns, oldest first, what the root decided
  // of each bundle it posted: logs the entries the root did not merge, and
  // takes back (then logs) bundles the root did not claim in time.
  // `takeAllBack`: the thread stops, every bundle still unclaimed is taken
  // back now.
  static void checkPosted(
      Channel& channel,
      Work& work,
      SteadyClock::time_point now,
      std::optional<SteadyClock::time_point> exitStarted,
      bool takeAllBack) {
    while (!channel.posted.empty()) {
      if (!resolve(channel, channel.posted.front(), work, now, exitStarted, takeAllBack)) {
        if (!takeAllBack) {
          return;
        }
        // At stop a bundle the root holds is the root's to settle.
      }
      channel.posted.pop_front();
    }
  }

  // Takes `posted` back unless the root claimed it: one compareSet of the
  // group's claims, repeated while the root changes them. True when taken.
  static bool takeBack(Channel& channel, const Posted& posted) {
    const RankGroup& group = *channel.group;
    c10d::Store& store = *group.store;
    const auto r = size_t(group.rank);
    Bytes current = peekKey(store, claimsKey());
    while (true) {
      const Bytes expected = current == kAbsentKey ? Bytes{} : current;
      Claims claims = decodeClaims(expected, group.worldSize);
      if (claims.claimed[r] >= posted.seq) {
        return false;
      }
      claims.givenUp[r] = std::max(claims.givenUp[r], posted.seq);
      const Bytes desired = encodeClaims(claims);
      current = swapKey(store, claimsKey(), expected, desired);
      if (current == desired) {
        return true;
      }
      if (current == expected) {
        current = kAbsentKey; // deleted meanwhile: expected answers
      }
    }
  }

  // True when the bundle is settled: the root merged every entry (deleted
  // the key), wrote a verdict on some (logged here), or this rank took it
  // back (logged here).
  static bool resolve(
      Channel& channel,
      const Posted& posted,
      Work& work,
      SteadyClock::time_point now,
      std::optional<SteadyClock::time_point> exitStarted,
      bool takeAllBack) {
    const RankGroup& group = *channel.group;
    c10d::Store& store = *group.store;
    const std::string rank = std::to_string(group.rank);
    const auto where = [&](const Outgoing& out) {
      return "torch_monitor: " + out.what + ", window " +
          std::to_string(out.window) + " of rank " + rank +
          ", is not merged across ranks: ";
    };
    const std::string fallback =
        "; this rank logs such windows itself, as windows of one rank";
    try {
      const Bytes value = peekKey(store, posted.key);
      auto giveUp = posted.postedAt + kLeftoverDeadlines * group.deadline;
      if (exitStarted) {
        giveUp = std::min(giveUp, *exitStarted + group.deadline);
      }
      if (value == kAbsentKey) {
        return true; // every entry merged
      }
      if (decodeBundle(value)) {
        // Not settled yet: claimed and waiting for the root's windows, or
        // not claimed.
        if (!takeAllBack && now < giveUp) {
          return false;
        }
        if (!takeBack(channel, posted)) {
          // The root claimed it: it is the root's to settle. At exit this
          // rank stops waiting for it at the deadline.
          return exitStarted.has_value() && now >= giveUp;
        }
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(
                now - posted.postedAt);
        for (const Outgoing& out : posted.entries) {
          warnOnce(
              work,
              "gone/" + out.what,
              where(out) + "rank 0 did not take it within " +
                  std::to_string(waited.count()) +
                  " ms (rank 0 is gone or stalled)" + fallback);
          logLocally(out);
        }
        deleteKey(store, posted.key);
        return true;
      }
      const auto verdicts = decodeVerdicts(value);
      if (!verdicts) {
        return true; // foreign data under our key: left alone
      }
      for (const EntryVerdict& verdict : *verdicts) {
        if (verdict.entry >= posted.entries.size()) {
          continue;
        }
        const Outgoing& out = posted.entries[verdict.entry];
        std::string reason;
        switch (verdict.reason) {
          case Verdict::kLate:
            reason =
                "it reached the Store after rank 0 had merged the window "
                "without it (this rank was later than the deadline)";
            break;
          case Verdict::kRefused:
            reason =
                "rank 0 refused it because " + out.what +
                " is not the same on every rank (rank 0's warning says how)";
            break;
          case Verdict::kOrphan:
            reason =
                "rank 0 has no such window to merge it into (it never closed "
                "that window of an object of this name)";
            break;
        }
        warnOnce(
            work,
            std::string(1, char(verdict.reason)) + "/" + out.what,
            where(out) + reason + fallback);
        logLocally(out);
      }
      deleteKey(store, posted.key);
    } catch (const std::exception& e) {
      for (const Outgoing& out : posted.entries) {
        warnOnce(
            work,
            "store/" + out.what,
            where(out) +
                "the rank group's Store failed while this rank waited for "
                "rank 0 to take the window (" +
                errorMessage(e) + ")" + fallback +
                " (a window rank 0 took just before may then appear twice)");
        logLocally(out);
      }
    }
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
    std::shared_ptr<const RankGroup> group,
    const std::string& name) {
  RankSync& s = RankSync::get();
  std::lock_guard<std::mutex> guard(s.mutex);
  const RankGroup* resolved = group ? group.get() : s.defaultGroup.get();
  std::optional<ChannelId> channel;
  if (resolved != nullptr) {
    channel = idOf(*resolved);
  }
  std::set<int64_t> taken;
  for (const auto& [other, synced] : s.stats) {
    if (other != stat && synced.channel == channel && synced.name == name) {
      taken.insert(synced.ordinal);
    }
  }
  int64_t ordinal = 1;
  while (taken.count(ordinal) != 0) {
    ++ordinal;
  }
  s.stats[stat] = SyncedStat{std::move(group), name, channel, ordinal};
}

void disableRankSync(const void* stat) noexcept {
  RankSync& s = RankSync::get();
  std::lock_guard<std::mutex> guard(s.mutex);
  s.stats.erase(stat);
}

bool postRankPayload(
    const void* stat,
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
  // A window of the stream posted before (reopened after closeAllStats(),
  // or closed by a Stat of the name destroyed within it) would take that
  // one's place in rank 0's merge: it is logged locally.
  const std::pair<ChannelId, std::string> stream{idOf(*group), synced.stream()};
  auto known = s.streams.find(stream);
  if (known != s.streams.end() && known->second.store.expired()) {
    s.streams.erase(known);
    known = s.streams.end();
  }
  const bool posted = known != s.streams.end();
  if (posted && index <= known->second.lastIndex) {
    return false;
  }
  const int64_t firstMarker = posted
      ? std::max(known->second.lastIndex + 1, index - kMaxEmptyMarkers)
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
  for (int64_t i = firstMarker; i <= index; ++i) {
    s.queue.push_back(Outgoing{
        group,
        what,
        stream.second,
        i,
        shape,
        i == index ? std::move(payload) : emptyMarker,
        build});
  }
  s.streams.insert_or_assign(
      stream,
      StreamPosted{c10::weak_intrusive_ptr<c10d::Store>(group->store), index});
  s.lastQueued = SteadyClock::now();
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
  std::chrono::milliseconds longest{0};
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
