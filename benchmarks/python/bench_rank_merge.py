"""Cost of merging a Stat's windows across ranks (Stat(..., sync_ranks=True)).

Starts --world gloo ranks on 127.0.0.1 (a TCPStore) and, in interleaved
repetitions, measures on each rank:
  - per window, on the training thread: closing a window of a synced Stat
    (it queues the window; the Store round trips run on the rank sync
    thread), against a user's own dist.all_reduce of the window's aggregates
    (what one would write without sync_ranks);
  - per window, end to end: the time until rank 0 has logged every merged
    window (posts, checks, gets and deletes on the Store), divided by the
    windows;
  - add() with and without sync_ranks (their ratio should be about 1.0).
Prints medians with [min, max] over the repetitions (for add(), over 5
interleaved pairs per repetition), from rank 0.

Usage: python benchmarks/python/bench_rank_merge.py [--world 2] [--windows 300] [--reps 5]
(run it from outside the repository so the installed package is imported).
"""

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_monitor as tm

AGGREGATIONS = ["mean", "count", "sum", "min", "max"]


def synced_windows(windows, name):
    """Seconds per window: training thread, and until every merge is logged."""
    stat = tm.Stat(name, AGGREGATIONS, window_steps=1, sync_ranks=True)
    dist.barrier()
    start = time.perf_counter()
    for step in range(windows):
        tm.set_step(step)
        stat.add(1.0)  # closes the previous window: queues it
    loop = time.perf_counter() - start
    tm.set_step(windows)
    del stat  # posts the last window
    tm._C._flush_rank_sync()  # rank 0: every window merged and logged
    total = time.perf_counter() - start
    dist.barrier()
    return loop / windows, total / windows


def all_reduce_windows(windows, name):
    """Seconds per window of a user's own merge: one all_reduce of the aggregates."""
    stat = tm.Stat(name, AGGREGATIONS, window_steps=1)
    dist.barrier()
    start = time.perf_counter()
    for step in range(windows):
        tm.set_step(step)
        stat.add(1.0)
        agg = stat.get()
        t = torch.tensor([agg[tm.SUM], agg[tm.COUNT]], dtype=torch.float64)
        dist.all_reduce(t)
    per = (time.perf_counter() - start) / windows
    dist.barrier()
    return per


def add_cost(sync, name, n=100_000):
    stat = tm.Stat(name, AGGREGATIONS, window_size=3600.0,
                   sync_ranks=True if sync else False)
    add = stat.add
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        add(1.0)
    per = (time.perf_counter() - start) / n
    del stat, add  # posts its window: merged before the next measurement
    tm._C._flush_rank_sync()
    return per


def rank_main(rank, world, port, windows, reps, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    rows = {"sync_thread": [], "sync_total": [], "all_reduce": [],
            "add_plain": [], "add_sync": []}
    for rep in range(reps):  # interleaved: drift hits every variant alike
        thread, total = synced_windows(windows, f"w{rep}")
        rows["sync_thread"].append(thread)
        rows["sync_total"].append(total)
        rows["all_reduce"].append(all_reduce_windows(windows, f"r{rep}"))
        for pair in range(5):  # add() is short: more, interleaved pairs
            rows["add_plain"].append(add_cost(False, f"p{rep}.{pair}"))
            rows["add_sync"].append(add_cost(True, f"s{rep}.{pair}"))
    if rank == 0:
        out.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def fmt(values, unit=1e6, suffix="us"):
    med = statistics.median(values) * unit
    return f"{med:8.2f} {suffix} [{min(values) * unit:.2f}, {max(values) * unit:.2f}]"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--windows", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(rank_main, args=(args.world, port, args.windows, args.reps, out),
                       nprocs=args.world, start_method="spawn")
    rows = out.get()
    print(f"{args.world} gloo ranks, TCPStore on 127.0.0.1, {args.windows} windows "
          f"x {args.reps} interleaved reps (median [min, max]), rank 0:")
    print(f"  close of a synced window, training thread : {fmt(rows['sync_thread'])}")
    print(f"  merge per window, end to end (Store)      : {fmt(rows['sync_total'])}")
    print(f"  user's all_reduce of aggregates per window: {fmt(rows['all_reduce'])}")
    print(f"  add() without sync_ranks                  : {fmt(rows['add_plain'], 1e9, 'ns')}")
    print(f"  add() with sync_ranks                     : {fmt(rows['add_sync'], 1e9, 'ns')}")
    # The ratio of the medians: a single pair's ratio is mostly scheduling noise.
    ratio = statistics.median(rows["add_sync"]) / statistics.median(rows["add_plain"])
    print(f"  add() ratio sync/plain (of the medians)   : {ratio:8.3f}")


if __name__ == "__main__":
    main()
