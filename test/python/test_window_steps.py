"""Stat windows measured in training steps: Stat(..., window_steps=N) in
Python and TorchScript. A window [k*N, (k+1)*N) closes when the step set with
set_step reaches (k+1)*N (at the next add, as time windows close), its event
carries the step current then, and the configuration survives pickle,
torch.jit.save and the PT2 flatten. conftest clears the step after each test.
"""

import pickle

import pytest
import torch

tm = pytest.importorskip("torch_monitor")
import torch_monitor.testing  # noqa: E402,F401  (tm.testing)


@pytest.fixture
def stat_events():
    seen = []
    handle = tm.register_event_handler(seen.append)
    yield seen
    tm.unregister_event_handler(handle)


def mine(events, name):
    return [(e.step, {k[len(name) + 1:]: v for k, v in e.data.items()}) for e in events if f"{name}.count" in e.data]


def test_windows_close_when_the_step_crosses_a_multiple(stat_events):
    s = tm.Stat("ws.loss", [tm.MEAN, tm.COUNT], window_steps=10)
    assert s.window_steps == 10 and s.window_size is None
    for step in range(35):
        tm.set_step(step)
        s.add(float(step))
    # [0, 10), [10, 20), [20, 30) closed, at the adds of steps 10, 20, 30.
    assert mine(stat_events, "ws.loss") == [
        (10, {"mean": 4.5, "count": 10.0}),
        (20, {"mean": 14.5, "count": 10.0}),
        (30, {"mean": 24.5, "count": 10.0}),
    ]
    assert s.count == 5


def test_steps_may_skip_windows_and_several_adds_share_a_step(stat_events):
    s = tm.IntStat("ws.skip", [tm.SUM, tm.COUNT], window_steps=4)
    tm.set_step(1)
    s.add(1)
    s.add(2)
    tm.set_step(13)  # skips the windows [4, 8) and [8, 12): nothing to log
    s.add(5)
    tm.set_step(16)
    s.add(0)
    assert mine(stat_events, "ws.skip") == [(13, {"sum": 3, "count": 2}), (16, {"sum": 5, "count": 1})]


def test_time_does_not_close_step_windows(stat_events):
    with tm.testing.fake_clock(0) as clock:
        s = tm.Stat("ws.time", [tm.COUNT], window_steps=3)
        tm.set_step(0)
        s.add(1.0)
        clock.advance_ms(10**9)
        s.add(1.0)
        assert mine(stat_events, "ws.time") == []
        assert s.count == 2


def test_exactly_one_window_and_no_close_on_time():
    with pytest.raises(ValueError, match="exactly one of window_size"):
        tm.Stat("ws.bad", [tm.SUM])
    with pytest.raises(ValueError, match="exactly one of window_size"):
        tm.Stat("ws.bad", [tm.SUM], 1.0, window_steps=5)
    with pytest.raises(ValueError, match="close_on_time applies to time windows"):
        tm.Stat("ws.bad", [tm.SUM], window_steps=5, close_on_time=True)
    with pytest.raises(ValueError, match="window_steps must be at least 1"):
        tm.Stat("ws.bad", [tm.SUM], window_steps=0)
    with pytest.raises(TypeError, match="argument 'window_steps' must be an int"):
        tm.Stat("ws.bad", [tm.SUM], window_steps=2.5)


def test_configuration_survives_pickle_save_and_flatten(tmp_path):
    s = tm.Stat("ws.saved", [tm.MEAN], window_steps=25)
    copy = pickle.loads(pickle.dumps(s))
    assert copy.window_steps == 25 and copy.window_size is None
    assert "window_steps=25" in repr(s)
    assert dict(s.__obj_flatten__())["window_steps"] == 25

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stat = s

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.stat.add(x)
            return x

    path = tmp_path / "holder.pt"
    torch.jit.save(torch.jit.script(Holder()), str(path))
    assert torch.jit.load(str(path)).stat.window_steps() == 25


def test_torchscript_builds_step_windows_and_sets_the_step(stat_events):
    @torch.jit.script
    def run(n: int) -> int:
        s = torch.classes.torch_monitor.Stat("ws.scripted", ["count"], None, 9223372036854775807, False, 5)
        for step in range(n):
            torch.ops.torch_monitor.set_step(step)
            s.add(1.0)
        return s.window_steps()

    assert run(12) == 5
    # The last window is logged when the stat is destroyed, at the function's
    # end, one step after the last step set (11).
    assert mine(stat_events, "ws.scripted") == [(5, {"count": 5.0}), (10, {"count": 5.0}), (12, {"count": 2.0})]



@pytest.mark.parametrize(
    "last_set, windows",
    [
        # range(11) with windows of 5: the step-10 add closes [5, 10) at 10;
        # the last window, [10, 15) holding step 10 alone, is closed when the
        # Stat goes and must not land on 10 as well (TensorBoard would show
        # two points at one step): it carries 11.
        (None, [(5, {"count": 5.0}), (10, {"count": 5.0}), (11, {"count": 1.0})]),
        # Ten adds, then set_step(10) ends [5, 10) with no add to close it:
        # it lands on 10, the step that ended it, as a later add would have
        # given it.
        (10, [(5, {"count": 5.0}), (10, {"count": 5.0})]),
    ],
    ids=["closed_early_lands_one_step_after_the_last", "ended_by_the_step_keeps_that_step"],
)
def test_the_window_closed_at_exit_never_shares_a_step(stat_events, last_set, windows):
    s = tm.Stat("ws.exit", [tm.COUNT], window_steps=5)
    for step in range(11 if last_set is None else 10):
        tm.set_step(step)
        s.add(1.0)
    if last_set is not None:
        tm.set_step(last_set)
    del s
    assert mine(stat_events, "ws.exit") == windows
