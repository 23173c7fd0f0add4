"""A 2-rank DDP training run (gloo, CPU) whose Stats describe all ranks.

Each rank trains a replica of a small MLP on its own shard of synthetic
data under DistributedDataParallel. The loss and the step time are added on
every rank to Stats created with ``sync_ranks=True``: every --window steps
the ranks' windows are merged (through the process group's store, no
collective) into one window per Stat, as if one process had seen every
rank's samples. Rank 0 alone receives the merged events: it writes them to
TensorBoard files and serves them to Prometheus at /metrics; at the end it
prints the merged windows and what a scrape returns.

    python examples/ddp_training.py [--ranks 2] [--steps 200] [--window 20] [--logdir runs/ddp]
"""

import argparse
import gc
import os
import tempfile
import time
import urllib.request

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import torch_monitor as monitor

MEAN, MIN, MAX, COUNT = (
    monitor.Aggregation.MEAN,
    monitor.Aggregation.MIN,
    monitor.Aggregation.MAX,
    monitor.Aggregation.COUNT,
)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--window", type=int, default=20, help="steps per Stat window")
    parser.add_argument("--logdir", default=os.path.join("runs", "ddp"))
    return parser.parse_args()


def shard(rank, n=2048, features=16):
    # Every rank draws the same problem and keeps its own rows.
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=generator)
    y = torch.sin(x @ torch.randn(features, 1, generator=generator))
    return x[rank::dist.get_world_size()], y[rank::dist.get_world_size()]


def train(rank, args, init_file):
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=args.ranks
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = shard(rank)

    sinks = []
    if rank == 0:  # merged events reach rank 0's handlers only
        memory = monitor.MemoryHandler()
        exporter = monitor.PrometheusExporter(port=0, labels={"job": "ddp-example"})
        sinks = [memory, monitor.TensorBoardWriter(args.logdir), exporter]
        for sink in sinks:
            sink.register()

    loss_stat = monitor.Stat("loss", [MEAN, MIN, MAX], window_steps=args.window, sync_ranks=True)
    step_ms = monitor.Stat("step_ms", [MEAN, MAX, COUNT], window_steps=args.window, sync_ranks=True)
    for step in range(args.steps):
        monitor.set_step(step)
        start = time.perf_counter()
        batch = torch.randint(0, x.shape[0], (64,))
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_stat.add(loss.detach())
        step_ms.add((time.perf_counter() - start) * 1e3)
    # Close the last windows on every rank (at the step the loop ended) and
    # wait until rank 0 has merged them (bounded by the merge deadline), so
    # the report below sees them.
    monitor.set_step(args.steps)
    del loss_stat, step_ms
    monitor.flush_rank_sync()
    if rank == 0:
        report(memory, exporter)
        for sink in sinks:
            sink.unregister()
    dist.barrier()
    # Free DDP before the process group, so that the group's own Python
    # object destroys it, without the GIL: destroyed by DDP's reducer, with
    # the GIL held, it can deadlock against a gloo worker that needs the GIL
    # (a PyTorch bug; see docs/distributed.md, "Shutting down").
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


def report(memory, exporter):
    windows = {}  # the merged loss and step-time events of each window, by step
    for event in memory.events():
        windows.setdefault(event.step, {}).update(event.data)
    print(f"{'step':>6} {'ranks':>5} {'loss mean':>10} {'loss max':>9} {'steps':>6} {'step ms max':>11}")
    for step, data in sorted(windows.items()):
        print(
            f"{step:>6} {data['loss.ranks']:>5} {data['loss.mean']:>10.4f} {data['loss.max']:>9.4f}"
            f" {int(data['step_ms.count']):>6} {data['step_ms.max']:>11.2f}"
        )
    with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5) as reply:
        lines = [l for l in reply.read().decode().splitlines() if l.startswith("torch_monitor_loss{")]
    print("Prometheus scrape:", *lines, sep="\n  ")


def main():
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(train, args=(args, os.path.join(tmp, "init")), nprocs=args.ranks)


if __name__ == "__main__":
    main()
