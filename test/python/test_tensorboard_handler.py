"""Tests for torch_monitor.tensorboard_handler.TensorboardEventHandler.

Every test writes with a real ``torch.utils.tensorboard.SummaryWriter`` into
``tmp_path`` and reads the files back with TensorBoard's own reader.
"""

import datetime
import threading
import time
import types
import warnings

import pytest

pytest.importorskip("tensorboard")
import torch.monitor  # noqa: E402  (the reference implementation)
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

STAT_EVENT = "torch.monitor.Stat"


from torch_monitor.tensorboard_handler import TensorboardEventHandler  # noqa: E402


def _torch_monitor_event_cls():
    try:
        import torch_monitor

        return torch_monitor.Event
    except Exception as exc:  # not built / not importable yet
        pytest.skip(f"torch_monitor.Event unavailable: {type(exc).__name__}: {exc}")


@pytest.fixture(params=["torch.monitor", "torch_monitor"])
def Event(request):
    """The Event class events are built with (same attribute interface in both)."""
    if request.param == "torch.monitor":
        return torch.monitor.Event
    return _torch_monitor_event_cls()


def local_dt(epoch_seconds):
    """Naive local datetime, the way torch.monitor stamps its events."""
    return datetime.datetime.fromtimestamp(epoch_seconds)


def read_scalars(logdir):
    """{tag: [(step, value, wall_time), ...]} as TensorBoard reads it."""
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0 = keep all
    acc.Reload()
    return {
        tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }


def write(tmp_path, handler_factory, events, name="run"):
    logdir = tmp_path / name
    writer = SummaryWriter(str(logdir))
    try:
        handler = handler_factory(writer)
        for ev in events:
            handler(ev)
    finally:
        writer.close()
    return read_scalars(logdir)


T0 = 1_700_000_000.25  # exact in binary, so walltimes compare exactly


# ---------------------------------------------------------------------------------
def test_stat_events_get_per_tag_steps_values_and_walltimes(tmp_path, Event):
    events = [
        Event(STAT_EVENT, local_dt(T0 + i), {"loss.mean": 0.5 * i, "loss.max": 1.0 + i})
        for i in range(3)
    ]
    got = write(tmp_path, TensorboardEventHandler, events)

    assert sorted(got) == ["loss.max", "loss.mean"]
    assert got["loss.mean"] == [(0, 0.0, T0), (1, 0.5, T0 + 1), (2, 1.0, T0 + 2)]
    assert got["loss.max"] == [(0, 1.0, T0), (1, 2.0, T0 + 1), (2, 3.0, T0 + 2)]


def test_counters_are_independent_per_tag(tmp_path, Event):
    ts = local_dt(T0)
    events = [
        Event(STAT_EVENT, ts, {"a.sum": 1.0, "b.sum": 10.0}),
        Event(STAT_EVENT, ts, {"a.sum": 2.0}),
        Event(STAT_EVENT, ts, {"a.sum": 3.0, "b.sum": 20.0}),
    ]
    got = write(tmp_path, TensorboardEventHandler, events)

    assert [(s, v) for s, v, _ in got["a.sum"]] == [(0, 1.0), (1, 2.0), (2, 3.0)]
    assert [(s, v) for s, v, _ in got["b.sum"]] == [(0, 10.0), (1, 20.0)]


def test_torch_monitor_handler_puts_every_point_at_step_0_ours_counts(tmp_path, Event):
    events = [Event(STAT_EVENT, local_dt(T0 + i), {"loss.mean": float(i)}) for i in range(4)]

    theirs = write(tmp_path, torch.monitor.TensorboardEventHandler, events, "theirs")
    ours = write(tmp_path, TensorboardEventHandler, events, "ours")

    # The documented torch.monitor bug: no step is passed, so all points sit on step 0.
    assert [s for s, _, _ in theirs["loss.mean"]] == [0, 0, 0, 0]
    assert [s for s, _, _ in ours["loss.mean"]] == [0, 1, 2, 3]
    # Apart from the steps, both write the same values and wall times.
    assert [(v, w) for _, v, w in theirs["loss.mean"]] == [(v, w) for _, v, w in ours["loss.mean"]]


def test_string_values_are_skipped_without_crashing(tmp_path, Event):
    events = [
        Event(STAT_EVENT, local_dt(T0), {"loss.mean": 0.25, "note": "warmup"}),
        Event(STAT_EVENT, local_dt(T0 + 1), {"loss.mean": 0.125, "note": "train"}),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # skipping a str is silent by design
        got = write(tmp_path, TensorboardEventHandler, events)

    assert sorted(got) == ["loss.mean"]
    assert [(s, v) for s, v, _ in got["loss.mean"]] == [(0, 0.25), (1, 0.125)]


def test_torch_monitor_handler_crashes_on_a_string_value(tmp_path):
    # The reason for the FIX above: the reference raises into the training loop.
    ev = torch.monitor.Event(STAT_EVENT, local_dt(T0), {"note": "warmup"})
    writer = SummaryWriter(str(tmp_path / "theirs"))
    try:
        with pytest.raises(Exception):
            torch.monitor.TensorboardEventHandler(writer)(ev)
    finally:
        writer.close()


def test_bools_are_written_as_0_and_1(tmp_path):
    # torch.monitor.Event already turns bools into floats; torch_monitor.Event keeps
    # them as bools, so give the handler real bools through a plain object.
    events = [
        types.SimpleNamespace(name=STAT_EVENT, timestamp=local_dt(T0 + i), data={"overflow": b})
        for i, b in enumerate([True, False])
    ]
    got = write(tmp_path, TensorboardEventHandler, events)
    assert [(s, v) for s, v, _ in got["overflow"]] == [(0, 1.0), (1, 0.0)]


def test_ints_nan_and_inf_are_written(tmp_path, Event):
    ev = Event(STAT_EVENT, local_dt(T0), {"n.count": 7, "x.mean": float("nan"), "x.max": float("inf")})
    got = write(tmp_path, TensorboardEventHandler, [ev])
    assert got["n.count"][0][:2] == (0, 7.0)
    assert got["x.mean"][0][1] != got["x.mean"][0][1]  # NaN
    assert got["x.max"][0][1] == float("inf")


def test_user_given_step(tmp_path, Event):
    state = {"step": 100}

    def factory(writer):
        return TensorboardEventHandler(writer, step=lambda: state["step"])

    events = []
    for i in range(3):
        events.append(Event(STAT_EVENT, local_dt(T0 + i), {"loss.mean": float(i), "lr.value": 0.5}))

    logdir = tmp_path / "run"
    writer = SummaryWriter(str(logdir))
    handler = factory(writer)
    for ev in events:
        handler(ev)
        state["step"] += 50  # the training loop advances its own global step
    writer.close()
    got = read_scalars(logdir)

    assert [(s, v) for s, v, _ in got["loss.mean"]] == [(100, 0.0), (150, 1.0), (200, 2.0)]
    assert [s for s, _, _ in got["lr.value"]] == [100, 150, 200]


def test_bad_step_argument_or_result_is_a_clear_type_error(tmp_path):
    writer = SummaryWriter(str(tmp_path / "run"))
    try:
        with pytest.raises(TypeError, match="step"):
            TensorboardEventHandler(writer, step=5)
        handler = TensorboardEventHandler(writer, step=lambda: 1.5)
        with pytest.raises(TypeError, match="must return an int"):
            handler(torch.monitor.Event(STAT_EVENT, local_dt(T0), {"a": 1.0}))
    finally:
        writer.close()


def test_other_events_ignored_by_default_and_accepted_on_request(tmp_path, Event):
    events = [
        Event("my.event", local_dt(T0), {"lr": 0.5}),
        Event(STAT_EVENT, local_dt(T0), {"loss.mean": 1.0}),
    ]
    default = write(tmp_path, TensorboardEventHandler, events, "default")
    assert sorted(default) == ["loss.mean"]

    both = write(
        tmp_path,
        lambda w: TensorboardEventHandler(w, event_names=[STAT_EVENT, "my.event"]),
        events,
        "both",
    )
    assert sorted(both) == ["loss.mean", "lr"]
    assert [(s, v) for s, v, _ in both["lr"]] == [(0, 0.5)]

    only_mine = write(
        tmp_path, lambda w: TensorboardEventHandler(w, event_names="my.event"), events, "mine"
    )
    assert sorted(only_mine) == ["lr"]


def test_aware_timestamp_gives_the_right_walltime(tmp_path):
    # torch.monitor.Event drops tzinfo (a core FIX in torch_monitor.Event); the
    # handler itself must honour an aware datetime, so feed one through a plain object.
    tz = datetime.timezone(datetime.timedelta(hours=5, minutes=30))
    ts = datetime.datetime.fromtimestamp(T0, tz)
    ev = types.SimpleNamespace(name=STAT_EVENT, timestamp=ts, data={"a.sum": 1.0})
    got = write(tmp_path, TensorboardEventHandler, [ev])
    assert got["a.sum"] == [(0, 1.0, T0)]


class _FlakyWriter:
    """Forwards to a real SummaryWriter but fails for one tag."""

    def __init__(self, writer, bad_tag):
        self.writer, self.bad_tag = writer, bad_tag

    def add_scalar(self, tag, value, **kw):
        if tag == self.bad_tag:
            raise ValueError("disk on fire")
        self.writer.add_scalar(tag, value, **kw)


def test_one_bad_value_never_crashes_and_warns_once_per_tag(tmp_path):
    logdir = tmp_path / "run"
    writer = SummaryWriter(str(logdir))
    handler = TensorboardEventHandler(_FlakyWriter(writer, "bad.sum"))
    with pytest.warns(RuntimeWarning) as record:
        for i in range(3):
            ev = types.SimpleNamespace(
                name=STAT_EVENT,
                timestamp=local_dt(T0 + i),
                data={"bad.sum": 1.0, "weird": None, "good.sum": float(i)},
            )
            handler(ev)  # must not raise
    writer.close()

    messages = [str(w.message) for w in record]
    assert len(messages) == 2  # once for 'bad.sum', once for 'weird', not per event
    assert any("'bad.sum'" in m and "disk on fire" in m for m in messages)
    assert any("'weird'" in m and "NoneType" in m for m in messages)
    got = read_scalars(logdir)
    assert sorted(got) == ["good.sum"]
    assert [(s, v) for s, v, _ in got["good.sum"]] == [(0, 0.0), (1, 1.0), (2, 2.0)]


class _StepFreeWriter:
    """A writer written for torch.monitor's handler, which never passes a
    step: add_scalar(tag, value, walltime=None)."""

    def __init__(self):
        self.points = []

    def add_scalar(self, tag, value, walltime=None):
        self.points.append((tag, value, walltime))


def test_a_writer_taking_no_step_gets_torch_monitors_call(Event):
    # Every point was lost to a TypeError (one warning per tag).
    ours, theirs = _StepFreeWriter(), _StepFreeWriter()
    events = [Event(STAT_EVENT, local_dt(T0 + i), {"loss.mean": 0.5 * i}) for i in range(2)]
    for event in events:
        TensorboardEventHandler(ours)(event)
        torch.monitor.TensorboardEventHandler(theirs)(event)
    assert ours.points == theirs.points == [("loss.mean", 0.0, T0), ("loss.mean", 0.5, T0 + 1)]


def test_concurrent_calls_get_unique_ordered_steps(tmp_path, Event):
    n_threads, per_thread = 8, 50
    logdir = tmp_path / "run"
    writer = SummaryWriter(str(logdir), max_queue=10_000)

    class YieldingWriter:
        """A writer that lets other threads run mid-call, as one doing I/O would."""

        def add_scalar(self, *args, **kw):
            time.sleep(0)
            writer.add_scalar(*args, **kw)

    handler = TensorboardEventHandler(YieldingWriter())
    start = threading.Barrier(n_threads)

    def worker(k):
        start.wait()
        for i in range(per_thread):
            handler(Event(STAT_EVENT, local_dt(T0), {"x.sum": float(k * 1000 + i), "y.sum": 1.0}))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    got = read_scalars(logdir)

    total = n_threads * per_thread
    # No step lost or duplicated, and each tag's points arrive in step order.
    assert [s for s, _, _ in got["x.sum"]] == list(range(total))
    assert [s for s, _, _ in got["y.sum"]] == list(range(total))
    assert sorted(v for _, v, _ in got["x.sum"]) == sorted(
        float(k * 1000 + i) for k in range(n_threads) for i in range(per_thread)
    )
