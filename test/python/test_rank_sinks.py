"""Rank-aware sinks: file sinks in a distributed job keep ranks apart.

Two gloo ranks (``torch.multiprocessing.spawn`` in a child process with a
time limit) log into one log directory; TensorBoard's own reader
(EventMultiplexer / EventAccumulator) is the oracle that no step holds two
ranks' points. Also: the rank from torch.distributed, from torchrun's
environment and by hand; ``ranks="zero"``; JSON Lines lines carrying the rank;
the TorchScript face; and a writer inherited through ``fork()`` warning once.
"""

import json
import os
import re
import textwrap

import pytest

from isolated import run_isolated

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from tensorboard.backend.event_processing import event_multiplexer  # noqa: E402


def _scalars(run_dir, tag):
    acc = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in acc.Scalars(tag)]


# Each rank adds rank * 100 + step for steps 0..5 to a Stat with 2-step
# windows; its sinks: a TensorBoard writer and a JSON Lines writer per rank
# (the default), and a TensorBoard writer written by rank 0 only.
_TWO_RANKS = textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def worker(rank, out):
        dist.init_process_group(
            "gloo", init_method="file://" + os.path.join(out, "store"),
            rank=rank, world_size=2)
        import torch_monitor as tm
        tb = tm.TensorBoardWriter(os.path.join(out, "tb"), flush_interval=3600)
        jl = tm.JsonLinesWriter(os.path.join(out, "events.jsonl"))
        zero = tm.TensorBoardWriter(os.path.join(out, "zero"), ranks="zero")
        assert tm.process_rank() == (rank, 2), tm.process_rank()
        assert tb.run_dir == os.path.join(out, "tb", f"rank{rank}"), tb.run_dir
        assert (zero.file_path == "") == (rank != 0), zero.file_path
        for sink in (tb, jl, zero):
            sink.register()
        loss = tm.Stat("loss", [tm.MEAN], window_steps=2)
        for step in range(6):
            tm.set_step(step)
            loss.add(float(rank * 100 + step))
        del loss
        for sink in (tb, jl, zero):
            sink.close()
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(sys.argv[1],), nprocs=2, join=True)
    """
)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_ranks")
    script = out / "two_ranks.py"
    script.write_text(_TWO_RANKS)
    runner = f"""
        import subprocess, sys
        done = subprocess.run([sys.executable, {str(script)!r}, {str(out)!r}],
                              timeout=150)
        sys.exit(done.returncode)
    """
    run_isolated(runner, timeout=180)
    return out


def test_tensorboard_shows_one_run_per_rank_never_two_ranks_in_one_step(two_ranks):
    tb = two_ranks / "tb"
    # Nothing is written at the top: the reader of the log directory itself
    # sees no points, so none can be folded together.
    assert not [p for p in os.listdir(tb) if "tfevents" in p]
    multiplexer = event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tb))
    multiplexer.Reload()
    assert sorted(multiplexer.Runs()) == ["rank0", "rank1"]
    for rank in (0, 1):
        points = _scalars(tb / f"rank{rank}", "loss.mean")
        steps = [step for step, _ in points]
        assert len(steps) == len(set(steps)), points  # one point per step
        # Windows close at steps 2 and 4 (the mean of the two steps before),
        # and the last, [4, 6), when the Stat goes away after step 5: one
        # step after the last step set.
        assert points == [
            (2, rank * 100 + 0.5),
            (4, rank * 100 + 2.5),
            (6, rank * 100 + 4.5),
        ], points


def test_rank_zero_only_writes_the_given_directory(two_ranks):
    zero = two_ranks / "zero"
    assert sorted(os.listdir(zero)) == [
        p for p in sorted(os.listdir(zero)) if "tfevents" in p
    ]
    assert len(os.listdir(zero)) == 1  # rank 1 made no file
    assert [v for _, v in _scalars(zero, "loss.mean")] == [0.5, 2.5, 4.5]


def test_json_lines_go_to_a_file_per_rank_and_carry_the_rank(two_ranks):
    assert not (two_ranks / "events.jsonl").exists()
    for rank in (0, 1):
        lines = (two_ranks / f"rank{rank}" / "events.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        stats = [r for r in records if r["name"] == "torch.monitor.Stat"]
        assert [r["step"] for r in stats] == [2, 4, 6]
        assert all(r["rank"] == rank and r["world_size"] == 2 for r in records)
        # The keys in the documented order: rank after step, before data.
        assert list(stats[0]) == [
            "name", "timestamp", "epoch_seconds", "step", "rank", "world_size",
            "data",
        ]


def test_rank_from_torchrun_environment_and_by_hand(tmp_path):
    run_isolated(
        f"""
        import json, os
        import torch_monitor as tm
        out = {str(tmp_path)!r}
        # torchrun's variables, read when the library loads.
        assert tm.process_rank() == (1, 3), tm.process_rank()
        tb = tm.TensorBoardWriter(os.path.join(out, "tb"))
        assert tb.run_dir == os.path.join(out, "tb", "rank1"), tb.run_dir
        assert tb.log_dir == os.path.join(out, "tb")
        tb.close()

        tm.set_process_rank(None, None)  # by hand: not distributed
        assert tm.process_rank() is None
        jl = tm.JsonLinesWriter(os.path.join(out, "e.jsonl"))
        assert jl.file_path == jl.path
        with jl:
            tm.log_event(tm.Event("x", __import__("datetime").datetime.now(), {{"v": 1}}))
        assert "rank" not in json.loads(open(jl.path).read())

        tm.set_process_rank(0, 1)  # a world of one is not distributed either
        assert tm.TensorBoardWriter(os.path.join(out, "one")).run_dir.endswith("one")
        for bad in [(2, 2), (-1, 2), (0, 0)]:
            try:
                tm.set_process_rank(*bad)
            except ValueError as e:
                assert "setProcessRank" in str(e) and "must be" in str(e), e
            else:
                raise AssertionError(f"{{bad}} accepted")
        try:
            tm.set_process_rank(1, None)
        except ValueError as e:
            assert "give both" in str(e)
        else:
            raise AssertionError("half a rank accepted")
        assert tm.process_rank() == (0, 1)
        """,
        env={"RANK": "1", "WORLD_SIZE": "3"},
    )


def test_console_lines_name_the_rank_and_the_step():
    # The ranks of a job share one terminal: each console line says whose it
    # is (as the JSON Lines records do), and a step window's, which step.
    outcome = run_isolated(
        """
        import torch_monitor as tm
        tm.set_process_rank(3, 8)
        with tm.ConsoleHandler(stream="stdout"):
            stat = tm.Stat("loss", ["mean"], window_steps=1)
            tm.set_step(12)
            stat.add(0.5)
            tm.set_step(13)
            stat.add(1.0)  # closes step 12's window: its event is at step 13
            tm.set_process_rank(None, None)
            tm.log_event("plain", {"a": 1})
        """
    )
    lines = outcome.stdout.splitlines()
    assert re.fullmatch(r"\S+Z \[rank 3\] torch\.monitor\.Stat \[step 13\] loss\.mean=0\.5", lines[0]), lines
    assert re.fullmatch(r"\S+Z plain a=1", lines[1]), lines


def test_ranks_argument_is_checked(tm, tmp_path):
    with pytest.raises(ValueError, match='ranks must be "separate"'):
        tm.TensorBoardWriter(tmp_path / "a", ranks="all")
    with pytest.raises(ValueError, match='ranks must be "separate"'):
        tm.JsonLinesWriter(tmp_path / "a.jsonl", ranks="")
    with pytest.raises(TypeError, match="ranks"):
        tm.JsonLinesWriter(tmp_path / "a.jsonl", ranks=0)
    with tm.TensorBoardWriter(tmp_path / "b", ranks="zero") as tb:
        assert tb.ranks == "zero"


def test_torchscript_writers_take_ranks_and_loaded_ones_keep_them(tmp_path):
    run_isolated(
        f"""
        import os, torch
        import torch_monitor as tm
        out = {str(tmp_path)!r}
        tm.set_process_rank(1, 2)

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.tb = torch.classes.torch_monitor.TensorBoardWriter(
                    os.path.join(out, "tb"), ranks="zero")
                self.jl = torch.classes.torch_monitor.JsonLinesWriter(
                    os.path.join(out, "e.jsonl"))
            def forward(self, x):
                self.tb.add_scalar("x", float(x.sum()), 0)
                return x

        m = torch.jit.script(M())
        m(torch.ones(2))
        assert m.tb.file_path() == "" and not os.path.exists(os.path.join(out, "tb"))
        assert m.jl.path() == os.path.join(out, "e.jsonl")
        assert dict(m.tb.__obj_flatten__())["ranks"] == "zero"
        torch.jit.save(m, os.path.join(out, "m.pt"))
        # The saved state holds ranks (issue 25: it did not, and a loaded
        # writer on rank 1 wrote files of its own): loaded, rank 1 still
        # writes nothing.
        loaded = torch.jit.load(os.path.join(out, "m.pt"))
        loaded(torch.ones(2))
        assert dict(loaded.tb.__obj_flatten__())["ranks"] == "zero"
        assert loaded.tb.file_path() == "" and not os.path.exists(os.path.join(out, "tb"))
        """
    )


def test_writer_inherited_through_fork_warns_once_in_the_child(tmp_path):
    outcome = run_isolated(
        f"""
        import datetime, json, os, sys, warnings
        import torch_monitor as tm
        path = {str(tmp_path / "e.jsonl")!r}
        jl = tm.JsonLinesWriter(path, flush_interval=3600)
        jl.register()
        event = lambda v: tm.Event("x", datetime.datetime.now(), {{"v": v}})
        pid = os.fork()
        if pid == 0:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for v in range(3):
                    tm.log_event(event(v))
            in_python = sum(
                "before fork()" in str(w.message) and w.category is RuntimeWarning
                for w in caught
            )
            in_problems = sum("before fork()" in p for p in jl.problems)
            print(f"CHILD python={{in_python}} problems={{in_problems}}", flush=True)
            sys.stderr.flush()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert status == 0, status
        tm.log_event(event(10))
        jl.close()
        values = [json.loads(l)["data"]["v"] for l in open(path)]
        assert values == [10], values  # the child's events: dropped, not written
        """,
        timeout=60,
    )
    line = next(l for l in outcome.stdout.splitlines() if l.startswith("CHILD"))
    python_count = int(line.split("python=")[1].split()[0])
    assert "problems=1" in line, line
    # One warning, a Python RuntimeWarning (the sink routes it through the
    # background warnings: log_event leaves c10 warnings on stderr), and
    # nothing on stderr.
    assert python_count == 1, (line, outcome.stderr)
    assert "before fork()" not in outcome.stderr, outcome.stderr
