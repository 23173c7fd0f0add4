#!/usr/bin/env python3
"""DifferenceMonitor per-forward overhead: torch_monitor against inferno.

The case of the performance spec: a CPU ``nn.Linear(64, 64)`` whose
``weight`` is monitored with a ``PassthroughReducer(1.0)``, called on a
[1, 64] input. For each implementation the harness times a forward call of
its own, identically initialised Linear; the overhead is that time minus the
time of a Linear without hooks. Target: our overhead <= 0.5x inferno's.

Method: ``timeit`` on the thread's CPU time (the workplace's machines are
shared; wall time also counts time spent descheduled), each case calibrated
to about --min-time seconds, --reps repetitions in which every case runs
back to back, in alternating order, so all see the same machine noise.
Medians are reported, and the ratio of the median overheads. Each phase
(with grad, no_grad) gets fresh modules, and the monitors are cleared
between timed batches: inferno's history keeps every recorded difference's
autograd graph alive (its memory grows ~30 KB per forward here), and freeing
that chain would otherwise land in whichever case runs next. Extra rows,
for information: the same with ``torch.no_grad()``, our scripted module
(inferno's hooks cannot be scripted), and hand-written Python hooks doing
only clone-before / subtract-after (no reducer) as a floor for Python hooks.

A benchmark, not a test: exit status 0 even when the target is missed
(marked MISSED).

Usage: python benchmarks/python/bench_difference_monitor.py
           [--reps 9] [--min-time 0.2] [--clock cpu|wall] [--threads 1]
"""

import argparse
import platform
import statistics
import sys
import time
import timeit

import torch
from torch import nn

import torch_monitor

try:
    import inferno.observe as inferno_observe
except ImportError:  # pragma: no cover - the comparison needs it
    sys.exit("this benchmark compares against inferno: pip install inferno-ai")

TARGET = 0.5
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def make_linear():
    torch.manual_seed(0)
    return nn.Linear(64, 64)


def python_difference_hooks(module):
    """The cheapest pure-Python difference hooks (no reducer): the floor."""
    state = {}

    def pre(mod, args):
        state["pre"] = mod.weight.clone()

    def post(mod, args, output):
        state["diff"] = mod.weight - state.pop("pre")

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post)
    return state


def build_cases():
    x = torch.randn(1, 64)
    plain = make_linear()
    ours = make_linear()
    ours_monitor = torch_monitor.DifferenceMonitor(
        torch_monitor.PassthroughReducer(1.0), "weight", ours
    )
    theirs = make_linear()
    theirs_monitor = inferno_observe.DifferenceMonitor(
        inferno_observe.PassthroughReducer(1.0), "weight", theirs
    )
    scripted_base = make_linear()
    scripted_monitor = torch_monitor.DifferenceMonitor(
        torch_monitor.PassthroughReducer(1.0), "weight", scripted_base
    )
    scripted = torch.jit.script(scripted_base)
    scripted_plain = torch.jit.script(make_linear())
    floor = make_linear()
    floor_state = python_difference_hooks(floor)
    monitors = (ours_monitor, theirs_monitor, scripted_monitor, floor_state)
    modules = {
        "plain": plain,
        "torch_monitor": ours,
        "inferno": theirs,
        "scripted plain": scripted_plain,
        "torch_monitor scripted": scripted,
        "python hooks floor": floor,
    }
    return x, modules, monitors


class Bench:
    """Calibrated timeit.Timers, measured in interleaved repetitions."""

    def __init__(self, timers, min_time):
        self.timers = timers
        self.numbers = {k: self._calibrate(t, min_time) for k, t in timers.items()}

    @staticmethod
    def _calibrate(timer, min_time):
        number = 1
        while True:
            elapsed = timer.timeit(number)
            if elapsed >= min_time / 10 or number >= 1 << 24:
                break
            number *= 4
        return max(1, int(number * min_time / max(elapsed, 1e-9)))

    def run(self, reps, between):
        samples = {k: [] for k in self.timers}
        labels = list(self.timers)
        for rep in range(reps):
            for label in labels if rep % 2 == 0 else labels[::-1]:
                n = self.numbers[label]
                samples[label].append(self.timers[label].timeit(n) / n * 1e9)
                between()
        return samples


def measure(grad, clock, reps, min_time):
    x, modules, monitors = build_cases()

    def clear():  # untimed: frees the recorded histories
        for monitor in monitors:
            if hasattr(monitor, "clear"):
                monitor.clear()

    timers = {}
    for label, module in modules.items():
        stmt = "f(x)" if grad else "with no_grad():\n    f(x)"
        timers[label] = timeit.Timer(
            stmt, timer=clock, globals={"f": module, "x": x, "no_grad": torch.no_grad}
        )
    for module in modules.values():  # TorchScript profiles its first runs
        for _ in range(20):
            with torch.set_grad_enabled(grad):
                module(x)
    bench = Bench(timers, min_time)
    clear()
    return bench.run(reps, clear)


def spread(xs):
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m * 50 if m else 0.0


def report(title, samples):
    med = {k: statistics.median(v) for k, v in samples.items()}
    base, sbase = med["plain"], med["scripted plain"]
    over = {
        "torch_monitor": med["torch_monitor"] - base,
        "inferno": med["inferno"] - base,
        "torch_monitor scripted": med["torch_monitor scripted"] - sbase,
        "python hooks floor": med["python hooks floor"] - base,
    }
    ratio = over["torch_monitor"] / over["inferno"]
    print(f"\n{title}")
    print(f"  {'module':<26}{'ns/forward':>12}{'spread':>9}{'overhead ns':>14}")
    for label in samples:
        o = over.get(label)
        o = f"{o:14.0f}" if o is not None else f"{'-':>14}"
        print(f"  {label:<26}{med[label]:12.0f}{spread(samples[label]):8.0f}%{o}")
    verdict = "ok" if ratio <= TARGET else "MISSED"
    print(
        f"  overhead ratio torch_monitor / inferno = {ratio:.3f}x "
        f"(target <= {TARGET}x: {verdict})"
    )
    return ratio


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1 keeps a 64x64 op on this thread, "
        "so the CPU clock sees all of it)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    print(
        f"DifferenceMonitor overhead, Linear(64, 64).weight, PassthroughReducer(1.0); "
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}, {args.threads} thread(s), clock={args.clock}, "
        f"{args.reps} reps x ~{args.min_time}s"
    )
    x, modules, monitors = build_cases()
    # The results of both monitors are checked once: equal differences.
    for label in ("torch_monitor", "inferno"):
        modules[label](x)
    assert torch.equal(monitors[0].peek(), monitors[1].peek()), "the monitors disagree"
    del x, modules, monitors
    for title, grad in (("with grad (training forward)", True), ("torch.no_grad()", False)):
        report(title, measure(grad, clock, args.reps, args.min_time))
    return 0


if __name__ == "__main__":
    sys.exit(main())
