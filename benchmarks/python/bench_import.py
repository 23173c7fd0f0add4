#!/usr/bin/env python3
"""What `import torch_monitor` adds to `import torch`, in fresh processes.

Each repetition starts two fresh interpreters back to back, in alternating
order: one that imports torch, one that imports torch then torch_monitor;
each reports its own import time (time.perf_counter around the imports).
The table gives medians over --reps repetitions with their range, the
difference, and whether the PT2 machinery (torch._dynamo,
torch.export._trace) was imported. Target (issue 16): at most 150 ms added,
neither module imported.

A benchmark, not a test: the exit status is 0 whatever the figures.

Usage: python benchmarks/python/bench_import.py [--reps 9]   (from outside the repository)
"""

import argparse
import json
import statistics
import subprocess
import sys

CHILD = """
import json, sys, time
start = time.perf_counter()
import torch
torch_done = time.perf_counter()
if {ours}:
    import torch_monitor
end = time.perf_counter()
print(json.dumps({{
    "torch": torch_done - start,
    "total": end - start,
    "dynamo": "torch._dynamo" in sys.modules,
    "export_trace": "torch.export._trace" in sys.modules,
}}))
"""


def run(ours: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-P", "-c", CHILD.format(ours=ours)],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    plain, ours = [], []
    for rep in range(args.reps):
        order = (False, True) if rep % 2 == 0 else (True, False)
        for with_ours in order:
            (ours if with_ours else plain).append(run(with_ours))
    torch_only = [r["total"] * 1e3 for r in plain]
    with_package = [r["total"] * 1e3 for r in ours]
    added = [r["total"] * 1e3 - r["torch"] * 1e3 for r in ours]
    print(f"fresh processes, {args.reps} reps each, medians (range), ms")
    print(f"  import torch                   {statistics.median(torch_only):8.1f}  ({min(torch_only):.0f}..{max(torch_only):.0f})")
    print(f"  import torch, torch_monitor    {statistics.median(with_package):8.1f}  ({min(with_package):.0f}..{max(with_package):.0f})")
    print(f"  import torch_monitor alone     {statistics.median(added):8.1f}  ({min(added):.0f}..{max(added):.0f})   target <= 150")
    print(f"  imports torch._dynamo: {any(r['dynamo'] for r in ours)}, "
          f"torch.export._trace: {any(r['export_trace'] for r in ours)}   target: neither")


if __name__ == "__main__":
    main()
