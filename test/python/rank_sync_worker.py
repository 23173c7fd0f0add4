"""One rank of a test/python/test_rank_sync.py scenario (run as a script).

argv: rank world_size init_method scenario out_dir. Each rank adds samples
(samples(rank, step, scenario)) to a Stat synced across ranks, with windows of
WINDOW_STEPS steps, and writes what its handlers saw and its get() to
out_dir/rank<r>.json.
"""

import atexit
import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

import torch_monitor as tm

WINDOW_STEPS = 4
STEPS = 12
AGGREGATIONS = ["mean", "count", "sum", "min", "max", "value"]


def samples(rank, step, scenario):
    """This rank's samples at `step`: exact binary fractions, so sums are exact."""
    if scenario == "empty" and rank == 1 and WINDOW_STEPS <= step < 2 * WINDOW_STEPS:
        return []  # no samples in window 1
    if scenario == "group" and rank == 0:
        return []  # not in the group
    if scenario == "late" and rank == 1 and step < WINDOW_STEPS:
        return []  # its first sample in window 1: no marker for window 0
    return [rank * 10 + step * 0.25 + i * 0.5 for i in range(rank + 1)]


def posted_keys(world):
    """The rank sync's keys left in the Store: each rank's bundles, numbered
    from 1 (a bundle per pass of its sync thread, at most one per window and
    step here)."""
    store = tm._internals.group_store(dist.group.WORLD)
    return [
        k for r in range(world) for seq in range(1, 2 * STEPS)
        for k in [f"torch_monitor/posts/{r}/{seq}"] if store.check([k])
    ]


def many_stats(rank, world, out_dir):
    """Scenario "many": STATS Stats of one-step windows, each added to once
    per step for WINDOWS steps (issue 28's load). Rank 0 writes how many
    merged windows it logged with every rank, and when the last came,
    counted from the end of its loop."""
    stats_n, windows = int(os.environ["STATS"]), int(os.environ["WINDOWS"])
    complete = []
    others = []

    def record(e):
        ranks = [v for k, v in e.data.items() if k.endswith(".ranks")]
        complete.append((time.monotonic(), ranks == [world]))
        if ranks != [world]:
            others.append({"name": e.name, "data": dict(e.data), "step": e.step})

    tm.register_event_handler(record)
    stats = [tm.Stat(f"s{i}", ["mean", "count"], window_steps=1, sync_ranks=True)
             for i in range(stats_n)]
    dist.barrier()
    for step in range(windows):
        tm.set_step(step)
        for i, stat in enumerate(stats):
            stat.add(float(rank + i + step))
    tm.set_step(windows)
    tm._close_all_stats()  # the last windows, as at exit
    loop_end = time.monotonic()
    tm._C._flush_rank_sync()
    merged = sum(1 for _, full in complete if full)
    last = max((t for t, _ in complete), default=loop_end) - loop_end
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"events": len(complete), "merged_all_ranks": merged,
                   "last_after_loop_s": last, "others": others[:5]}, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    rank, world, init, scenario, out_dir = sys.argv[1:6]
    rank, world = int(rank), int(world)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    if scenario == "many":
        return many_stats(rank, world, out_dir)
    tm.set_rank_sync_deadline(float(os.environ.get("DEADLINE", "5")))
    events = []
    log = open(os.path.join(out_dir, f"events{rank}.jsonl"), "a")

    def record(e):
        event = {"name": e.name, "data": dict(e.data), "step": e.step}
        events.append(event)
        # Written at once: in the "atexit" case, the last windows come at exit.
        log.write(json.dumps(event) + "\n")
        log.flush()

    tm.register_event_handler(record)
    # Background warnings (the rank sync thread's) are RuntimeWarnings here.
    warned = []
    warnings.simplefilter("always")
    warnings.showwarning = lambda message, *args, **kwargs: warned.append(str(message))
    if scenario == "group":
        group = dist.new_group([1, 2, 3])  # every rank calls new_group
        sync = group if rank != 0 else False
    elif scenario == "world_group":
        sync = dist.group.WORLD  # the default group, given as a ProcessGroup
    else:
        sync = True
    if scenario == "script":
        # TorchScript's bool: the process default group, set from Python.
        tm.set_default_rank_group()

        @torch.jit.script
        def make(steps: int) -> torch.classes.torch_monitor.Stat:
            return torch.classes.torch_monitor.Stat(
                "loss", ["mean", "count", "sum", "min", "max", "value"], None,
                9223372036854775807, False, steps, True)

        stat = make(WINDOW_STEPS)
    elif scenario == "mismatch_type" and rank == 1:
        stat = tm.IntStat("loss", AGGREGATIONS, window_steps=WINDOW_STEPS, sync_ranks=sync)
    elif scenario == "mismatch_window" and rank == 1:
        stat = tm.Stat("loss", AGGREGATIONS, window_steps=2 * WINDOW_STEPS, sync_ranks=sync)
    elif scenario == "mismatch_aggregations" and rank == 1:
        # No VALUE: the same window, other aggregations.
        stat = tm.Stat("loss", AGGREGATIONS[:-1], window_steps=WINDOW_STEPS, sync_ranks=sync)
    else:
        stat = tm.Stat("loss", AGGREGATIONS, window_steps=WINDOW_STEPS, sync_ranks=sync)
    # A second synced Stat. "root_late": one that rank 0 adds to from window
    # 2 on only: the windows 0 and 1 of the other ranks wait for rank 0's,
    # which never come, and are refused (rank 0 crashed there).
    # "same_name": another "loss" (other aggregations), fed 100 + rank.
    second = None
    if scenario == "root_late":
        second = tm.Stat("late", ["count"], window_steps=WINDOW_STEPS, sync_ranks=sync)
    elif scenario == "same_name":
        second = tm.Stat("loss", ["count", "sum"], window_steps=WINDOW_STEPS, sync_ranks=sync)
    # One gloo collective, as a training step would issue.
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world
    started = time.monotonic()
    for step in range(STEPS):
        tm.set_step(step)
        if scenario in ("stall", "long_stall") and rank == world - 1 and step == WINDOW_STEPS:
            time.sleep(float(os.environ["STALL"]))
        if scenario == "root_stall" and rank == 0 and step == WINDOW_STEPS:
            time.sleep(float(os.environ["STALL"]))  # rank 1 takes window 0 back
        if scenario == "root_stall" and rank == 1 and step == 2 * WINDOW_STEPS:
            time.sleep(float(os.environ["STALL"]) - 0.5)  # windows 1 and 2 after
        if scenario == "exit" and rank == 2 and step == WINDOW_STEPS:
            os._exit(0)  # dies without closing anything
        if scenario == "root_exit" and rank == 0 and step == WINDOW_STEPS:
            os._exit(0)  # the root dies before merging anything
        for v in samples(rank, step, scenario):
            stat.add(round(v) if isinstance(stat, tm.IntStat) else v)
        if scenario == "root_late":
            if rank != 0 or step >= 2 * WINDOW_STEPS:
                second.add(1.0)
            time.sleep(0.05)  # rank 0 reads rank 1's windows while they wait
        elif scenario == "same_name":
            second.add(100.0 + rank)
    tm.set_step(STEPS)
    if scenario == "atexit":
        return  # the exit hook closes, merges and logs the last windows
    last_local = {str(k).split(".")[-1].lower(): v for k, v in stat.get().items()}
    if scenario in ("root_exit", "long_stall") and rank != 0:
        # What exit runs: the windows the root did not take are logged here.
        atexit._run_exitfuncs()
    else:
        tm._close_all_stats()  # the last window, as at exit
        tm._C._flush_rank_sync()
    flushed = time.monotonic() - started
    own = stat.get()
    own = {str(k).split(".")[-1].lower(): v for k, v in own.items()}
    if scenario in ("root_exit", "long_stall") and rank != 0:
        leaked = posted_keys(world)
    elif scenario == "stall":
        # The root outlives the late rank's posts: their keys must be settled.
        time.sleep(max(0.0, float(os.environ["STALL"]) + 1.5 - flushed))
        leaked = posted_keys(world)
    else:
        leaked = None
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"events": events, "get": own, "get_before_last": last_local,
                   "seconds": flushed, "leaked": leaked, "warnings": warned}, f)
    if scenario in ("root_exit", "long_stall"):
        os._exit(0)  # no collective or group teardown with a rank gone
    if scenario not in ("stall", "exit"):
        dist.barrier()  # the user's own collective at a point every rank reaches
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
