#!/usr/bin/env python3
"""A Python ``torch.monitor._WaitCounter`` guard, with torch_monitor's c10
backend capturing and without it (issue 27: capturing costs at most 1.5x).

Three keys of one process:

* ``early``: first used before ``import torch_monitor``, so c10 gave it
  PyTorch's own backends only (the control plane's): a guard's cost in a
  program without torch_monitor, the reference;
* ``idle``: first used after the import (torch_monitor's backend attached),
  no capture running;
* ``capturing``: the same, while a capture takes it (a one-hour window, so
  every sample lands in one open window).

Each is ``with counter.guard(): pass``, timed with timeit (GC off), in
--reps repetitions whose three cases run back to back in a shuffled order;
the table gives the medians and the ratios to ``early``. The clock is this
thread's CPU time (the machines are shared).

A benchmark, not a test: the exit status is 0 even when a target is missed.

Usage: python benchmarks/python/bench_pytorch_counters.py [--reps 9] [--min-time 0.2]
"""

import argparse
import random
import statistics
import time
import timeit

import torch

early = torch.monitor._WaitCounter("bench.guard.early")
with early.guard():  # c10 attaches backends at the first use
    pass

import torch_monitor  # noqa: E402  (after `early`'s first use, on purpose)
from timing import calibrate  # noqa: E402

idle = torch.monitor._WaitCounter("bench.guard.idle")
capturing = torch.monitor._WaitCounter("bench.guard.capturing")
for counter in (idle, capturing):
    with counter.guard():
        pass

TARGET = 1.5  # capturing / early


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--min-time", type=float, default=0.2)
    args = parser.parse_args()

    capture = torch_monitor.capture_pytorch_counters(window_size=3600.0, include="capturing")
    cases = {name: globals()[name] for name in ("early", "idle", "capturing")}
    timers = {
        name: timeit.Timer("with c.guard(): pass", globals={"c": counter}, timer=time.thread_time)
        for name, counter in cases.items()
    }
    numbers = {name: calibrate(timer, args.min_time) for name, timer in timers.items()}
    samples = {name: [] for name in cases}
    for _ in range(args.reps):
        order = list(cases)
        random.shuffle(order)
        for name in order:
            samples[name].append(timers[name].timeit(numbers[name]) / numbers[name] * 1e9)
    capture.remove()

    medians = {name: statistics.median(values) for name, values in samples.items()}
    print(f"torch {torch.__version__}, {args.reps} repetitions, CPU time; "
          "ns per `with counter.guard(): pass`:")
    for name, ns in medians.items():
        ratio = ns / medians["early"]
        verdict = ""
        if name == "capturing":
            verdict = f" (target <= {TARGET:g}x) {'OK' if ratio <= TARGET else 'MISSED'}"
        elif name == "idle":
            verdict = f" ({ns - medians['early']:+.1f} ns)"
        print(f"  {name:9s} {ns:8.1f} ns  {ratio:.3f}x early{verdict}")


if __name__ == "__main__":
    main()
