// Memory per live Stat<double>: torch_monitor against torch::monitor (PyTorch's
// own), in one binary, printing ours/torch ratios against the spec's target
// (<= 1.5x). Not a Google Benchmark: the figure is bytes, not time.
//
// Each measurement runs in a forked child, so that no freed-but-kept memory of
// an earlier measurement hides what a stat costs. The child creates N stats on
// the heap (as a program that keeps many of them would), measures, and reports
// two figures per stat:
//   heap: bytes of malloc chunks in use (mallinfo2, headers included), the
//         repeatable figure;
//   rss:  growth of the resident set (/proc/self/statm), which also counts
//         allocator slack and page granularity.
// Each stat is measured right after construction and again after one add()
// from the creating thread (our first shard lives inside the stat; torch's
// stat has nothing to grow). Repetitions alternate the implementations;
// the table gives medians and ranges.
//
// Usage: bench_memory [N stats, default 100000] [repetitions, default 5]

#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/monitor/counters.h>
#include <torch_monitor/stat.h>

namespace {

constexpr double kTarget = 1.5;

struct Figures {
  double heap = 0; // bytes per stat
  double rss = 0;
};

double heapInUse() {
  const struct mallinfo2 info = mallinfo2();
  return double(info.uordblks) + double(info.hblkhd);
}

double residentBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr || std::fscanf(f, "%ld %ld", &pages, &resident) != 2) {
    std::perror("/proc/self/statm");
    std::exit(1);
  }
  std::fclose(f);
  return double(resident) * double(sysconf(_SC_PAGESIZE));
}

// Names are distinct and short enough for the small-string buffer, as most
// metric names in a program are ("stat.12345").
// Runs in the child; never returns: the stats are left alive (destroying them
// would log their windows, which is not what is measured).
template <typename StatT, typename Agg>
[[noreturn]] void measureInChild(
    int n, const std::vector<Agg>& aggs, bool addOne, int fd) {
  std::vector<std::unique_ptr<StatT>> stats;
  stats.reserve(n); // the vector itself is not part of a stat's cost
  std::vector<std::string> names;
  names.reserve(n);
  for (int i = 0; i < n; ++i) {
    names.push_back("stat." + std::to_string(i));
  }
  const double heap0 = heapInUse();
  const double rss0 = residentBytes();
  for (int i = 0; i < n; ++i) {
    stats.push_back(std::make_unique<StatT>(
        std::move(names[i]), aggs, std::chrono::milliseconds(60000)));
  }
  if (addOne) {
    for (auto& s : stats) {
      s->add(1.0);
    }
  }
  const double heap1 = heapInUse();
  const double rss1 = residentBytes();
  const Figures out{(heap1 - heap0) / n, (rss1 - rss0) / n};
  const ssize_t written = write(fd, &out, sizeof(out));
  _exit(written == ssize_t(sizeof(out)) ? 0 : 1);
}

template <typename StatT, typename Agg>
Figures measure(int n, const std::vector<Agg>& aggs, bool addOne) {
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    measureInChild<StatT>(n, aggs, addOne, fds[1]);
  }
  close(fds[1]);
  Figures f;
  const ssize_t got = read(fds[0], &f, sizeof(f));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got != ssize_t(sizeof(f)) || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "measurement child failed\n");
    std::exit(1);
  }
  return f;
}

struct Summary {
  double median, low, high;
};

Summary summarise(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

template <typename Agg>
std::vector<Agg> aggregations(int n) {
  if (n == 1) {
    return {Agg::MEAN};
  }
  return {Agg::VALUE, Agg::MEAN, Agg::COUNT, Agg::SUM, Agg::MAX, Agg::MIN};
}

void runCase(int n, int reps, int numAggs, bool addOne) {
  using Ours = torch_monitor::Stat<double>;
  using Torch = torch::monitor::Stat<double>;
  const auto oursAggs = aggregations<torch_monitor::Aggregation>(numAggs);
  const auto torchAggs = aggregations<torch::monitor::Aggregation>(numAggs);
  std::vector<double> oursHeap, oursRss, torchHeap, torchRss;
  for (int r = 0; r < reps; ++r) {
    // Alternate which one goes first, so both see the same drift.
    for (int k = 0; k < 2; ++k) {
      if ((k + r) % 2 == 0) {
        const Figures f = measure<Ours>(n, oursAggs, addOne);
        oursHeap.push_back(f.heap);
        oursRss.push_back(f.rss);
      } else {
        const Figures f = measure<Torch>(n, torchAggs, addOne);
        torchHeap.push_back(f.heap);
        torchRss.push_back(f.rss);
      }
    }
  }
  const std::string label = std::string("Stat<double>, ") +
      std::to_string(numAggs) + (numAggs == 1 ? " agg" : " aggs") +
      (addOne ? ", after one add" : ", constructed");
  const auto print = [&](const char* what,
                         const std::vector<double>& ours,
                         const std::vector<double>& torch) {
    const Summary o = summarise(ours), t = summarise(torch);
    const double ratio = o.median / t.median;
    std::printf(
        "%-38s %-4s torch_monitor %6.0f B [%.0f..%.0f], torch::monitor %6.0f B "
        "[%.0f..%.0f], ratio %.2fx (target <= %.1fx) %s\n",
        label.c_str(),
        what,
        o.median,
        o.low,
        o.high,
        t.median,
        t.low,
        t.high,
        ratio,
        kTarget,
        ratio <= kTarget ? "OK" : "MISSED");
  };
  print("heap", oursHeap, torchHeap);
  print("rss", oursRss, torchRss);
}

} // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 100000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  if (n < 1 || reps < 1) {
    std::fprintf(stderr, "usage: %s [N stats >= 1] [repetitions >= 1]\n", argv[0]);
    return 2;
  }
  std::printf(
      "Memory per live stat (%d stats per measurement, %d repetitions; "
      "medians [min..max]; heap = malloc chunks in use, rss = resident set "
      "growth):\n",
      n,
      reps);
  for (int numAggs : {1, 6}) {
    for (bool addOne : {false, true}) {
      runCase(n, reps, numAggs, addOne);
    }
  }
  return 0;
}
