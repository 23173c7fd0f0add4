"""How late the window timer closes a window: Stat(..., close_on_time=True).

For windows of 20 ms on the real clock, the time from a window's end to its
event reaching a Python handler. Each window opens at a random phase of the
timer: one the timer saw open when it last looked is closed at its end; one
opened since is seen at the timer's next poll, at most 50 ms later (the
documented bound). Prints the median and the worst.

Usage: python benchmarks/python/bench_close_delay.py [--rounds N]
(run it from outside the repository so the installed package is imported).
"""

import argparse
import random
import time

import torch_monitor as tm


def delays(rounds):
    logged = []
    handle = tm.register_event_handler(lambda e: logged.append(time.monotonic()))
    out = []
    try:
        for _ in range(rounds):
            time.sleep(random.random() * 0.1)  # a random phase of the timer
            logged.clear()
            stat = tm.Stat("delay", [tm.SUM], 0.02, close_on_time=True)
            time.sleep(0.005)  # the timer has looked since the stat joined
            added = time.monotonic()
            stat.add(1.0)
            end = (int(added * 1000) // 20 + 1) / 50  # the window's end, s
            while not logged:
                time.sleep(0.0005)
            out.append((logged[0] - end) * 1000)
            del stat
    finally:
        tm.unregister_event_handler(handle)
    return sorted(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    d = delays(args.rounds)
    print(
        f"{args.rounds} windows of 20 ms: closed a median {d[len(d) // 2]:.1f} ms, "
        f"at worst {d[-1]:.1f} ms after their end"
    )


if __name__ == "__main__":
    main()
