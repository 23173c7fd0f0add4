"""One rank of test_watch.py's rank tests (run as a script).

argv: rank world_size init_method out_dir. Every rank trains the same model
(same seed) on its own data, watched with sync_ranks=True and windows of
WINDOW steps, captures what it observed with hooks of its own, and writes
its events, those observations and how long the last merge took to
out_dir/rank<r>.json. With STALL set, rank 2 sleeps that long before the
step that closes its first window (DEADLINE: rank 0's wait). With
OTHER_KEYS set, rank 1 watches fc1 only (the others the whole model); with
RANK1_WINDOW or RANK1_EVERY set, rank 1's watch has that window_steps or
every (the others WINDOW and 1).
"""

import json
import os
import re
import sys
import time
import warnings

import torch
import torch.distributed as dist

import torch_monitor as tm

WINDOW = 4
STEPS = 12


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 6)
        self.fc2 = torch.nn.Linear(6, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def main():
    rank, world, init, out_dir = sys.argv[1:5]
    rank, world = int(rank), int(world)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    tm.set_rank_sync_deadline(float(os.environ.get("DEADLINE", "5")))
    stall = float(os.environ.get("STALL", "0"))
    # Background warnings (the rank sync thread's) are RuntimeWarnings here.
    warned = []
    warnings.simplefilter("always")
    warnings.showwarning = lambda message, *args, **kwargs: warned.append(str(message))
    events = []
    handle = tm.register_event_handler(
        lambda e: events.append({"name": e.name, "step": e.step, "data": dict(e.data)})
        if e.name == tm.WATCH_EVENT else None
    )
    torch.manual_seed(0)  # the same model on every rank
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    exclude = r"^fc2" if os.environ.get("OTHER_KEYS") and rank == 1 else None
    window = int(os.environ.get("RANK1_WINDOW", WINDOW)) if rank == 1 else WINDOW
    every = int(os.environ.get("RANK1_EVERY", 1)) if rank == 1 else 1
    w = tm.watch(model, optimizer, what=("grad", "update", "output"), window_steps=window,
                 every=every, exclude=exclude, sync_ranks=True)
    observed = {}  # window -> key -> [[values], ratio]

    def seen(step, key, t, ratio=None):
        if step % every == 0:  # what the watch observes
            observed.setdefault(str(step // window), {}).setdefault(key, []).append(
                [t.detach().double().flatten().tolist(), ratio]
            )

    current = [0]
    for name in ("fc1", "fc2"):
        getattr(model, name).register_forward_hook(
            lambda m, a, out, name=name: seen(current[0], f"{name}.output", out)
        )
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    # Every rank starts stepping together: on a loaded machine (a GPU
    # machine's suite on 14 workers) one rank's set-up ran past the 1-s
    # deadline, and rank 0 closed its first window before rank 1 posted.
    dist.barrier()
    for step in range(STEPS):
        if stall and rank == 2 and step == WINDOW:
            time.sleep(stall)  # before the step that closes its window 0
        current[0] = step
        tm.set_step(step)
        optimizer.zero_grad()
        model(torch.randn(8, 4, generator=gen)).square().mean().backward()
        before = {}
        for n, p in model.named_parameters():
            seen(step, f"{n}.grad", p.grad)
            before[n] = p.detach().clone()
        # total.grad: this rank's watched gradients of the step, as one.
        seen(step, "total.grad", torch.cat([p.grad.flatten() for n, p in model.named_parameters()
                                            if not (exclude and re.search(exclude, n))]))
        optimizer.step()
        deltas, befores = [], []
        for n, p in model.named_parameters():
            delta = p.detach() - before[n]
            b = before[n].double().norm().item()
            seen(step, f"{n}.update", delta, delta.double().norm().item() / b)
            if not (exclude and re.search(exclude, n)):
                deltas.append(delta.flatten())
                befores.append(before[n].flatten())
        delta, b = torch.cat(deltas), torch.cat(befores).double().norm().item()
        seen(step, "total.update", delta, delta.double().norm().item() / b)
    started = time.monotonic()
    tm.set_step(STEPS)  # closes the last window
    tm.flush_rank_sync()
    seconds = time.monotonic() - started
    w.remove()
    tm.unregister_event_handler(handle)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"events": events, "observed": observed, "seconds": seconds, "warnings": warned}, f)
    if not stall:
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
