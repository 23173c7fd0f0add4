#!/usr/bin/env python3
"""A training step with its loss logged by torch_monitor and by its peers,
side by side (issue 18's table).

  nothing                       the step alone (forward, backward, SGD step)
  Stat.add(loss)                ours: the tensor stays on its device
  tm Stat.add(loss.item())      torch.monitor (PyTorch's own) needs a number:
                                on CUDA one host synchronisation per step
  SummaryWriter.add_scalar(item) torch.utils.tensorboard, also with .item()
  TensorBoardWriter.add_scalar  ours: the tensor is copied on its device and
                                read when the writer writes
  MeanMetric.update(loss)       torchmetrics, when it is installed (pinned in
                                benchmarks/requirements.txt); left out, saying
                                so, when it is not

Two MLP shapes (width x depth, batch), the issue's on CUDA: 1024x6 with a
batch of 1024 (launch-bound on an H200) and 2048x4 with a batch of 2048
(GPU-bound). On the CPU those take seconds a step; its defaults are a step
that dispatch dominates (128x6, batch 32) and one that arithmetic dominates
(512x4, batch 128); --shapes sets others. Each repetition runs --steps steps
of every variant, in rotating order, and waits for the device at the end of
each block, so a block's time includes the GPU work it queued. The clock is
wall time on CUDA and the thread's CPU time on the CPU (the machines are
shared; the writers' own background threads are not counted there).
Printed: medians over --reps repetitions with their range, and each variant
as a ratio over the bare step of the same run. On CUDA it also counts the kernels and copies
one Stat.add(loss) queues (torch.profiler) and runs 200 adds under
torch.cuda.set_sync_debug_mode("error").

On the CPU, .item() costs no synchronisation: the figures there only show
what each call adds to a step's host time.

A benchmark, not a test: the exit status is 0 whatever the figures.

Usage: python benchmarks/python/bench_training_step.py [--reps 9] [--steps N]
           [--device cuda|cpu] [--shapes 1024x6:1024,2048x4:2048]
"""

import argparse
import statistics
import tempfile
import time
from datetime import timedelta

import torch
from torch import nn
from torch.monitor import Stat as TorchStat
from torch.monitor import Aggregation as TorchAggregation
from torch.utils.tensorboard import SummaryWriter

import torch_monitor as tm

try:
    from torchmetrics.aggregation import MeanMetric
except ImportError:
    MeanMetric = None

SHAPES = {"cuda": "1024x6:1024,2048x4:2048", "cpu": "128x6:32,512x4:128"}


def parse_shapes(text):
    """'1024x6:1024,...' -> [(width, depth, batch), ...]"""
    shapes = []
    for part in text.split(","):
        size, batch = part.split(":")
        width, depth = size.split("x")
        shapes.append((int(width), int(depth), int(batch)))
    return shapes


def make_step(device, shape, log):
    width, depth, batch = shape
    torch.manual_seed(0)
    layers = []
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        log(loss)

    return step


def loggers(device, logdir):
    """variant name -> function of the loss, and the objects to close."""
    stat = tm.Stat("bench.loss", [tm.MEAN], timedelta(hours=1))
    theirs = TorchStat("bench.loss.theirs", [TorchAggregation.MEAN], timedelta(hours=1))
    summary = SummaryWriter(f"{logdir}/summary_writer")
    ours = tm.TensorBoardWriter(f"{logdir}/ours")
    variants = {
        "nothing": lambda loss: None,
        "Stat.add(loss)": stat.add,
        "tm Stat.add(loss.item())": lambda loss: theirs.add(loss.item()),
        "SummaryWriter.add_scalar(item)": lambda loss: summary.add_scalar("loss", loss.item()),
        "TensorBoardWriter.add_scalar": lambda loss: ours.add_scalar("loss", loss),
    }
    if MeanMetric is not None:
        metric = MeanMetric().to(device)
        variants["MeanMetric.update(loss)"] = metric.update
    return variants, stat, (summary, ours)


def wait(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_shape(device, shape, variants, reps, steps):
    clock = time.perf_counter if device.type == "cuda" else time.thread_time
    steps_of = {name: make_step(device, shape, log) for name, log in variants.items()}
    names = list(steps_of)
    for step in steps_of.values():  # warm-up: allocator, kernels, autograd
        for _ in range(10):
            step()
    wait(device)
    per_step = {name: [] for name in names}
    for rep in range(reps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            step = steps_of[name]
            wait(device)
            start = clock()
            for _ in range(steps):
                step()
            wait(device)
            per_step[name].append((clock() - start) / steps * 1e6)
    return per_step


def kernels_per_add(device, stat):
    """Kernels and copies one stat.add(loss) queues on the device."""
    from torch.profiler import ProfilerActivity, profile

    loss = torch.tensor(1.5, device=device)
    stat.add(loss)  # the first add allocates the window's buffer
    wait(device)
    n = 100
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            stat.add(loss)
        wait(device)
    on_device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(on_device) / n


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per block (default: 100)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shapes", default=None,
                        help="width x depth : batch, comma-separated (default: the issue's on CUDA)")
    args = parser.parse_args()
    device = torch.device(args.device)
    shapes = parse_shapes(args.shapes or SHAPES["cuda" if device.type == "cuda" else "cpu"])
    steps = args.steps or 100
    if device.type == "cpu":
        torch.set_num_threads(1)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, 1 thread"
    print(f"device: {device} ({name}), torch {torch.__version__}, "
          f"{args.reps} reps x {steps} steps per variant, medians of interleaved blocks")
    if MeanMetric is None:
        print("torchmetrics is not installed: MeanMetric.update(loss) left out "
              "(pip install -r benchmarks/requirements.txt)")
    with tempfile.TemporaryDirectory() as logdir:
        variants, stat, writers = loggers(device, logdir)
        for shape in shapes:
            width, depth, batch = shape
            per_step = time_shape(device, shape, variants, args.reps, steps)
            base = statistics.median(per_step["nothing"])
            print(f"\nMLP {width}x{depth}, batch {batch}")
            print(f"  {'loss logged with':<32} {'us/step':>10} {'range':>21} {'/ nothing':>10}")
            for variant, xs in per_step.items():
                med = statistics.median(xs)
                print(f"  {variant:<32} {med:>10.1f} {f'{min(xs):.1f}..{max(xs):.1f}':>21} "
                      f"{med / base:>9.3f}x")
        if device.type == "cuda":
            print(f"\nkernels and copies per Stat.add(loss): {kernels_per_add(device, stat):.1f}")
            loss = torch.tensor(2.0, device=device)
            torch.cuda.set_sync_debug_mode("error")
            try:
                for _ in range(200):
                    stat.add(loss)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            print("200 adds under set_sync_debug_mode('error'): no synchronisation")
        for writer in writers:
            writer.close()


if __name__ == "__main__":
    main()
