"""Renders bench_rank_scale's table (docs/distributed.md's picture): rank 0's
merge time per window and its Store calls per window against the number of
ranks, one line per number of Stats.

    build/benchmarks/benchmarks/bench_rank_scale > scale.md
    python scripts/plot_rank_scale.py scale.md docs/rank_scale.png

(needs matplotlib: python -m pip install matplotlib==3.9.2).
"""

import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(table):
    """(ranks, stats, merge ms, rank 0's calls, rank 0's KiB) of each row."""
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or not cells[0].isdigit():
            continue
        merge = float(re.match(r"([\d.]+) ms", cells[2]).group(1))
        calls, kib = (float(x) for x in cells[4].split(","))
        yield int(cells[0]), int(cells[1]), merge, calls, kib


def main(table_path, out):
    data = list(rows(open(table_path).read()))
    fig, (time_axis, calls_axis) = plt.subplots(1, 2, figsize=(11, 3.8))
    for stats in sorted({s for _, s, *_ in data}):
        points = sorted((n, merge, calls) for n, s, merge, calls, _ in data if s == stats)
        ranks = [p[0] for p in points]
        time_axis.plot(ranks, [p[1] for p in points], marker="o", label=f"{stats} Stats")
        calls_axis.plot(ranks, [p[2] for p in points], marker="o", label=f"{stats} Stats")
    time_axis.axhline(1000, color="gray", linestyle="--", label="the window (1 s)")
    time_axis.set_title("rank 0: merge time per window (ms)")
    calls_axis.set_title("rank 0: Store calls per window")
    for axis in (time_axis, calls_axis):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("ranks")
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
