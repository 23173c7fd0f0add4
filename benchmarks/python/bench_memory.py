#!/usr/bin/env python3
"""Memory per live Stat from Python: torch_monitor against torch.monitor.

The target (issue 25): a torch_monitor.Stat costs at most 1.4x a torch.monitor.Stat.

Each measurement runs in a fresh child interpreter (so nothing freed by an
earlier measurement is reused), which creates N stats with distinct short
names ("stat.12345", as metric names usually are), keeps them alive, and
reports per stat:

  total   growth of the resident set (/proc/self/statm): everything, the figure
          the target is about;
  C heap  growth of malloc's bytes in use (mallinfo2): the C++ objects (and
          any Python object over 512 bytes);
  Python  total - C heap: mostly Python's small-object allocator (the Python
          wrapper object), plus page and allocator slack.

Each stat is measured right after construction and again after one add()
(torch_monitor's stat keeps its first thread's share of the window inside
the stat, so the figures should not differ). Repetitions alternate the two
libraries; the table gives medians and [min..max]. About 20 s.

Usage: python benchmarks/python/bench_memory.py [--n 100000] [--reps 3]
Run it from outside the repository (benchmarks/run_python.sh does), so that
`import torch_monitor` finds the installed package.
"""

import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys

TARGET = 1.4
OURS = "torch_monitor"
REF = "torch.monitor"


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


def c_heap_bytes():
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(lib_name, n):
    """Runs in a fresh interpreter; prints one JSON line of bytes per stat."""
    import torch  # noqa: F401  (both libraries need it loaded first)

    if lib_name == OURS:
        import torch_monitor as lib
    else:
        import torch.monitor as lib
    # Neither library's stat grows with the number of aggregations (both
    # keep them as bits): one is enough here (bench_memory in C++ shows 1 and 6).
    aggs = [lib.Aggregation.MEAN]
    window = datetime.timedelta(seconds=60)
    # Warm up: first-use allocations (type caches, registries) are not per stat.
    warm = [lib.Stat(f"warm.{i}", aggs, window) for i in range(100)]
    for s in warm:
        s.add(1.0)
    names = [f"stat.{i}" for i in range(n)]
    stats = [None] * n  # the list itself is not part of a stat's cost
    heap0, rss0 = c_heap_bytes(), resident_bytes()
    for i in range(n):
        stats[i] = lib.Stat(names[i], aggs, window)
    heap1, rss1 = c_heap_bytes(), resident_bytes()
    for s in stats:
        s.add(1.0)
    heap2, rss2 = c_heap_bytes(), resident_bytes()
    out = {
        "constructed": {"total": (rss1 - rss0) / n, "heap": (heap1 - heap0) / n},
        "after one add": {"total": (rss2 - rss0) / n, "heap": (heap2 - heap0) / n},
        "sizeof": sys.getsizeof(stats[0]),
    }
    print(json.dumps(out))
    sys.stdout.flush()
    # Leave without destroying the stats: destruction would log their windows.
    os._exit(0)


def measure(lib_name, n):
    out = subprocess.run(
        [sys.executable, "-P", os.path.abspath(__file__), "--child", lib_name, str(n)],
        check=True,
        capture_output=True,
        text=True,
        cwd="/",
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(xs):
    return f"{statistics.median(xs):6.0f} [{min(xs):.0f}..{max(xs):.0f}]"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100000, help="stats per measurement (default 100000)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        lib_name, n = args.child
        child(lib_name, int(n))
        return

    print(
        f"Memory per live Stat from Python ({args.n} stats per measurement, {args.reps} repetitions, "
        "bytes, medians [min..max]; total = resident set growth, C heap = malloc bytes in use, "
        "Python = total - C heap)"
    )
    samples = {OURS: [], REF: []}
    for rep in range(args.reps):
        for lib_name in (OURS, REF) if rep % 2 == 0 else (REF, OURS):
            samples[lib_name].append(measure(lib_name, args.n))
    missed = 0
    for phase in ("constructed", "after one add"):
        fig = {
            lib: {
                "total": [s[phase]["total"] for s in xs],
                "heap": [s[phase]["heap"] for s in xs],
                "python": [s[phase]["total"] - s[phase]["heap"] for s in xs],
                "sizeof": xs[0]["sizeof"],
            }
            for lib, xs in samples.items()
        }
        ratio = statistics.median(fig[OURS]["total"]) / statistics.median(fig[REF]["total"])
        ok = ratio <= TARGET
        missed += not ok
        print(f"\nStat, {phase}: ratio {ratio:.2f}x (target <= {TARGET}x) {'OK' if ok else 'MISSED'}")
        for lib in (OURS, REF):
            f = fig[lib]
            print(
                f"  {lib:14s} total {summary(f['total'])}  C heap {summary(f['heap'])}  "
                f"Python {summary(f['python'])}  (sys.getsizeof {f['sizeof']})"
            )
    print(f"\n{missed} target(s) missed" if missed else "\nno target missed")


if __name__ == "__main__":
    main()
