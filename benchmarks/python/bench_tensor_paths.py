#!/usr/bin/env python3
"""The CPU cost of Stat.add(tensor) on its two paths, side by side.

  host          a CPU tensor read at the add (the default for CPU tensors)
  device path   the path accelerator tensors take (a summary row appended to
                a buffer on the tensor's device, read when the window
                closes), forced for CPU tensors with
                torch_monitor.testing.cpu_tensors_take_device_path()

for a 0-d tensor (a loss) and a 1000-element one. On a machine without a GPU
this is the host-side cost of queuing an accelerator add (locking, dispatch,
one copy for a scalar). Medians of 7 interleaved repetitions of 20000 adds,
with their range. A benchmark, not a test.

Usage: python benchmarks/python/bench_tensor_paths.py   (from outside the repository)
"""
import statistics
import timeit
from datetime import timedelta

import torch

import torch_monitor as tm
import torch_monitor.testing  # noqa: F401



def main():
    torch.set_num_threads(1)
    stat = tm.Stat("bench.tensor_paths", [tm.MEAN], timedelta(hours=1))
    tensors = {"0-d": torch.tensor(1.5), "1000": torch.randn(1000)}
    results = {f"{path} {size}": [] for size in tensors for path in ("host", "device path")}
    n = 20000
    for _ in range(7):
        for name in results:  # interleaved: every case once per repetition
            path, size = name.rsplit(" ", 1)
            x = tensors[size]
            if path == "device path":
                with tm.testing.cpu_tensors_take_device_path():
                    seconds = timeit.timeit(lambda: stat.add(x), number=n)
            else:
                seconds = timeit.timeit(lambda: stat.add(x), number=n)
            results[name].append(seconds / n * 1e9)
    for name, xs in results.items():
        print(f"stat.add(t), {name:18s} median {statistics.median(xs):8.0f} ns  range {min(xs):.0f}..{max(xs):.0f}")


if __name__ == "__main__":
    main()
