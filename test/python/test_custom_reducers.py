"""Reducers written in Python, compared with the same code on inferno's base.

A subclass of ``torch_monitor.FoldReducer`` defining ``fold``/``interpolate``
keeps the C++ history and view(); one overriding ``forward`` (or with forward
hooks) is called as a module by the monitors. Both must give what the same
class body gives on ``inferno.observe.FoldReducer`` (inferno-ai 0.0.5), and
refuse to be saved where their Python code would be lost.
"""

import io

import pytest
import torch
from torch import nn

inferno_observe = pytest.importorskip("inferno.observe")

from conftest import load_module  # noqa: E402

tm = load_module("torch_monitor")

DT = 0.5
DURATION = 2.0  # 4 rows (5 inclusive)
STEPS = 9  # the ring wraps


def max_reducer(base):
    """A running maximum with linear interpolation, written on ``base``."""

    class RunningMax(base):
        def __init__(self, step_time, duration=0.0, inclusive=False):
            super().__init__(step_time, duration, inclusive)

        def fold(self, obs, state):
            return obs.clone() if state is None else torch.maximum(obs, state)

        def interpolate(self, prev_data, next_data, sample_at, step_time):
            return prev_data + (next_data - prev_data) * (sample_at / step_time)

    return RunningMax


def weighted_sum_reducer(base):
    """Two inputs (value, weight) folded into one state; no interpolate."""

    class WeightedSum(base):
        def __init__(self, step_time, duration=0.0):
            super().__init__(step_time, duration)

        def fold(self, value, weight, state):
            x = value * weight
            return x if state is None else state + x

    return WeightedSum


class Monitored(nn.Module):
    def __init__(self):
        super().__init__()
        self.state = torch.zeros(3)

    def forward(self, x):
        self.state = self.state + x
        return x


def inputs(n=STEPS, shape=(3,), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(n)]


def assert_same(ours, theirs):
    assert (ours is None) == (theirs is None)
    if ours is not None:
        torch.testing.assert_close(ours.float(), theirs.float())


@pytest.mark.parametrize("inclusive", [False, True])
def test_fold_subclass_matches_inferno(inclusive):
    ours = max_reducer(tm.FoldReducer)(DT, DURATION, inclusive)
    theirs = max_reducer(inferno_observe.FoldReducer)(DT, DURATION, inclusive)
    assert ours.peek() is None and ours.dump() is None
    for x in inputs():
        ours(x)
        theirs(x)
        assert_same(ours.peek(), theirs.peek())
        assert_same(ours.dump(), theirs.dump())
    span = DT * (ours.recordsz - 1)
    for time in (0.0, 0.2, DT, 0.7, 1.25, span):
        assert_same(ours.view(time), theirs.view(time))
    times = torch.tensor([0.1, 0.6, 1.3])  # one time per element
    assert_same(ours.view(times), theirs.view(times))


def test_fold_with_two_inputs_and_default_interpolation():
    ours = weighted_sum_reducer(tm.FoldReducer)(DT, DURATION)
    for x, w in zip(inputs(), inputs(seed=1)):
        ours(x, w)
    # Same fold on inferno's base, which requires an interpolation: give it
    # the one ours uses without one (the older state).
    class Theirs(weighted_sum_reducer(inferno_observe.FoldReducer)):
        def interpolate(self, prev_data, next_data, sample_at, step_time):
            return prev_data

    theirs = Theirs(DT, DURATION)
    for x, w in zip(inputs(), inputs(seed=1)):
        theirs(x, w)
    assert_same(ours.dump(), theirs.dump())
    assert_same(ours.view(0.3), theirs.view(0.3))


@pytest.mark.parametrize("kind, args", [("PassthroughReducer", (DT, DURATION)), ("EMAReducer", (DT, 0.5, DURATION))])
def test_a_builtin_reducer_subclass_interpolates_its_own_way_like_inferno(kind, args):
    """Only interpolate() overridden: the kind's fold, the subclass's view()
    between steps (the kind's own interpolation ran instead)."""

    def linear(base):
        class Linear(base):
            def interpolate(self, prev_data, next_data, sample_at, step_time):
                return prev_data + (next_data - prev_data) * (sample_at / step_time) + 1000

        return Linear

    ours = linear(getattr(tm, kind))(*args)
    theirs = linear(getattr(inferno_observe, kind))(*args)
    for x in inputs():
        ours(x)
        theirs(x)
    assert_same(ours.dump(), theirs.dump())
    for time in (0.0, 0.2, 0.7, 1.25):
        assert_same(ours.view(time), theirs.view(time))


def test_latest_reads_a_subclass_peek_like_inferno():
    def doubled(base):
        class Doubled(base):
            def peek(self):
                state = super().peek()
                return None if state is None else state * 2

        return Doubled

    ours = doubled(tm.PassthroughReducer)(DT, DURATION)
    theirs = doubled(inferno_observe.PassthroughReducer)(DT, DURATION)
    for x in inputs(3):
        ours(x)
        theirs(x)
    assert_same(ours.latest, theirs.latest)
    assert_same(ours.latest, 2 * inputs(3)[-1])


def test_fold_subclass_feeds_a_monitor_like_inferno():
    ours_module, theirs_module = Monitored(), Monitored()
    ours = tm.DifferenceMonitor(max_reducer(tm.FoldReducer)(DT, DURATION), "state", ours_module)
    theirs = inferno_observe.DifferenceMonitor(
        max_reducer(inferno_observe.FoldReducer)(DT, DURATION), "state", theirs_module
    )
    for x in inputs():
        ours_module(x)
        theirs_module(x)
    assert_same(ours.dump(), theirs.dump())
    assert_same(ours.view(0.75), theirs.view(0.75))


class Doubling(tm.EMAReducer):
    """An overridden forward: inferno's monitors call it; so must ours."""

    def forward(self, obs, cond=None):
        super().forward(obs * 2)


def test_overridden_forward_is_called_by_the_monitor():
    module = Monitored()
    reducer = Doubling(1.0, 0.5, duration=3.0)
    monitor = tm.DifferenceMonitor(reducer, "state", module)
    for x in inputs(4):
        module(x)
    plain = tm.EMAReducer(1.0, 0.5, duration=3.0)
    for x in inputs(4):
        plain(x * 2)
    assert_same(monitor.dump(), plain.dump())


def test_forward_hook_on_the_reducer_runs():
    seen = []
    module = Monitored()
    reducer = tm.PassthroughReducer(1.0, 2.0)
    reducer.register_forward_hook(lambda mod, args, out: seen.append(args[0].clone()))
    monitor = tm.DifferenceMonitor(reducer, "state", module)  # noqa: F841 (kept: it records)
    xs = inputs(3)
    for x in xs:
        module(x)
    assert len(seen) == 3
    torch.testing.assert_close(seen[-1], xs[-1])


def test_a_hook_added_after_the_monitor_is_built_is_warned_about():
    """The monitor feeds the C++ reducer directly (chosen when built): a
    hook added later would not run for its steps, and says so."""
    reducer = tm.PassthroughReducer(DT, DURATION)
    before = tm.PassthroughReducer(DT, DURATION)
    before.register_forward_hook(lambda *args: None)  # no monitor yet: silent
    tm.DifferenceMonitor(reducer, "state", Monitored())
    with pytest.warns(UserWarning, match="added to PassthroughReducer after a monitor was built"):
        reducer.register_forward_hook(lambda *args: None)
    with pytest.warns(UserWarning, match="does not run for that monitor's steps"):
        reducer.register_forward_pre_hook(lambda *args: None)


def test_builtin_reducers_keep_the_cpp_path():
    reducer = tm.EMAReducer(1.0, 0.5)
    assert reducer._monitor_feed() is reducer.script_reducer
    # A Python fold also keeps it: the C++ history calls the fold.
    custom = max_reducer(tm.FoldReducer)(1.0)
    assert custom._monitor_feed() is custom.script_reducer
    # Overridden forward: a separate object that calls the module.
    doubling = Doubling(1.0, 0.5)
    assert doubling._monitor_feed() is not doubling.script_reducer


def test_fold_base_without_fold_is_refused():
    class NoFold(tm.FoldReducer):
        pass

    with pytest.raises(TypeError, match="must define fold"):
        NoFold(1.0)
    class Filled(max_reducer(tm.FoldReducer)):
        def __init__(self, step_time):
            tm.FoldReducer.__init__(self, step_time, 0.0, False, False, 1.0)

    with pytest.raises(ValueError, match="fill must be 0"):
        Filled(1.0)


def test_fold_errors_name_the_reducer():
    class Bad(tm.FoldReducer):
        def fold(self, obs, state):
            return "not a tensor"

    with pytest.raises(TypeError, match="Bad.fold"):
        Bad(1.0)(torch.ones(2))


def test_python_copies_keep_the_python_fold():
    import copy

    reducer = max_reducer(tm.FoldReducer)(DT, DURATION)
    for x in inputs(3):
        reducer(x)
    duplicate = copy.deepcopy(reducer)  # __getstate__/__setstate__, as pickle
    torch.testing.assert_close(duplicate.dump(), reducer.dump())
    duplicate(torch.full((3,), -100.0))  # a maximum: the state stays
    torch.testing.assert_close(duplicate.peek(), reducer.peek())


def scripted_with(reducer):
    module = Monitored()

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    holder = Holder()
    monitor = tm.DifferenceMonitor(reducer, "state", module)
    module(torch.ones(3))  # types the post-hook's output
    return torch.jit.script(holder), monitor


@pytest.mark.parametrize(
    "make",
    [lambda: max_reducer(tm.FoldReducer)(DT, DURATION), lambda: Doubling(1.0, 0.5)],
    ids=["fold", "forward"],
)
def test_saving_a_python_reducer_is_refused(make):
    scripted, monitor = scripted_with(make())
    scripted(torch.ones(3))  # runs (the Python code is reachable in-process)
    with pytest.raises(Exception, match="Python code"):
        torch.jit.save(scripted, io.BytesIO())
    # torch.save refuses scripted models as such; the reducer object itself
    # (what a pickled model would hold) refuses too.
    with pytest.raises(RuntimeError):
        torch.save(scripted, io.BytesIO())
    with pytest.raises(ValueError, match="Python code"):
        torch.save(monitor.core.reducer(), io.BytesIO())


def test_export_of_a_python_fold_is_refused():
    reducer = max_reducer(tm.FoldReducer)(DT, DURATION)

    class Feeds(nn.Module):
        def __init__(self):
            super().__init__()
            self.reducer = reducer

        def forward(self, x):
            self.reducer(x)
            return x + 1

    with pytest.raises(Exception, match="Python code"):
        torch.export.export(Feeds(), (torch.ones(3),), strict=False)
