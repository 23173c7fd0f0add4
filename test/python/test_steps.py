"""Steps end to end (issue 9, /work/shared/spec/training-loop.md).

The process-wide training step in Python, TorchScript and PyTorch 2; the
optional step of an Event; the step a Stat's event carries; and the sinks
writing points at it. TensorBoard files are read back with TensorBoard's own
reader (EventAccumulator), and the Python TensorboardEventHandler's output is
compared with what SummaryWriter writes when called directly. The C++ side
(setStep/getStep, Event equality, the native writer's addScalar) is tested
in test/cpp/test_event_handlers.cpp and test/cpp/test_sinks.cpp. conftest's
forget_training_step fixture clears the step after every test.
"""

import datetime
import json
import pickle
import time
from typing import Optional

import pytest
import torch

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

UTC = datetime.timezone.utc
STAT_EVENT = "torch.monitor.Stat"


@pytest.fixture
def events(tm):
    """The events logged during the test (a registered list)."""
    seen = []
    handle = tm.register_event_handler(seen.append)
    yield seen
    tm.unregister_event_handler(handle)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def read_scalars(logdir):
    """{tag: [(step, value, wall_time), ...]} as TensorBoard reads them."""
    acc = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    return {
        tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }


def steps_of(points):
    return [p[0] for p in points]


def stamp(seconds):
    return datetime.datetime.fromtimestamp(seconds, tz=UTC)


def stat_windows_closed_at(tm, closing_steps, name="loss"):
    """A Stat whose window i (samples i and i + 1, mean i + 0.5) is closed by
    the first add at training step closing_steps[i]; that add's sample opens
    the next window. Returns the stat: its last window is still open (keep
    it alive while the handlers under test are registered)."""
    from torch_monitor.testing import fake_clock

    with fake_clock(0) as clock:
        stat = tm.Stat(name, [tm.MEAN, tm.COUNT], 1.0)
        stat.add(0.0)
        stat.add(1.0)
        for i, step in enumerate(closing_steps):
            clock.advance_ms(1000)
            tm.set_step(step)
            stat.add(float(i + 1))  # closes window i at this step
            stat.add(float(i + 2))
    return stat


# ------------------------------------------------------------ the training step


def test_python_set_and_get(tm):
    assert tm.get_step() is None
    tm.set_step(0)
    assert tm.get_step() == 0
    tm.set_step(2**62)
    assert tm.get_step() == 2**62
    with pytest.raises(ValueError, match=r"\[0, 2\*\*63-1\], got -1"):
        tm.set_step(-1)
    assert tm.get_step() == 2**62  # a rejected step changes nothing
    with pytest.raises(TypeError, match=r"set_step\(\) argument 'step' must be an int, got float"):
        tm.set_step(1.5)
    tm.set_step(None)  # forgets it
    assert tm.get_step() is None


def test_torchscript_ops_share_the_step_with_python(tm):
    @torch.jit.script
    def set_and_read(step: int) -> Optional[int]:
        torch.ops.torch_monitor.set_step(step)
        return torch.ops.torch_monitor.get_step()

    @torch.jit.script
    def read() -> Optional[int]:
        return torch.ops.torch_monitor.get_step()

    assert read() is None
    assert set_and_read(12) == 12
    assert tm.get_step() == 12
    tm.set_step(40)
    assert read() == 40
    with pytest.raises(RuntimeError, match=r"\[0, 2\*\*63-1\]"):
        set_and_read(-3)
    torch.ops.torch_monitor.set_step(None)
    assert tm.get_step() is None


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_set_step_compiles_without_graph_breaks(tm, backend):
    def train_step(x, step: int):
        tm.set_step(step)
        return x * 2

    explanation = torch._dynamo.explain(train_step)(torch.ones(2), 3)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    tm.set_step(None)
    torch._dynamo.reset()
    compiled = torch.compile(train_step, fullgraph=True, backend=backend)
    for step in (5, 6, 7, 100):
        torch.testing.assert_close(compiled(torch.ones(2), step), torch.full((2,), 2.0))
        assert tm.get_step() == step  # the side effect ran, with this step


def test_the_op_compiles_and_keeps_its_order(tm):
    def body(x):
        torch.ops.torch_monitor.set_step(1)
        y = x + 1
        torch.ops.torch_monitor.set_step(2)
        return y

    compiled = torch.compile(body, fullgraph=True, backend="aot_eager")
    compiled(torch.ones(1))
    assert tm.get_step() == 2  # both ran, in program order


def test_set_step_passes_opcheck(tm):
    for step in (3, None):
        torch.library.opcheck(
            torch.ops.torch_monitor.set_step.default,
            (step,),
            test_utils=("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
        )
        assert tm.get_step() == step


def test_get_step_is_not_traceable_and_says_so(tm):
    def reads(x):
        return x + torch.ops.torch_monitor.get_step()

    with pytest.raises(Exception, match="get_step"):
        torch.compile(reads, fullgraph=True, backend="aot_eager")(torch.ones(1))


@pytest.mark.parametrize("strict", [False, True])
def test_export_keeps_set_step_and_the_module_sets_it(tm, strict):
    class Step(torch.nn.Module):
        def forward(self, x):
            tm.set_step(77)
            return x + 1

    exported = torch.export.export(Step(), (torch.ones(2),), strict=strict)
    assert "torch_monitor.set_step" in str(exported.graph)
    tm.set_step(None)  # tracing may have run it; the program must run it again
    runnable = exported.module()
    assert tm.get_step() is None
    runnable(torch.ones(2))
    assert tm.get_step() == 77


# ------------------------------------------------------------ Event.step


def test_event_step_constructor_attribute_and_equality(tm):
    t = stamp(1_700_000_000.5)
    plain = tm.Event("e", t, {"a": 1.0})
    assert plain.step is None
    stepped = tm.Event("e", t, {"a": 1.0}, step=7)
    assert stepped.step == 7
    assert tm.Event("e", t, {"a": 1.0}, 7) == stepped  # positional too
    assert plain != stepped
    assert stepped == tm.Event("e", t, {"a": 1.0}, step=7)
    assert stepped != tm.Event("e", t, {"a": 1.0}, step=8)
    plain.step = 7
    assert plain == stepped
    plain.step = None
    assert plain.step is None
    with pytest.raises(ValueError, match=r"Event step must be in \[0, 2\*\*63-1\]"):
        tm.Event("e", t, {}, step=-1)
    for bad in (1.0, True, "3"):
        with pytest.raises(TypeError, match="Event step must be an int or None"):
            tm.Event("e", t, {}, step=bad)
    with pytest.raises(OverflowError):
        tm.Event("e", t, {}, step=2**63)


def test_event_step_repr_and_pickle(tm):
    t = stamp(1_700_000_000.5)
    plain = tm.Event("e", t, {"a": 1})
    stepped = tm.Event("e", t, {"a": 1}, step=12)
    assert "step" not in repr(plain)
    assert repr(stepped) == repr(plain)[:-1] + ", step=12)"
    for event in (plain, stepped):
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps(event, protocol))
            assert back == event and back.step == event.step


def test_events_pickled_before_steps_still_load(tm):
    micros = 1_700_000_000_500_000
    # What version 1 (no step) pickled: _restore_event((1, name, µs, data)).
    old = tm._C._restore_event((1, "old", micros, {"a": 2.5}))
    assert old == tm.Event("old", stamp(micros / 1e6), {"a": 2.5})
    assert old.step is None
    with pytest.raises(RuntimeError, match="state version 3; this build reads versions 1 to 2"):
        tm._C._restore_event((3, "new", micros, {}, None, "x"))
    with pytest.raises(ValueError, match="not a pickled torch_monitor Event"):
        tm._C._restore_event((1, "short", micros))


def test_torchscript_event_step(tm, events):
    @torch.jit.script
    def log(step: Optional[int]) -> Optional[int]:
        e = torch.classes.torch_monitor.Event("scripted")
        e.set_float("x", 1.0)
        e.set_step(step)
        torch.ops.torch_monitor.log_event(e)
        return e.step()

    assert log(9) == 9
    assert log(None) is None
    assert [(e.name, e.step) for e in events] == [("scripted", 9), ("scripted", None)]
    with pytest.raises(RuntimeError, match=r"Event step must be in \[0, 2\*\*63-1\]"):
        log(-2)


# ------------------------------------------------------------ Stat events


def test_stat_events_carry_the_step_current_at_close(tm, events):
    stat = stat_windows_closed_at(tm, [10, 20, 30])
    stat_events = [e for e in events if e.name == STAT_EVENT]
    assert [e.step for e in stat_events] == [10, 20, 30]
    assert [e.data["loss.mean"] for e in stat_events] == [0.5, 1.5, 2.5]


def test_stat_events_have_no_step_before_set_step(tm, events):
    from torch_monitor.testing import fake_clock

    with fake_clock(0) as clock:
        stat = tm.Stat("nostep", [tm.SUM], 1.0)
        stat.add(1.0)
        clock.advance_ms(1000)
        stat.add(1.0)
    assert [e.step for e in events if e.name == STAT_EVENT] == [None]


# ------------------------------------------------------------ sinks


def test_native_writer_puts_stat_windows_on_the_training_steps(tm, tmp_path):
    steps = [100, 200, 300, 400]
    with tm.TensorBoardWriter(tmp_path / "run", flush_interval=3600):
        stat = stat_windows_closed_at(tm, steps)
    del stat  # its open window is logged with the writer already closed
    scalars = read_scalars(tmp_path / "run")
    assert steps_of(scalars["loss.mean"]) == steps
    assert steps_of(scalars["loss.count"]) == steps
    assert [p[1] for p in scalars["loss.mean"]] == [0.5, 1.5, 2.5, 3.5]


def test_native_writer_event_step_else_counter(tm, tmp_path):
    with tm.TensorBoardWriter(tmp_path / "run", flush_interval=3600):
        tm.log_event(tm.Event(STAT_EVENT, stamp(1.0), {"a": 1.0}, step=50))
        tm.log_event(tm.Event(STAT_EVENT, stamp(2.0), {"a": 2.0}))  # counter: 0
        tm.log_event(tm.Event(STAT_EVENT, stamp(3.0), {"a": 3.0}))  # counter: 1
    assert steps_of(read_scalars(tmp_path / "run")["a"]) == [50, 0, 1]


def test_native_add_scalar_step_is_optional(tm, tmp_path):
    with tm.TensorBoardWriter(tmp_path / "run", flush_interval=3600) as writer:
        writer.add_scalar("x", 1.0)  # no training step: the counter, 0
        writer.add_scalar("x", 2.0)  # 1
        tm.set_step(500)
        writer.add_scalar("x", 3.0)  # the training step
        writer.add_scalar("x", 4.0, 9)  # explicit
        writer.add_scalar("x", 5.0, global_step=None, walltime=12.0)
    points = read_scalars(tmp_path / "run")["x"]
    assert steps_of(points) == [0, 1, 500, 9, 500]
    assert points[-1][2] == 12.0


def test_native_add_scalar_takes_numpy_scalars_as_summary_writer_does(tm, tmp_path):
    import numpy

    calls = [(numpy.float32(0.5), 1), (numpy.int64(7), numpy.int64(2)), (numpy.bool_(True), 3), (0.25, 4)]
    with tm.TensorBoardWriter(tmp_path / "ours", flush_interval=3600) as ours:
        for value, step in calls:
            ours.add_scalar("x", value, step, walltime=100.0)
    theirs = SummaryWriter(str(tmp_path / "theirs"))
    for value, step in calls:
        theirs.add_scalar("x", value, step, walltime=100.0)
    theirs.close()
    assert read_scalars(tmp_path / "ours") == read_scalars(tmp_path / "theirs")


def test_torchscript_add_scalar_step_is_optional(tm, tmp_path):
    @torch.jit.script
    def write(tb: torch.classes.torch_monitor.TensorBoardWriter):
        tb.add_scalar("y", 1.0)
        torch.ops.torch_monitor.set_step(30)
        tb.add_scalar("y", 2.0)
        tb.add_scalar("y", 3.0, 4)
        tb.add_scalar("y", 4.0, torch.tensor(8))

    writer = torch.classes.torch_monitor.TensorBoardWriter(str(tmp_path / "run"))
    write(writer)
    writer.close()
    assert steps_of(read_scalars(tmp_path / "run")["y"]) == [0, 30, 4, 8]


def test_json_lines_step_field_only_when_present(tm, tmp_path):
    path = tmp_path / "events.jsonl"
    with tm.JsonLinesWriter(path, flush_interval=3600):
        tm.log_event(tm.Event("a", stamp(1.0), {"v": 1}))
        tm.log_event(tm.Event("b", stamp(2.0), {"v": 2}, step=0))
        tm.log_event(tm.Event("c", stamp(3.0), {"v": 3}, step=2**62))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert "step" not in lines[0]
    assert [line.get("step") for line in lines] == [None, 0, 2**62]
    assert list(lines[1]) == ["name", "timestamp", "epoch_seconds", "step", "data"]


def test_python_handler_writes_what_summary_writer_writes(tm, tmp_path):
    """The handler's points equal SummaryWriter.add_scalar called with the
    events' own steps and wall times."""
    events = [
        tm.Event(STAT_EVENT, stamp(1_700_000_000.25 + i), {"loss.mean": 0.5 * i, "n": i}, step=s)
        for i, s in enumerate([0, 100, 250, 1000])
    ]
    ours = SummaryWriter(str(tmp_path / "handler"))
    handler = tm.TensorboardEventHandler(ours)
    for event in events:
        handler(event)
    ours.close()
    theirs = SummaryWriter(str(tmp_path / "direct"))
    for event in events:
        for tag, value in event.data.items():
            theirs.add_scalar(tag, value, event.step, walltime=event.timestamp.timestamp())
    theirs.close()
    got, want = read_scalars(tmp_path / "handler"), read_scalars(tmp_path / "direct")
    assert got == want
    assert steps_of(got["loss.mean"]) == [0, 100, 250, 1000]


def test_python_handler_on_stat_windows_and_its_counter_fallback(tm, tmp_path):
    writer = SummaryWriter(str(tmp_path / "run"))
    handle = tm.register_event_handler(tm.TensorboardEventHandler(writer))
    try:
        stat = stat_windows_closed_at(tm, [7, 14, 21], name="acc")
        tm.set_step(None)
        tm.log_event(tm.Event(STAT_EVENT, stamp(time.time()), {"other": 1.0}))
        tm.log_event(tm.Event(STAT_EVENT, stamp(time.time()), {"other": 2.0}))
    finally:
        tm.unregister_event_handler(handle)
        writer.close()
    del stat
    scalars = read_scalars(tmp_path / "run")
    assert steps_of(scalars["acc.mean"]) == [7, 14, 21]
    assert steps_of(scalars["other"]) == [0, 1]  # no event step: per-tag counter


def test_python_handler_step_callable_overrides_the_event_step(tm, tmp_path):
    writer = SummaryWriter(str(tmp_path / "run"))
    handler = tm.TensorboardEventHandler(writer, step=lambda: 3)
    handler(tm.Event(STAT_EVENT, stamp(1.0), {"a": 1.0}, step=99))
    writer.close()
    assert steps_of(read_scalars(tmp_path / "run")["a"]) == [3]
