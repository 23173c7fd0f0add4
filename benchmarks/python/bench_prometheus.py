"""Does scraping slow Stat.add? Stat.add's cost with and without a client
scraping a PrometheusExporter in a tight loop from another process.

A scrape renders the snapshot the exporter keeps from closed windows; it
never touches a Stat, and holds the snapshot's lock only to copy pointers. The exporter holds
many stats (so that each scrape has work to do) and the measured stat
closes windows while it runs (1 ms windows: the snapshot is updated
throughout). Each case prints the median of its reps with the range.

Cases, interleaved: "idle" (nothing else runs), "busy" (another process
spins a core: the control), "scraped" (another process scrapes /metrics in
a loop).

Usage: python benchmarks/python/bench_prometheus.py [--reps N] [--adds N]
(run it from outside the repository so the installed package is imported).
"""

import argparse
import statistics
import subprocess
import sys
import time

import torch_monitor as tm


# The control: a process that keeps a core busy without touching the
# exporter. On a machine with few cores the scraper slows Stat.add by taking
# CPU; "scraped" close to "busy" means the exporter itself blocks nothing.
BUSY = """
print("ready", flush=True)
print(0, flush=True)
while True:
    pass
"""

# The scraping client is another process: a Python thread would compete
# with the measured loop for the GIL, which says nothing about the exporter.
SCRAPER = """
import sys, urllib.request
url, n = sys.argv[1], 0
print("ready", flush=True)
while True:
    with urllib.request.urlopen(url, timeout=5) as r:
        r.read()
    n += 1
    if n % 20 == 0:
        print(n, flush=True)
"""


def add_ns(stat, adds):
    start = time.perf_counter_ns()
    for i in range(adds):
        stat.add(float(i))
    return (time.perf_counter_ns() - start) / adds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--adds", type=int, default=200_000)
    args = parser.parse_args()
    exporter = tm.PrometheusExporter(labels={"job": "bench"})
    exporter.register()
    others = [tm.Stat(f"s{k}", [tm.MEAN, tm.COUNT, tm.MAX], 3600.0) for k in range(200)]
    for s in others:
        s.add(1.0)
    tm._close_all_stats()
    stat = tm.Stat("x", [tm.MEAN, tm.COUNT], 0.001)
    results = {"idle": [], "busy": [], "scraped": []}
    scrapes = 0
    add_ns(stat, args.adds)  # warm up
    for _ in range(args.reps):
        for case in results:
            client = None
            if case != "idle":
                client = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        SCRAPER if case == "scraped" else BUSY,
                        f"http://127.0.0.1:{exporter.port}/metrics",
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                client.stdout.readline()  # "ready"
                client.stdout.readline()  # (20 scrapes done: in full swing)
            results[case].append(add_ns(stat, args.adds))
            if client:
                client.kill()
                lines = client.communicate()[0].split()
                if case == "scraped":
                    scrapes += int(lines[-1]) if lines else 20
    print(f"scrape size: {len(exporter.render())} bytes, {len(others) + 1} stats")
    for case, values in results.items():
        print(
            f"Stat.add, {case:8s}: median {statistics.median(values):6.1f} ns "
            f"(range {min(values):.1f} .. {max(values):.1f}, {args.reps} reps)"
        )
    print(f"scrapes during the scraped reps: at least {scrapes}")
    exporter.close()


if __name__ == "__main__":
    main()
