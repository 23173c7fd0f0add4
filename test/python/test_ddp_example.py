"""examples/ddp_training.py: 2 DDP ranks (gloo, CPU) whose Stats are merged
across ranks, written to TensorBoard on rank 0 and served to Prometheus.

Runs the example as a user would, in a subprocess with a timeout, and checks
what it printed against the TensorBoard files it wrote (read with
TensorBoard's own reader): every window covers both ranks and counts both
ranks' steps, and the files hold one run, rank 0's, with the merged values.
"""

import os

import pytest
from isolated import run_script

pytest.importorskip("torch.distributed")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ddp_training.py")
STEPS, WINDOW = 60, 20


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("ddp") / "runs"
    # A hang kills the example and its spawned ranks and fails here.
    done = run_script(
        EXAMPLE, "--steps", STEPS, "--window", WINDOW, "--logdir", logdir,
        timeout=240, cwd=tmp_path_factory.mktemp("cwd"),
    )
    return done.stdout, logdir


def table(stdout):
    rows = []
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) == 6 and fields[0].isdigit():
            rows.append((int(fields[0]), int(fields[1]), float(fields[2]), float(fields[3]), int(fields[4])))
    return rows


def test_every_window_is_merged_over_both_ranks(ran):
    rows = table(ran[0])
    assert len(rows) == STEPS // WINDOW, ran[0]
    for step, ranks, mean, top, steps in rows:
        assert ranks == 2
        assert steps == 2 * WINDOW  # both ranks' step times are in the window
        assert 0 < mean <= top


def test_rank_zero_alone_writes_the_merged_run(ran):
    stdout, logdir = ran
    assert sorted(os.listdir(logdir)) == ["rank0"]  # one run per rank; only rank 0 logs merged windows
    acc = event_accumulator.EventAccumulator(str(logdir / "rank0"))
    acc.Reload()
    written = {e.step: e.value for e in acc.Scalars("loss.mean")}  # float32 in the file
    printed = {step: mean for step, _, mean, _, _ in table(stdout)}  # printed to 4 decimals
    assert written.keys() == printed.keys()
    for step, mean in printed.items():
        assert written[step] == pytest.approx(mean, abs=6e-5)


def test_prometheus_served_the_merged_loss(ran):
    lines = [l.strip() for l in ran[0].splitlines() if l.strip().startswith("torch_monitor_loss{")]
    assert any('aggregation="mean"' in l and 'job="ddp-example"' in l for l in lines), ran[0]
