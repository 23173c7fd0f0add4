#!/usr/bin/env python3
"""The calling thread's cost of Stat.add(tensor), against one small torch op
on the same tensor, side by side.

  host          a CPU tensor read at the add (the default for CPU tensors)
  device path   the path accelerator tensors take (the elements copied into
                a buffer on the tensor's device, read when the window
                closes); on a machine without one, forced for CPU tensors
                with torch_monitor.testing.cpu_tensors_take_device_path()
  t.add(0)      one small torch op on the same tensor: the reference
                (issue 18: the device path's add of a 0-d tensor costs at
                most one such op, of N elements at most two)
  t.item()      what torch.monitor needs instead (on CUDA a synchronisation;
                on the CPU a plain read, so its ratio only means something
                with --device cuda, on an idle GPU: target >= 3x)

for a 0-d tensor (a loss) and a 1000-element one. Medians of --reps
interleaved repetitions of --number calls each, with their range, and the
ratios over t.add(0) measured in the same run. The clock is the thread's CPU
time on the CPU (the machines are shared) and wall time on CUDA (what
t.item() waits for is time the thread loses, not CPU time); there every
block starts and ends with torch.cuda.synchronize(), outside the timing, so
queued kernels never pile up. A benchmark, not a test.

Usage: python benchmarks/python/bench_tensor_paths.py [--device cpu|cuda]
           [--reps 9] [--number 20000]      (from outside the repository)
"""
import argparse
import contextlib
import statistics
import time
from datetime import timedelta

import torch

import torch_monitor as tm
import torch_monitor.testing  # noqa: F401


def block(fn, x, number, device):
    clock = time.perf_counter if device.type == "cuda" else time.thread_time
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = clock()
    for _ in range(number):
        fn(x)
    elapsed = clock() - start
    if device.type == "cuda":
        torch.cuda.synchronize()
    return elapsed / number * 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)
    stat = tm.Stat("bench.tensor_paths", [tm.MEAN], timedelta(hours=1))
    tensors = {"0-d": torch.tensor(1.5, device=device),
               "1000": torch.randn(1000, device=device)}
    add = stat.add
    cases = {  # name -> (function, whether CPU tensors take the device path)
        "host": (add, False),
        "device path": (add, device.type == "cpu"),
        "t.add(0)": (lambda t: t.add(0), False),
        "t.item()": (lambda t: t.item(), False),
    }
    if device.type != "cpu":
        del cases["host"]
    results = {(size, name): [] for size in tensors for name in cases}
    for rep in range(args.reps):
        for size, x in tensors.items():
            names = list(cases) if rep % 2 == 0 else list(cases)[::-1]
            for name in names:  # interleaved: every case once per repetition
                if size == "1000" and name == "t.item()":
                    continue
                fn, forced = cases[name]
                with tm.testing.cpu_tensors_take_device_path() if forced else contextlib.nullcontext():
                    results[size, name].append(block(fn, x, args.number, device))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    clock = "wall time" if device.type == "cuda" else "the calling thread's CPU time"
    print(f"device: {device} ({name}), torch {torch.__version__}, "
          f"{args.reps} reps x {args.number} calls, ns of {clock} per call")
    for size in tensors:
        reference = statistics.median(results[size, "t.add(0)"])
        for name in cases:
            xs = results[size, name]
            if not xs:
                continue
            med = statistics.median(xs)
            print(f"{size:>5} {name:<12} median {med:8.0f} ns  range {min(xs):6.0f}..{max(xs):<6.0f}"
                  f"  {med / reference:5.2f}x t.add(0)")


if __name__ == "__main__":
    main()
