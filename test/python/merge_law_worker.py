"""One rank of test_law_merges.py (run as a script).

argv: rank world_size init_method out_dir spec. `spec` is a JSON file: a
list of [class name, constructor kwargs] of torch.classes.torch_monitor
classes, created in that order with sync_ranks=True (the process default
group; TorchScript's bool), fed STEPS training steps and closed. Writes the
events its handler saw and the warnings it got to out_dir/rank<r>.json.
"""

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

import torch_monitor as tm

STEPS = 12


def feed(obj, class_name, kwargs, rank, step):
    """One step's samples (Stat, IntStat), observations (Watch) or timed
    units of key "law<i>" (PytorchCounterCapture, whose include is ^law<i>$)."""
    if class_name == "PytorchCounterCapture":
        with torch.monitor._WaitCounter(kwargs["include"][1:-1]).guard():
            pass
    elif class_name == "Watch":
        n = len(kwargs["paths"])
        obj.observe([torch.full((3,), float(rank + step + k)) for k in range(n)], list(range(n)), [])
    elif class_name == "IntStat":
        obj.add(rank * 10 + step)
    else:
        obj.add(rank * 10 + step * 0.25)


def main():
    rank, world, init, out_dir, spec = sys.argv[1:6]
    rank, world = int(rank), int(world)
    with open(spec) as f:
        objects = json.load(f)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    tm.set_rank_sync_deadline(float(os.environ.get("DEADLINE", "2")))
    tm.set_default_rank_group()
    events = []
    handle = tm.register_event_handler(
        lambda e: events.append({"name": e.name, "step": e.step, "data": dict(e.data)})
    )
    # Background warnings (the rank sync thread's) are RuntimeWarnings here.
    warned = []
    warnings.simplefilter("always")
    warnings.showwarning = lambda message, *args, **kwargs: warned.append(str(message))
    tm.set_step(0)
    made = [
        (getattr(torch.classes.torch_monitor, name)(**kwargs, sync_ranks=True), name, kwargs)
        for name, kwargs in objects
    ]
    for step in range(STEPS):
        tm.set_step(step)
        for obj, name, kwargs in made:
            feed(obj, name, kwargs, rank, step)
    tm.set_step(STEPS)
    tm._close_all_stats()  # the last windows, as at exit
    for obj, name, _ in made:
        if name in ("Watch", "PytorchCounterCapture"):
            obj.remove()
    tm.flush_rank_sync()
    tm.unregister_event_handler(handle)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"events": events, "warnings": warned}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
