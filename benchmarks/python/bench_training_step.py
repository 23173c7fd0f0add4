#!/usr/bin/env python3
"""A training step with the loss logged to a Stat, three ways, side by side.

  none          the step alone (forward, backward, optimizer step)
  add(loss)     the step + ``stat.add(loss)``: the tensor stays on its device
  add(item)     the step + ``stat.add(loss.item())``: what torch.monitor needs,
                one host synchronisation per step on CUDA

Each repetition runs --steps steps of every variant, in rotating order, and
waits for the device at the end of each block, so a block's time includes
the GPU work it queued. The table gives medians over --reps repetitions with
their range, and each variant's cost over the bare step. On CUDA it also
counts the kernels and copies one ``stat.add(loss)`` queues (torch.profiler)
and runs 200 adds under ``torch.cuda.set_sync_debug_mode("error")``.

On a machine without CUDA the same steps run on the CPU, where ``.item()``
costs no synchronisation: the figures then only show that the tensor path
adds little to a step.

A benchmark, not a test: the exit status is 0 whatever the figures.

Usage: python benchmarks/python/bench_training_step.py [--reps 9] [--steps 200] [--device cuda|cpu]
"""

import argparse
import statistics
import time
from datetime import timedelta

import torch
from torch import nn

import torch_monitor as tm


def make_step(device, log):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device=device)
    y = torch.randint(0, 10, (64,), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        log(loss)

    return step


def wait(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kernels_per_add(device, stat):
    """Kernels and copies one stat.add(loss) queues on the device."""
    from torch.profiler import ProfilerActivity, profile

    loss = torch.tensor(1.5, device=device)
    stat.add(loss)  # first add allocates the window's rows
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
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)

    stat = tm.Stat("bench.loss", [tm.MEAN], timedelta(hours=1))
    variants = {
        "none": make_step(device, lambda loss: None),
        "add(loss)": make_step(device, stat.add),
        "add(item)": make_step(device, lambda loss: stat.add(loss.item())),
    }
    names = list(variants)
    for step in variants.values():  # warm-up: allocator, kernels, autograd
        for _ in range(20):
            step()
    wait(device)

    per_step = {name: [] for name in names}
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            step = variants[name]
            wait(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            wait(device)
            per_step[name].append((time.perf_counter() - start) / args.steps * 1e6)

    print(f"device: {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}, {args.reps} reps x {args.steps} steps")
    base = statistics.median(per_step["none"])
    print(f"{'variant':<12} {'us/step (median)':>17} {'range':>21} {'over none':>10}")
    for name in names:
        xs = per_step[name]
        med = statistics.median(xs)
        print(f"{name:<12} {med:>17.1f} {f'{min(xs):.1f}..{max(xs):.1f}':>21} {med - base:>+9.1f}")
    print(f"add(loss) / add(item): {statistics.median(per_step['add(loss)']) / statistics.median(per_step['add(item)']):.2f}")

    if device.type == "cuda":
        print(f"kernels and copies per stat.add(loss): {kernels_per_add(device, stat):.1f}")
        loss = torch.tensor(2.0, device=device)
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(200):
                stat.add(loss)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        print("200 adds under set_sync_debug_mode('error'): no synchronisation")


if __name__ == "__main__":
    main()
