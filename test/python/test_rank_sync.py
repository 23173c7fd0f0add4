"""Stat(..., sync_ranks=...): windows merged across gloo ranks through the Store.

Each case starts 2-4 processes (test/python/rank_sync_worker.py) with a time
limit, and compares rank 0's merged events with the reference torch.monitor
Stat fed every rank's samples of the window. See docs/distributed.md.
"""

import datetime
import json
import pathlib
import sys
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import isolated  # noqa: E402
import rank_sync_worker as worker  # noqa: E402

WORKER = pathlib.Path(worker.__file__)
TIMEOUT_S = 90


def run_ranks(tmp_path, world, scenario, env=None, tcp=False):
    """Runs every rank; returns (results by rank, wall seconds). Never hangs."""
    if tcp:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        init = f"tcp://127.0.0.1:{port}"
    else:
        init = f"file://{tmp_path / 'store'}"
    started = time.monotonic()
    isolated.run_ranks(
        [
            [sys.executable, str(WORKER), str(r), str(world), init, scenario, str(tmp_path)]
            for r in range(world)
        ],
        TIMEOUT_S,
        env,
    )
    wall = time.monotonic() - started
    results = {}
    for r in range(world):
        path = tmp_path / f"rank{r}.json"
        if path.exists():
            results[r] = json.loads(path.read_text())
    return results, wall


def reference(ranks, window, scenario):
    """torch.monitor.Stat (the wheel's) fed the window's samples of `ranks`.

    VALUE is the lowest rank's last sample: the ranks are fed from the highest.
    """
    import torch.monitor as ref

    values = [
        v
        for r in sorted(ranks, reverse=True)
        for step in range(window * worker.WINDOW_STEPS, (window + 1) * worker.WINDOW_STEPS)
        for v in worker.samples(r, step, scenario)
    ]
    A = ref.Aggregation
    stat = ref.Stat(
        "loss",
        [A.MEAN, A.COUNT, A.SUM, A.MIN, A.MAX, A.VALUE],
        datetime.timedelta(hours=1),
        len(values),  # the window closes at its last sample
    )
    for v in values:
        stat.add(v)
    want = {k.name.lower(): v for k, v in stat.get().items()}
    # torch.monitor's get() leaves VALUE out: the last sample fed.
    want.setdefault("value", values[-1])
    return want


def merged_events(result):
    """The Stat's events, as they reached the handler: in window order."""
    return [e for e in result["events"] if "loss.mean" in e["data"]]


def check_windows(events, expected_ranks, scenario):
    """One merged event per window, equal to the reference over its ranks."""
    windows = worker.STEPS // worker.WINDOW_STEPS
    assert len(events) == windows, events
    for w, event in enumerate(events):
        ranks = expected_ranks[w]
        data = event["data"]
        # "<stat>.ranks": one TensorBoard tag per synced Stat, not a "ranks"
        # shared by all of them.
        assert "ranks" not in data and data["loss.ranks"] == len(ranks), (w, data)
        want = reference(ranks, w, scenario)
        got = {k.split(".")[1]: v for k, v in data.items() if k.startswith("loss.") and k != "loss.ranks"}
        assert got == want, (w, got, want)
        assert event["step"] == (w + 1) * worker.WINDOW_STEPS, event


@pytest.mark.parametrize("world", [2, 3, 4])
def test_merged_window_equals_one_stat_fed_all_ranks(tmp_path, world):
    results, _ = run_ranks(tmp_path, world, "basic", tcp=(world == 3))
    windows = worker.STEPS // worker.WINDOW_STEPS
    check_windows(merged_events(results[0]), [range(world)] * windows, "basic")
    for r in range(1, world):
        # Merged events go to rank 0 only; a synced Stat logs no local event.
        assert merged_events(results[r]) == [], results[r]["events"]
    for r in range(world):
        # get() keeps this rank's own last window.
        assert results[r]["get"] == reference([r], windows - 1, "basic")


def test_rank_without_samples_in_a_window_posts_an_empty_marker(tmp_path):
    # A long deadline: only the empty marker lets the root merge in time.
    results, wall = run_ranks(tmp_path, 3, "empty", env={"DEADLINE": "30"})
    check_windows(merged_events(results[0]), [range(3)] * 3, "empty")
    assert results[0]["seconds"] < 20, results[0]["seconds"]


def test_stalled_rank_gives_a_partial_merge_and_no_leaked_keys(tmp_path):
    # Rank 2 stalls at step 4, before the add that would close its window 0
    # (windows close lazily): it misses every window's deadline.
    results, wall = run_ranks(tmp_path, 3, "stall", env={"DEADLINE": "1", "STALL": "2.5"})
    check_windows(merged_events(results[0]), [range(2)] * 3, "stall")
    assert results[0]["seconds"] < 10
    assert results[0]["leaked"] == []
    # Rank 0 marked the late windows: rank 2 logged them itself, with a word.
    own = merged_events(results[2])
    assert [e["data"]["loss.ranks"] for e in own] == [1, 1, 1], own
    assert any("after rank 0 had merged the window" in w for w in results[2]["warnings"])


def test_rank_that_exits_early_gives_a_partial_merge(tmp_path):
    results, wall = run_ranks(tmp_path, 3, "exit", env={"DEADLINE": "1"})
    assert 2 not in results
    check_windows(merged_events(results[0]), [range(2)] * 3, "exit")
    assert results[0]["seconds"] < 10


def test_the_world_group_given_as_a_process_group_is_the_default_one(tmp_path):
    # sync_ranks=dist.group.WORLD raised an internal TypeError.
    results, _ = run_ranks(tmp_path, 2, "world_group")
    check_windows(merged_events(results[0]), [range(2)] * 3, "world_group")
    assert merged_events(results[1]) == []


def test_non_default_group_merges_on_its_own_rank_0(tmp_path):
    results, _ = run_ranks(tmp_path, 4, "group")
    # Group [1, 2, 3]: global rank 1 is its rank 0 and logs the merged windows.
    assert merged_events(results[0]) == []
    events = merged_events(results[1])
    windows = worker.STEPS // worker.WINDOW_STEPS
    assert len(events) == windows
    for w, event in enumerate(events):
        assert event["data"]["loss.ranks"] == 3
        want = reference([1, 2, 3], w, "group")
        got = {k.split(".")[1]: v for k, v in event["data"].items() if k.startswith("loss.") and k != "loss.ranks"}
        assert got == want
    assert merged_events(results[2]) == merged_events(results[3]) == []


def test_last_windows_are_merged_at_exit(tmp_path):
    results, _ = run_ranks(tmp_path, 2, "atexit")
    assert results == {}  # the ranks ended without writing their summary
    lines = (tmp_path / "events0.jsonl").read_text().splitlines()
    check_windows(merged_events({"events": [json.loads(l) for l in lines]}), [range(2)] * 3, "atexit")
    assert merged_events({"events": [
        json.loads(l) for l in (tmp_path / "events1.jsonl").read_text().splitlines()
    ]}) == []


def test_scripted_stat_with_sync_ranks(tmp_path):
    results, _ = run_ranks(tmp_path, 2, "script")
    check_windows(merged_events(results[0]), [range(2)] * 3, "script")
    assert merged_events(results[1]) == []


# -- ranks that disagree, die or stall (issue 17, items 6 and 7) -------------


def local_windows(result, scenario, rank):
    """The rank's own windows it logged itself, each checked: one rank."""
    events = merged_events(result)
    for w, event in enumerate(events):
        assert event["data"]["loss.ranks"] == 1, event
    return events


@pytest.mark.parametrize("scenario", ["mismatch_type", "mismatch_window", "mismatch_aggregations"])
def test_ranks_whose_stats_differ_are_never_merged(tmp_path, scenario):
    # Rank 0 Stat("loss"), rank 1 IntStat("loss") merged to min 1e-323 and a
    # wrong sum; window_steps 4 on rank 0 and 8 on rank 1 merged rank 1's
    # 8-step windows into 4-step ones; a rank 1 without VALUE was merged
    # into rank 0's windows as if it had asked for it (issue 25). Now rank 0
    # refuses them and says so; rank 1 logs its windows itself.
    results, _ = run_ranks(tmp_path, 2, scenario, env={"DEADLINE": "1"})
    check_windows(merged_events(results[0]), [range(1)] * 3, scenario)
    warned = [w for w in results[0]["warnings"] if "is not the same on every rank" in w]
    assert len(warned) == 1, results[0]["warnings"]
    aggregations = "aggregations=[value, mean, count, sum, max, min]"
    other = {
        "mismatch_type": f"rank 1 a IntStat with window_steps=4, {aggregations}",
        "mismatch_window": f"rank 1 a Stat with window_steps=8, {aggregations}",
        "mismatch_aggregations": "rank 1 a Stat with window_steps=4, aggregations=[mean, count, sum, max, min]",
    }[scenario]
    assert "Stat 'loss'" in warned[0], warned
    assert f"rank 0 has a Stat with window_steps=4, {aggregations}" in warned[0], warned
    assert other in warned[0], warned
    own = local_windows(results[1], scenario, 1)
    expected = 2 if scenario == "mismatch_window" else 3  # 8-step windows over 12 steps
    assert len(own) == expected, own
    assert sum(e["data"]["loss.count"] for e in own) == 2 * worker.STEPS, own
    assert any("not merged across ranks" in w for w in results[1]["warnings"]), results[1]["warnings"]


def test_windows_of_a_rank_whose_root_died_are_logged_on_that_rank(tmp_path):
    # Rank 0 dies at step 4: rank 1's windows went to a Store nobody merged
    # and vanished. Now rank 1 takes them back (at exit, after waiting the
    # deadline for rank 0), logs them itself, and leaves no key behind.
    results, _ = run_ranks(tmp_path, 2, "root_exit", env={"DEADLINE": "1"})
    assert 0 not in results
    own = local_windows(results[1], "root_exit", 1)
    assert len(own) == 3, own
    for w, event in enumerate(own):
        got = {k.split(".")[1]: v for k, v in event["data"].items() if k.startswith("loss.") and k != "loss.ranks"}
        assert got == reference([1], w, "root_exit"), (w, got)
    assert results[1]["leaked"] == [], results[1]["leaked"]
    assert any("rank 0 did not take it" in w for w in results[1]["warnings"]), results[1]["warnings"]


def test_windows_of_a_rank_stalled_past_the_sweep_are_logged_on_that_rank(tmp_path):
    # Rank 1 stalls 3 s, past 20 deadlines of 0.1 s: rank 0 merged without it
    # and stopped looking for its keys. Its late windows were dropped without
    # a word and 7 keys stayed in the Store.
    results, _ = run_ranks(tmp_path, 2, "long_stall", env={"DEADLINE": "0.1", "STALL": "3"})
    check_windows(merged_events(results[0]), [range(1)] * 3, "long_stall")
    own = local_windows(results[1], "long_stall", 1)
    assert len(own) == 3, own
    for w, event in enumerate(own):
        got = {k.split(".")[1]: v for k, v in event["data"].items() if k.startswith("loss.") and k != "loss.ranks"}
        assert got == reference([1], w, "long_stall"), (w, got)
    assert results[1]["leaked"] == [], results[1]["leaked"]
def test_a_root_stalled_past_the_give_up_reads_past_the_windows_taken_back(tmp_path):
    # Rank 0 stalls 3 s before closing window 0; rank 1 posts window 0,
    # takes it back after 20 deadlines of 0.1 s and logs it itself, then
    # (after a stall of its own) posts windows 1 and 2. Rank 0, back, must
    # read past the bundle taken back (gone from the Store) and merge
    # windows 1 and 2 with rank 1's shares.
    results, _ = run_ranks(tmp_path, 2, "root_stall", env={"DEADLINE": "0.1", "STALL": "3"})
    events = merged_events(results[0])
    assert [e["data"]["loss.ranks"] for e in events] == [1, 2, 2], events
    check_windows(events, [range(1), range(2), range(2)], "root_stall")
    own = local_windows(results[1], "root_stall", 1)
    assert len(own) == 1, own
    assert any("rank 0 did not take it" in w for w in results[1]["warnings"]), results[1]["warnings"]


def test_windows_the_root_never_closed_are_logged_by_their_ranks(tmp_path):
    # Rank 0 adds to "late" from window 2 on; rank 1 from window 0. Rank 0
    # refuses rank 1's windows 0 and 1 (it has none to merge them with) and
    # merges window 2; rank 1 logs windows 0 and 1 itself. Rank 0 crashed
    # with SIGSEGV when it refused them.
    results, _ = run_ranks(tmp_path, 2, "root_late", env={"DEADLINE": "0.5"})
    check_windows(merged_events(results[0]), [range(2)] * 3, "root_late")
    late = [e for e in results[0]["events"] if "late.count" in e["data"]]
    assert [(e["step"], e["data"]["late.count"], e["data"]["late.ranks"]) for e in late] == [(12, 8.0, 2)], late
    own = [e for e in results[1]["events"] if "late.count" in e["data"]]
    assert [(e["step"], e["data"]["late.count"]) for e in own] == [(4, 4.0), (8, 4.0)], own


def test_synced_stats_of_one_name_merge_with_their_namesakes_in_order(tmp_path):
    # Two live Stats named "loss" on each rank (the second with other
    # aggregations). Rank 0 merged both into one window per step, or
    # refused the second's as another shape; now each merges with the one
    # made in the same order on the other rank.
    results, _ = run_ranks(tmp_path, 2, "same_name", env={"DEADLINE": "1"})
    check_windows(merged_events(results[0]), [range(2)] * 3, "same_name")
    second = [e for e in results[0]["events"] if "loss.sum" in e["data"] and "loss.mean" not in e["data"]]
    steps = worker.WINDOW_STEPS
    assert [(e["step"], e["data"]) for e in second] == [
        ((w + 1) * steps, {"loss.count": 2.0 * steps, "loss.sum": steps * (100.0 + 101.0), "loss.ranks": 2})
        for w in range(3)
    ], second
    assert results[1]["events"] == [] and results[1]["warnings"] == [], results[1]
    assert results[0]["warnings"] == [], results[0]["warnings"]


def test_merged_windows_reach_the_handlers_in_step_order(tmp_path):
    # Rank 1 adds nothing before window 1, so its first post comes without
    # an empty marker for window 0: window 1 is complete at once while
    # window 0 waits for its deadline. Merged in posting order, window 1's
    # point reached the sinks first (TensorBoard showed steps 8, 4, 12).
    results, _ = run_ranks(tmp_path, 2, "late", env={"DEADLINE": "1"})
    events = merged_events(results[0])
    assert [e["step"] for e in events] == [4, 8, 12]
    assert [e["data"]["loss.ranks"] for e in events] == [1, 2, 2]


# -- many Stats, many ranks (issue 28) --------------------------------------


@pytest.mark.parametrize(
    "world, stats, windows, within_s",
    [
        # Before issue 28 (a key per Stat, window and rank): 4,450 of 8,000
        # windows after 300 s, 4,221 of them with all 4 ranks.
        (4, 400, 20, 60.0),
        # Before: the last of 2,000 windows 3.1 s after the loop ended.
        (8, 200, 10, 1.0),
    ],
)
def test_every_window_of_many_stats_is_merged_with_every_rank(
    tmp_path, world, stats, windows, within_s
):
    results, _ = run_ranks(
        tmp_path, world, "many", env={"STATS": str(stats), "WINDOWS": str(windows)}
    )
    root = results[0]
    assert root["merged_all_ranks"] == stats * windows, root
    assert root["events"] == stats * windows, root
    assert root["last_after_loop_s"] < within_s, root
    for r in range(1, world):
        assert results[r]["events"] == 0, results[r]
