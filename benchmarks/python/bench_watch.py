#!/usr/bin/env python3
"""watch(model) per-step overhead: torch_monitor, hand-written hooks, wandb.watch.

A training step (forward, backward, an AdamW step, or SGD with momentum with
--optimizer sgd) of an MLP
(--layers Linear(--width, --width) layers with ReLU between, batch --batch),
timed with each way of watching it, on identically initialised copies:

* ``plain``: no hooks (every overhead is measured from it);
* ``torch_monitor``: ``torch_monitor.watch(model, optimizer, what=...,
  window_steps=100)``;
* ``torch_monitor, device path``: the same with CPU tensors forced through
  the path CUDA tensors take (ATen ops, gated on the device), for reference;
* ``hand hooks``: the physical anchor of docs/watch.md: hooks a user would
  write that compute the same sufficient statistics (count, non-finite,
  zeros, sum, sum of squares, norm, min, max, |max|, update ratio) with torch
  ops into a preallocated slot tensor, without synchronising, and read it
  once per window;
* ``wandb.watch``: ``wandb.watch(model, log="all", log_freq=k)`` in offline
  mode. The loop does not call ``wandb.log``: the watch's histograms are
  computed and handed to the run (``run._log(..., commit=False)``) by its
  hooks, and a user's ``wandb.log`` would add the commit's cost on top; so
  the figure is wandb's lowest overhead. wandb is optional: ``pip install
  wandb==0.31.0`` (the benchmark says so and skips it when absent).

Scenarios: the watch's default kind (``grad``) every step; ``grad`` and
``update`` every step; all five kinds every step; and histograms of gradients and weights every k
steps (``--every-k``) as ``wandb.watch(log="all", log_freq=k)`` writes them,
against ``watch(what=("grad", "weight"), every=k, histograms_every=k,
writer=TensorBoardWriter(...))`` (and every=1 for reference).

On a GPU (--device cuda) the model, its data and the hand hooks' slots
live on the device, time is wall time (--clock wall) with the device
synchronised around each timed run, the "device path" rows are left out
(CUDA tensors take that path anyway), and each configuration's GPU
operations per step (kernels, copies and fills, counted by the profiler
over --steps steps) are printed too. Last, the device work a watch adds
to one step of a model with 8 and with 256 parameters: the optimizer's
observations are computed in batches, so it does not grow with them.

Method: CPU time of the process (--clock process, the default: the
machines are shared, and wall time also counts the time other processes
run; --clock wall for a quiet machine) over --steps steps, with --threads
intra-op threads (1 by default: on a shared 2-core machine OpenMP's spinning
threads make timings with 2 threads swing by 100x whenever another process
runs), --reps repetitions in which every configuration of a scenario runs back to
back in a shuffled order, so all see the same machine noise; medians. The
overhead ratio is median(config - plain) / median(anchor - plain).

Targets (docs/performance.md): torch_monitor <= 1.0x hand hooks; the
default watch <= 1.05x the bare step ("x bare"); with histograms, <= 0.5x
wandb.watch. A benchmark, not a test: exit status 0 even
when a target is missed (marked MISSED).

Usage: python benchmarks/python/bench_watch.py [--reps 7] [--steps 100]
           [--width 256] [--layers 4] [--batch 64] [--every-k 10]
           [--optimizer adamw|sgd] [--device cpu|cuda] [--only-device-work]
"""

import argparse
import contextlib
import os
import platform
import random
import statistics
import sys
import tempfile
import time

import torch

import torch_monitor as tm
import torch_monitor.testing  # noqa: F401

TARGET_VS_HAND = 1.0
TARGET_VS_BARE = 1.05  # the default watch, against the bare step (issue 26)
TARGET_VS_WANDB = 0.5
F64 = torch.float64
INF = float("inf")


def make_model(args):
    torch.manual_seed(0)
    layers = []
    for i in range(args.layers):
        layers.append(torch.nn.Linear(args.width, args.width))
        if i + 1 < args.layers:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(args.device)


class Loop:
    """One model, its optimizer and data; step() is one training step."""

    def __init__(self, args):
        self.model = make_model(args)
        if args.optimizer == "adamw":
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        else:
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(args.batch, args.width, generator=gen).to(args.device)
        self.step_index = 0

    def run(self, steps):
        model, optimizer, x = self.model, self.optimizer, self.x
        for _ in range(steps):
            tm.set_step(self.step_index)
            optimizer.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            self.step_index += 1


class HandHooks:
    """The anchor: the same statistics with torch ops, no synchronisation."""

    def __init__(self, loop, kinds, window=100, every=1):
        model, optimizer = loop.model, loop.optimizer
        self.loop, self.window, self.every = loop, window, every
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.modules = [m for name, m in model.named_modules() if name]
        n = len(self.params) * sum(k in kinds for k in ("grad", "weight", "update")) + len(self.modules) * sum(
            k in kinds for k in ("output", "output_grad"))
        device = self.params[0].device
        self.slots = torch.zeros(n, 12, dtype=F64, device=device)
        self.slots[:, 8:] = -INF
        self.one = torch.ones((), dtype=F64, device=device)
        self.kinds = kinds
        self.before = [torch.empty_like(p) for p in self.params] if "update" in kinds else []
        next_key = 0
        self.keys = {}
        for kind in ("grad", "weight", "update"):
            if kind in kinds:
                self.keys[kind] = list(range(next_key, next_key + len(self.params)))
                next_key += len(self.params)
        for kind in ("output", "output_grad"):
            if kind in kinds:
                self.keys[kind] = list(range(next_key, next_key + len(self.modules)))
                next_key += len(self.modules)
        self.handles = [optimizer.register_step_pre_hook(self.pre), optimizer.register_step_post_hook(self.post)]
        if "output" in kinds or "output_grad" in kinds:
            for i, m in enumerate(self.modules):
                self.handles.append(m.register_forward_hook(self.forward_hook(i)))

    def on(self):
        return self.loop.step_index % self.every == 0

    def observe(self, key, t, before=None):
        x = (t.detach() if before is None else t.detach() - before).reshape(-1)
        finite = torch.isfinite(x)
        kept = torch.where(finite, x, 0.0)
        squares = kept.square().sum(dtype=F64)
        norm = squares.sqrt()
        if before is not None:
            ratio = norm / before.norm(dtype=F64)
        else:
            ratio = torch.zeros((), dtype=F64, device=x.device)
        sums = torch.stack([(~finite).sum(dtype=F64), (x == 0).sum(dtype=F64), kept.sum(dtype=F64),
                            squares, norm, self.one, ratio])
        extremes = torch.stack([torch.where(finite, -x, -INF).amax(), torch.where(finite, x, -INF).amax(),
                                kept.abs().amax()]).to(F64)
        row = self.slots[key]
        row[0].add_(x.numel())
        row[1:8].add_(sums)
        torch.maximum(row[8:11], extremes, out=row[8:11])

    def forward_hook(self, i):
        def hook(module, args, output):
            if not self.on():
                return
            if "output" in self.kinds:
                self.observe(self.keys["output"][i], output)
            if "output_grad" in self.kinds and output.requires_grad:
                output.register_hook(lambda g: self.observe(self.keys["output_grad"][i], g))
        return hook

    def pre(self, optimizer, args, kwargs):
        if not self.on():
            return
        if "grad" in self.kinds:
            for key, p in zip(self.keys["grad"], self.params):
                if p.grad is not None:
                    self.observe(key, p.grad)
        if "update" in self.kinds:
            with torch.no_grad():
                torch._foreach_copy_(self.before, self.params)

    def post(self, optimizer, args, kwargs):
        if self.on():
            if "weight" in self.kinds:
                for key, p in zip(self.keys["weight"], self.params):
                    self.observe(key, p)
            if "update" in self.kinds:
                for key, p, b in zip(self.keys["update"], self.params, self.before):
                    self.observe(key, p, b)
        if (self.loop.step_index + 1) % self.window == 0:
            self.slots.cpu()  # the window's read (a copy on a device)
            self.slots[:, :8] = 0
            self.slots[:, 8:] = -INF

    def remove(self):
        for h in self.handles:
            h.remove()


@contextlib.contextmanager
def maybe_device_path(on):
    if on:
        with tm.testing.cpu_tensors_take_device_path():
            yield
    else:
        yield


def scenarios(args, writer, wandb):
    k = args.every_k
    out = []
    for title, kinds in [("grad (the default), every step", ("grad",)),
                         ("grad + update, every step", ("grad", "update")),
                         ("all five kinds, every step", ("grad", "weight", "update", "output", "output_grad"))]:
        configs = {
            "plain": lambda loop: None,
            "hand hooks": lambda loop, kinds=kinds: HandHooks(loop, kinds),
            "torch_monitor": lambda loop, kinds=kinds: tm.watch(
                loop.model, loop.optimizer, what=kinds, window_steps=100),
            "torch_monitor, device path": lambda loop, kinds=kinds: tm.watch(
                loop.model, loop.optimizer, what=kinds, window_steps=100),
        }
        if args.device != "cpu":
            del configs["torch_monitor, device path"]  # the path a device's tensors take anyway
        out.append((title, configs, "hand hooks", TARGET_VS_HAND))
    hist = {
        "plain": lambda loop: None,
        f"torch_monitor every={k}": lambda loop: tm.watch(
            loop.model, loop.optimizer, what=("grad", "weight"), window_steps=100, every=k,
            histograms_every=k, writer=writer),
        "torch_monitor every=1": lambda loop: tm.watch(
            loop.model, loop.optimizer, what=("grad", "weight"), window_steps=100,
            histograms_every=k, writer=writer),
    }
    if wandb is not None:
        hist["wandb.watch"] = lambda loop: wandb.watch(loop.model, log="all", log_freq=k)
    out.append((f"histograms of grads and weights every {k} steps (wandb log='all', log_freq={k})",
                hist, "wandb.watch" if wandb is not None else None, TARGET_VS_WANDB))
    return out


def synchronize(args):
    if args.device != "cpu":
        torch.cuda.synchronize(args.device)


def device_ops_per_step(args, loop):
    """GPU operations (kernels, copies, fills) per step, counted by the profiler."""
    from torch.profiler import ProfilerActivity, profile

    synchronize(args)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        loop.run(args.steps)
        synchronize(args)
    return sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events()) / args.steps


def run_scenario(args, title, configs, anchor, target):
    clock = time.process_time if args.clock == "process" else time.perf_counter
    loops = {}
    for name, attach in configs.items():
        loop = Loop(args)
        with maybe_device_path(name.endswith("device path")):
            attach(loop)
        loops[name] = loop
        with maybe_device_path(name.endswith("device path")):
            loop.run(10)  # warm up
    times = {name: [] for name in configs}
    names = list(configs)
    rng = random.Random(0)
    for _ in range(args.reps):
        rng.shuffle(names)
        for name in names:
            with maybe_device_path(name.endswith("device path")):
                synchronize(args)
                start = clock()
                loops[name].run(args.steps)
                synchronize(args)
                times[name].append((clock() - start) / args.steps)
    med = {name: statistics.median(t) for name, t in times.items()}
    plain = med["plain"]

    def base(name):
        return plain

    over = {name: med[name] - base(name) for name in configs}
    anchor_over = over[anchor] if anchor else None
    ops = {name: device_ops_per_step(args, loop) for name, loop in loops.items()} if args.device != "cpu" else {}
    print(f"\n{title}")
    print(f"  {'configuration':<30}{'per step':>12}{'x bare':>8}{'overhead':>12}{'range':>20}{'ratio':>14}"
          + (f"{'GPU ops/step':>14}" if ops else ""))
    for name in configs:
        lo, hi = min(times[name]) - base(name), max(times[name]) - base(name)
        ratio = ""
        if anchor and name not in (anchor, "plain"):
            r = over[name] / anchor_over
            if name.startswith("torch_monitor") and not name.endswith(("device path", "every=1")):
                ratio = f"{r:.2f}x" + ("" if r <= target else " MISSED")
            else:
                ratio = f"({r:.2f}x)"  # for reference, no target
        bare = med[name] / plain
        missed = name == "torch_monitor" and "(the default)" in title and bare > TARGET_VS_BARE
        print(f"  {name:<30}{med[name] * 1e6:>10.0f}us{bare:>7.2f}x{over[name] * 1e6:>10.0f}us"
              f"{f'[{lo * 1e6:.0f}, {hi * 1e6:.0f}]':>20}{ratio:>14}"
              + (f"{ops[name]:>14.1f}" if ops else "") + ("  (x bare: MISSED)" if missed else ""))
    return over


def report_device_work(args):
    what = "GPU kernels and copies" if args.device != "cpu" else "ATen ops (device path forced, views left out)"
    print(f"\ndevice work a watch adds per step, against the number of parameters ({what}):")
    print(f"  {'what is watched':<34}{'8 parameters':>14}{'256 parameters':>16}")
    for title, kinds in [("grad (the default)", ("grad",)),
                         ("grad, update", ("grad", "update")),
                         ("grad, weight, update", ("grad", "weight", "update"))]:
        few, many = (tm.testing.watch_device_work(layers, kinds, args.device) for layers in (4, 128))
        print(f"  {title:<34}{few:>14}{many:>16}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--every-k", type=int, default=10)
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                        help="the step's optimizer: AdamW (issue 26's reference), or SGD with momentum")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (a CUDA device: wall time)")
    parser.add_argument("--clock", choices=["process", "wall"], default=None,
                        help="process (the default on CPU) or wall (the default, and the only sane one, on a GPU)")
    parser.add_argument("--only-device-work", action="store_true",
                        help="only the last table (device work against the number of parameters)")
    args = parser.parse_args()
    args.clock = args.clock or ("process" if args.device == "cpu" else "wall")
    torch.set_num_threads(args.threads)
    try:
        import wandb
    except ImportError:
        wandb = None
    device = torch.cuda.get_device_name(args.device) if args.device != "cpu" else "CPU"
    print(f"torch {torch.__version__}, torch_monitor {tm.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, {torch.get_num_threads()} intra-op threads, device: {device}")
    print(f"MLP: {args.layers} x Linear({args.width}, {args.width}), batch {args.batch}, {args.optimizer}; "
          f"{args.reps} reps x {args.steps} steps, medians of {args.clock} time")
    if args.only_device_work:
        report_device_work(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        if wandb is None:
            print("wandb is not installed: its rows are skipped (pip install wandb==0.31.0)")
        else:
            print(f"wandb {wandb.__version__}, offline")
            wandb.init(mode="offline", dir=tmp, project="bench_watch",
                       settings=wandb.Settings(x_disable_stats=True, console="off"))
        writer = tm.TensorBoardWriter(os.path.join(tmp, "tb"))
        for title, configs, anchor, target in scenarios(args, writer, wandb):
            run_scenario(args, title, configs, anchor, target)
        writer.close()
        if wandb is not None:
            wandb.finish()
    report_device_work(args)
    tm.set_step(None)


if __name__ == "__main__":
    sys.exit(main())
