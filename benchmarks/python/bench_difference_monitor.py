#!/usr/bin/env python3
"""DifferenceMonitor per-forward overhead: torch_monitor, hand-written hooks, inferno.

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
* ``hand hooks``: the minimal hand-written Python pair a user would write:
  the pre-hook clones the (detached) value, the post-hook subtracts and
  copies the difference into a preallocated ring buffer of 8 rows;
* ``inferno``: inferno-ai 0.0.5's DifferenceMonitor with the same reducer.

Overhead = median time per forward minus the plain module's. Ratios are of
overheads: torch_monitor / hand hooks (target <= 1.0x, aim 0.5x) and
torch_monitor / inferno.

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
except ImportError:  # pragma: no cover - the comparison needs it
    sys.exit("this benchmark compares against inferno: pip install inferno-ai")

TARGET_VS_HAND = 1.0
AIM_VS_HAND = 0.5
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


class HandHooks:
    """What a user writes by hand: clone before, subtract after, ring buffer."""

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
            self.buffer = torch.zeros((RING, *difference.shape))
        self.buffer[self.row].copy_(difference)
        self.row = (self.row + 1) % RING

    def clear(self):
        pass


def attach(kind, root, watched):
    monitors = []
    for name, attr in watched:
        module = root.get_submodule(name)
        if kind == "torch_monitor":
            monitors.append(torch_monitor.DifferenceMonitor(
                torch_monitor.PassthroughReducer(1.0, float(RING)), attr, module))
        elif kind == "hand hooks":
            monitors.append(HandHooks(module, attr))
        elif kind == "inferno":
            monitors.append(inferno_observe.DifferenceMonitor(
                inferno_observe.PassthroughReducer(1.0, float(RING)), attr, module))
    return monitors


KINDS = ("plain", "torch_monitor", "hand hooks", "inferno")


def build(case):
    modules, monitors = {}, []
    x = None
    for kind in KINDS:
        torch.manual_seed(0)
        module, x, watched = CASES[case]()
        module.train()
        monitors += attach(kind, module, watched)
        modules[kind] = module
    return x, modules, monitors


def measure(case, clock, reps, min_time):
    x, modules, monitors = build(case)

    def clear():  # untimed: frees inferno's recorded graphs
        for monitor in monitors:
            monitor.clear()

    timers = {
        kind: timeit.Timer("f(x)", timer=clock, globals={"f": module, "x": x})
        for kind, module in modules.items()
    }
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


def check_agreement(case):
    """The monitors record the same differences (inferno misses in-place
    updates such as running_mean's: it keeps a reference, not a copy)."""
    x, modules, monitors = build(case)
    for kind in ("torch_monitor", "hand hooks", "inferno"):
        modules[kind](x)
    per_kind = len(monitors) // 3
    ours = monitors[:per_kind]
    hand = monitors[per_kind:2 * per_kind]
    theirs = monitors[2 * per_kind:]
    for a, b, c in zip(ours, hand, theirs):
        torch.testing.assert_close(a.peek(), b.buffer[0])
        if case != "batchnorm":
            torch.testing.assert_close(a.peek(), c.peek().detach())


def report(case, samples):
    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med["plain"]
    over = {k: med[k] - base for k in KINDS[1:]}
    print(f"\n{case}")
    print(f"  {'implementation':<16}{'ns/forward':>12}{'range':>22}{'overhead ns':>14}")
    for kind in KINDS:
        lo, hi = min(samples[kind]), max(samples[kind])
        o = f"{over[kind]:14.0f}" if kind in over else f"{'-':>14}"
        print(f"  {kind:<16}{med[kind]:12.0f}{f'{lo:.0f}-{hi:.0f}':>22}{o}")
    vs_hand = over["torch_monitor"] / over["hand hooks"]
    vs_inferno = over["torch_monitor"] / over["inferno"]
    verdict = "ok" if vs_hand <= TARGET_VS_HAND else "MISSED"
    aim = " (aim 0.5x reached)" if vs_hand <= AIM_VS_HAND else ""
    print(
        f"  overhead torch_monitor / hand hooks = {vs_hand:.2f}x "
        f"(target <= {TARGET_VS_HAND}x: {verdict}){aim}"
    )
    print(f"  overhead torch_monitor / inferno    = {vs_inferno:.2f}x")
    return vs_hand, vs_inferno


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    # One intra-op thread keeps the small ops on this thread, so the CPU
    # clock sees all of their work.
    torch.set_num_threads(1)
    cases = [c for c in args.cases.split(",") if c]
    print(
        f"DifferenceMonitor per-forward overhead; torch {torch.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()}, "
        f"clock={args.clock}, {args.reps} reps x ~{args.min_time}s, grad mode on"
    )
    for case in cases:
        check_agreement(case)
    for case in cases:
        report(case, measure(case, CLOCKS[args.clock], args.reps, args.min_time))
    return 0


if __name__ == "__main__":
    sys.exit(main())
