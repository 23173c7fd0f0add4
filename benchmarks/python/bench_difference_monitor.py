#!/usr/bin/env python3
"""DifferenceMonitor per-forward overhead: torch_monitor, two hand-written hook pairs, inferno.

Three cases of issue 7, each a module called with grad mode on (a training
forward) whose weights are watched:

* ``linear``: ``nn.Linear(64, 64)``, its ``weight`` (requires grad);
* ``batchnorm``: ``nn.BatchNorm1d(64)`` in training mode, its
  ``running_mean`` (updated in place by forward, so a copy is needed);
* ``cnn``: a small CNN (3 convolutions, 3 batch norms, 4 linear layers), one
  monitor on the ``weight`` of each of its 10 layers.

Implementations, each on its own identically initialised module:

* ``plain``: no hooks (the base the overheads are measured from);
* ``torch_monitor``: ``DifferenceMonitor(PassthroughReducer(1.0, 8.0), ...)``;
* ``minimal hooks``: the smallest hand-written Python pair: the pre-hook
  clones the (detached) value, the post-hook subtracts it, and the
  difference is kept until the next forward (no history);
* ``ring hooks``: the same pair that also copies the difference into a
  preallocated ring buffer of 8 rows, the history torch_monitor keeps;
* ``inferno``: inferno-ai 0.0.5's DifferenceMonitor with the same reducer.

Last, a reducer called from Python, ``reducer(x)``, against inferno's (on
the CPU).

Overhead = median time per forward minus the plain module's. Ratios are of
overheads: torch_monitor / minimal hooks (target <= 0.7x, issue 18),
torch_monitor / ring hooks (target <= 0.5x) and torch_monitor / inferno.
With --device cuda the modules and inputs live on the GPU and each timed
batch ends with torch.cuda.synchronize() (use --clock wall there: the GPU's
time is what the forward waits for).

Method: ``timeit`` on the thread's CPU time (the machines are shared; wall
time also counts time spent descheduled), each case calibrated to about
--min-time seconds, --reps repetitions in which every implementation runs
back to back in alternating order, so all see the same machine noise.
Figures are medians with the range (min-max) of the repetitions. inferno's
history keeps every step's autograd graph, so all monitors are cleared
(untimed) between timed batches.

A benchmark, not a test: exit status 0 even when a target is missed (marked
MISSED).

Usage: python benchmarks/python/bench_difference_monitor.py
           [--reps 9] [--min-time 0.2] [--clock cpu|wall] [--cases linear,batchnorm,cnn]
           [--device cpu|cuda]
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
from timing import calibrate

try:
    import inferno.observe as inferno_observe
except ImportError:  # a GPU image may lack it: its column is left out
    inferno_observe = None

TARGETS = {"minimal hooks": 0.7, "ring hooks": 0.5}
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
RING = 8  # rows of history kept by every implementation


def make_linear():
    return nn.Linear(64, 64), torch.randn(1, 64), [("", "weight")]


def make_batchnorm():
    return nn.BatchNorm1d(64), torch.randn(8, 64), [("", "running_mean")]


def make_cnn():
    net = nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(144, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(),
        nn.Linear(16, 10), nn.ReLU(), nn.Linear(10, 10),
    )
    watched = [(name, "weight") for name, m in net.named_modules() if hasattr(m, "weight")]
    assert len(watched) == 10
    return net, torch.randn(1, 1, 12, 12), watched


CASES = {"linear": make_linear, "batchnorm": make_batchnorm, "cnn": make_cnn}


class MinimalHooks:
    """The smallest pair a user writes by hand: clone before, subtract after."""

    def __init__(self, module, attr):
        self.attr = attr
        self.before = None
        self.difference = None
        module.register_forward_pre_hook(self.pre)
        module.register_forward_hook(self.post)

    def pre(self, module, args):
        self.before = getattr(module, self.attr).detach().clone()

    def post(self, module, args, output):
        self.difference = getattr(module, self.attr).detach() - self.before

    def newest(self):
        return self.difference

    def clear(self):
        pass


class RingHooks:
    """The same pair keeping the differences in a ring buffer of RING rows."""

    def __init__(self, module, attr):
        self.attr = attr
        self.buffer = None
        self.row = 0
        self.before = None
        module.register_forward_pre_hook(self.pre)
        module.register_forward_hook(self.post)

    def pre(self, module, args):
        self.before = getattr(module, self.attr).detach().clone()

    def post(self, module, args, output):
        difference = getattr(module, self.attr).detach() - self.before
        if self.buffer is None:
            self.buffer = torch.zeros((RING, *difference.shape), device=difference.device)
        self.buffer[self.row].copy_(difference)
        self.row = (self.row + 1) % RING

    def newest(self):
        return self.buffer[(self.row - 1) % RING]

    def clear(self):
        pass


def attach(kind, root, watched, device):
    # A reducer's history is on the CPU until it is moved (inferno's too):
    # the monitored module's .to() does not move a monitor's reducer.
    monitors = []
    for name, attr in watched:
        module = root.get_submodule(name)
        if kind == "torch_monitor":
            monitors.append(torch_monitor.DifferenceMonitor(
                torch_monitor.PassthroughReducer(1.0, float(RING)).to(device), attr, module))
        elif kind == "minimal hooks":
            monitors.append(MinimalHooks(module, attr))
        elif kind == "ring hooks":
            monitors.append(RingHooks(module, attr))
        elif kind == "inferno":
            monitors.append(inferno_observe.DifferenceMonitor(
                inferno_observe.PassthroughReducer(1.0, float(RING)).to(device), attr, module))
    return monitors


KINDS = ("plain", "torch_monitor", "minimal hooks", "ring hooks") + (
    ("inferno",) if inferno_observe is not None else ())
HOOKS = KINDS[1:]


def build(case, device):
    modules, monitors = {}, {}
    x = None
    for kind in KINDS:
        torch.manual_seed(0)
        module, x, watched = CASES[case]()
        module.to(device).train()
        monitors[kind] = attach(kind, module, watched, device)
        modules[kind] = module
    return x.to(device), modules, monitors


def measure(case, clock, reps, min_time, device):
    x, modules, by_kind = build(case, device)
    monitors = [m for kind in by_kind.values() for m in kind]

    def clear():  # untimed: frees inferno's recorded graphs
        for monitor in monitors:
            monitor.clear()

    def timer(module):
        if device.type == "cuda":
            return _SyncedTimer(module, x, clock)
        return timeit.Timer("f(x)", timer=clock, globals={"f": module, "x": x})

    timers = {kind: timer(module) for kind, module in modules.items()}
    for module in modules.values():
        for _ in range(20):
            module(x)
    clear()
    numbers = {k: calibrate(t, min_time, max_number=1 << 24) for k, t in timers.items()}
    clear()
    samples = {k: [] for k in timers}
    for rep in range(reps):
        for kind in KINDS if rep % 2 == 0 else KINDS[::-1]:
            n = numbers[kind]
            samples[kind].append(timers[kind].timeit(n) / n * 1e9)
            clear()
    return samples


class _SyncedTimer:
    """timeit.Timer's timeit() for a CUDA module: the batch's time includes
    the GPU work it queued."""

    def __init__(self, module, x, clock):
        self.module, self.x, self.clock = module, x, clock

    def timeit(self, number):
        torch.cuda.synchronize()
        start = self.clock()
        for _ in range(number):
            self.module(self.x)
        torch.cuda.synchronize()
        return self.clock() - start


def check_agreement(case, device):
    """The monitors record the same differences (inferno misses in-place
    updates such as running_mean's: it keeps a reference, not a copy)."""
    x, modules, monitors = build(case, device)
    for kind in HOOKS:
        modules[kind](x)
    for i, ours in enumerate(monitors["torch_monitor"]):
        torch.testing.assert_close(ours.peek(), monitors["minimal hooks"][i].newest())
        torch.testing.assert_close(ours.peek(), monitors["ring hooks"][i].newest())
        if "inferno" in monitors and case != "batchnorm":
            torch.testing.assert_close(ours.peek(), monitors["inferno"][i].peek().detach())


def report(case, samples):
    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med["plain"]
    over = {k: med[k] - base for k in HOOKS}
    print(f"\n{case}")
    print(f"  {'implementation':<16}{'ns/forward':>12}{'range':>22}{'overhead ns':>14}")
    for kind in KINDS:
        lo, hi = min(samples[kind]), max(samples[kind])
        o = f"{over[kind]:14.0f}" if kind in over else f"{'-':>14}"
        print(f"  {kind:<16}{med[kind]:12.0f}{f'{lo:.0f}-{hi:.0f}':>22}{o}")
    for kind in HOOKS[1:]:
        ratio = over["torch_monitor"] / over[kind]
        target = TARGETS.get(kind)
        verdict = "" if target is None else (
            f" (target <= {target}x: {'ok' if ratio <= target else 'MISSED'})")
        print(f"  overhead torch_monitor / {kind:<14}= {ratio:.2f}x{verdict}")


def reducer_call(clock, reps, min_time):
    """A reducer module called from Python, ``reducer(x)`` (what a monitor
    written in Python, or a user's loop, does): torch_monitor's
    ``EMAReducer`` against inferno's, the same arguments, a 64-element
    state."""
    x = torch.randn(64)
    made = {"torch_monitor": torch_monitor.EMAReducer(1.0, 0.5, duration=float(RING))}
    if inferno_observe is not None:
        made["inferno"] = inferno_observe.EMAReducer(1.0, 0.5, duration=float(RING))
    timers = {k: timeit.Timer("f(x)", timer=clock, globals={"f": r, "x": x}) for k, r in made.items()}
    numbers = {k: calibrate(t, min_time, max_number=1 << 24) for k, t in timers.items()}
    samples = {k: [] for k in timers}
    for rep in range(reps):
        for kind in list(timers) if rep % 2 == 0 else list(timers)[::-1]:
            samples[kind].append(timers[kind].timeit(numbers[kind]) / numbers[kind] * 1e9)
    print("\nreducer call: EMAReducer(1.0, 0.5, duration=8.0)(x), x of 64 elements")
    med = {k: statistics.median(v) for k, v in samples.items()}
    for kind, v in samples.items():
        print(f"  {kind:<16}{med[kind]:12.0f}{f'{min(v):.0f}-{max(v):.0f}':>22} ns/call")
    if "inferno" in med:
        print(f"  torch_monitor / inferno = {med['torch_monitor'] / med['inferno']:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    if inferno_observe is None:
        print("inferno-ai is not installed: its column is left out (pip install inferno-ai==0.0.5)")
    # One intra-op thread keeps the small ops on this thread, so the CPU
    # clock sees all of their work.
    torch.set_num_threads(1)
    cases = [c for c in args.cases.split(",") if c]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    print(
        f"DifferenceMonitor per-forward overhead; torch {torch.__version__}, "
        f"Python {platform.python_version()}, {device} ({where}), "
        f"clock={args.clock}, {args.reps} reps x ~{args.min_time}s, grad mode on"
    )
    for case in cases:
        check_agreement(case, device)
    for case in cases:
        report(case, measure(case, CLOCKS[args.clock], args.reps, args.min_time, device))
    if device.type == "cpu":
        reducer_call(CLOCKS[args.clock], args.reps, args.min_time)
    return 0


if __name__ == "__main__":
    sys.exit(main())
