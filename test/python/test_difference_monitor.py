"""torch_monitor.DifferenceMonitor against inferno's (inferno-ai 0.0.5).

The same modules and inputs go through both monitors and peek/dump/view are
compared. Where the spec fixes inferno (FIX rows of
/work/shared/spec/difference-monitor.md) ours is asserted and inferno's own
result is asserted too, to show the difference. Then what inferno has no
counterpart for: errors, hook removal, TorchScript (scripting, saving,
loading in a fresh process) and CUDA (skipped without a GPU).
"""

import copy
import gc
import json
import pickle
import subprocess
import sys
import textwrap
import weakref
from typing import Tuple

import pytest
import torch
from torch import nn

tm = pytest.importorskip("torch_monitor")


@pytest.fixture
def inferno():
    """The reference, inferno-ai 0.0.5 (tests comparing with it skip without)."""
    return pytest.importorskip("inferno.observe")




# ---------------------------------------------------------------- helpers


class Leaky(nn.Module):
    """Replaces its state out of place: a leaky integrator."""

    def __init__(self, n: int = 3):
        super().__init__()
        self.register_buffer("state", torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state = self.state * 0.5 + x
        return self.state


class InPlace(nn.Module):
    """Updates its state in place (inferno measures zero for it)."""

    def __init__(self, n: int = 3):
        super().__init__()
        self.register_buffer("state", torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(x)
        return self.state * 1.0


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Leaky()
        self.layers = nn.ModuleList([Leaky(), Leaky()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) + self.layers[1](x * 2)


class Holder(nn.Module):
    """Holds a plain (non-buffer) attribute that forward() replaces by the
    next value of a script; used for None and tuple values."""

    def __init__(self, values):
        super().__init__()
        self.values = list(values)
        self.value = self.values.pop(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.value = self.values.pop(0)
        return x


def ours_and_inferno(inferno, module_factory, attr, ours_reducer, inferno_reducer, **kwargs):
    """Two identical modules, one monitored by each implementation."""
    torch.manual_seed(0)
    m_ours = module_factory()
    torch.manual_seed(0)
    m_inf = module_factory()
    ours = tm.DifferenceMonitor(ours_reducer, attr, m_ours, **kwargs)
    theirs = inferno.DifferenceMonitor(inferno_reducer, attr, m_inf, **kwargs)
    return (m_ours, ours), (m_inf, theirs)


def assert_same(a, b):
    if a is None or b is None:
        assert a is None and b is None, (a, b)
        return
    torch.testing.assert_close(a.detach(), b.detach())


def assert_same_records(ours, theirs, times=()):
    assert_same(ours.peek(), theirs.peek())
    assert_same(ours.dump(), theirs.dump())
    assert_same(ours.latest, theirs.latest)
    for t in times:
        assert_same(ours.view(t), theirs.view(t))


def inputs(n, size=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(size, generator=g) for _ in range(n)]


# --------------------------------------------------- same as inferno's


@pytest.mark.parametrize(
    "make_reducers",
    [
        lambda lib: lib.PassthroughReducer(1.0, duration=3.0),
        lambda lib: lib.EMAReducer(1.0, alpha=0.25, duration=3.0),
    ],
    ids=["passthrough", "ema"],
)
def test_out_of_place_updates_match_inferno(make_reducers, inferno):
    (m1, ours), (m2, theirs) = ours_and_inferno(inferno, Leaky, "state", make_reducers(tm), make_reducers(inferno))
    assert ours.peek() is None and theirs.peek() is None
    for i, x in enumerate(inputs(5)):
        out1, out2 = m1(x), m2(x)
        torch.testing.assert_close(out1, out2)
        assert_same_records(ours, theirs, times=(0.0, 0.5, 1.0, 1.75) if i >= 2 else ())
    assert ours.peek().abs().sum() > 0


def test_recorded_value_is_the_change_across_forward():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=2.0), "state", m)
    history = []
    for x in inputs(3):
        before = m.state.clone()
        m(x)
        history.append(m.state - before)
    torch.testing.assert_close(mon.peek(), history[-1])
    torch.testing.assert_close(mon.dump(), torch.stack(history[::-1][:2]))  # N = 2


def test_nested_paths_match_inferno(inferno):
    for attr in ("block.state", "layers.1.state"):
        (m1, ours), (m2, theirs) = ours_and_inferno(
            inferno, Outer, attr, tm.PassthroughReducer(1.0, duration=2.0), inferno.PassthroughReducer(1.0, duration=2.0)
        )
        for x in inputs(3):
            m1(x), m2(x)
        assert_same_records(ours, theirs, times=(1.0,))
        # the hooks are on the module given, not on the nested one
        assert len(m1._forward_hooks) == 1 and len(m1.block._forward_hooks) == 0


def test_parameter_path_is_resolved_at_every_call():
    """A parameter replaced between calls is read anew (no cached object)."""
    lin = nn.Linear(2, 2)
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "weight", lin)

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            with torch.no_grad():
                self.lin.weight = nn.Parameter(self.lin.weight + 1.0)
            return self.lin(x)

    outer = Step()
    mon_outer = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "lin.weight", outer)
    outer(torch.randn(1, 2))
    torch.testing.assert_close(mon_outer.peek(), torch.ones(2, 2))
    torch.testing.assert_close(mon.peek(), torch.zeros(2, 2))  # lin's own forward changes nothing


def test_train_eval_gating_matches_inferno(inferno):
    (m1, ours), (m2, theirs) = ours_and_inferno(
        inferno, Leaky, "state", tm.PassthroughReducer(1.0, duration=3.0), inferno.PassthroughReducer(1.0, duration=3.0),
        train_update=False,
    )
    xs = inputs(6)
    m1(xs[0]), m2(xs[0])  # training: skipped by both
    assert ours.peek() is None and theirs.peek() is None
    m1.eval(), m2.eval()
    m1(xs[1]), m2(xs[1])
    assert_same_records(ours, theirs)
    assert ours.peek() is not None
    # switching the flags afterwards
    ours.evalexec = False
    theirs.evalexec = False
    assert ours.evalexec is False and ours.trainexec is False
    m1(xs[2]), m2(xs[2])
    assert_same_records(ours, theirs)
    assert ours.dump()[1].abs().sum() == 0  # still only one record
    ours.trainexec = True
    theirs.trainexec = True
    m1.train(), m2.train()
    m1(xs[3]), m2(xs[3])
    assert_same_records(ours, theirs)
    assert ours.dump()[1].abs().sum() > 0


def test_gating_is_checked_when_each_hook_runs():
    class Switch(Leaky):
        """Leaves forward() in the other mode."""

        def forward(self, x):
            out = super().forward(x)
            self.train(not self.training)
            return out

    # pre-hook runs (train), post-hook is skipped (eval): nothing recorded
    m = Switch()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m, eval_update=False)
    m(torch.ones(3))
    assert not m.training and mon.peek() is None
    # pre-hook skipped (eval), post-hook runs (train): nothing was captured in
    # this call (the capture of the first call is not reused), so the value
    # before counts as None, i.e. zeros
    m.state += 5.0
    m(torch.ones(3))
    assert m.training
    torch.testing.assert_close(mon.peek(), m.state)  # post - 0


def test_a_skipped_hook_drops_the_capture_in_eager_and_scripted_modules_alike():
    """Eager hooks that skip (the mode does not match) drop the thread's
    capture as the scripted hooks' calls do, so both record one history for
    a forward that flips the mode each call (eager kept the capture and
    paired it with the next call: [2, 2] where scripted gave [14, 12])."""

    class Flip(nn.Module):
        k: torch.Tensor

        def __init__(self):
            super().__init__()
            self.k = torch.full((1,), 10.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.k = self.k + 1
            self.training = not self.training
            return x

    histories = []
    for scripted in (False, True):
        module = Flip()
        mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, 5.0), "k", module, eval_update=False)
        run = torch.jit.script(module) if scripted else module
        for _ in range(4):
            run(torch.ones(1))
        histories.append(mon.dump().flatten().tolist())
    # Calls 2 and 4 start in eval (no capture) and end in train: the value
    # after, against None (zeros); calls 1 and 3 end in eval (skipped).
    assert histories == [[14.0, 12.0, 0.0, 0.0, 0.0]] * 2


def test_prepend_orders_both_hooks_like_inferno(inferno):
    def user_pre(mod, args):
        mod.state = mod.state + 100.0

    def user_post(mod, args, out):
        mod.state = mod.state + 1000.0

    # s = 0; user pre-hook +100; forward s/2 + 1; user post-hook +1000
    for prepend, expected in ((False, 1051.0 - 100.0), (True, 51.0 - 0.0)):
        m1, m2 = Leaky(), Leaky()
        for m in (m1, m2):
            m.register_forward_pre_hook(user_pre)
            m.register_forward_hook(user_post)
        ours = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m1, prepend=prepend)
        theirs = inferno.DifferenceMonitor(inferno.PassthroughReducer(1.0), "state", m2, prepend=prepend)
        x = torch.ones(3)
        m1(x), m2(x)
        assert_same_records(ours, theirs)
        torch.testing.assert_close(ours.peek(), torch.full((3,), expected))
        first_pre = next(iter(m1._forward_pre_hooks.values()))
        first_post = next(iter(m1._forward_hooks.values()))
        assert (first_pre is not user_pre) == prepend
        assert (first_post is not user_post) == prepend


def test_tuple_values_zip_and_shorter_wins_like_inferno(inferno):
    a, b, c = torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0]), torch.tensor([5.0, 5.0])
    script = [(a,), (b, c), (c, a)]

    (m1, ours), (m2, theirs) = ours_and_inferno(
        inferno, lambda: Holder(script), "value", tm.PassthroughReducer(1.0, duration=1.0), inferno.PassthroughReducer(1.0, duration=1.0)
    )
    x = torch.zeros(1)
    m1(x), m2(x)  # (a,) -> (b, c): one pair, b - a
    assert_same_records(ours, theirs)
    torch.testing.assert_close(ours.peek(), b - a)


def test_tuple_values_feed_several_reducer_inputs_like_inferno(inferno):
    x0, x1 = torch.tensor([0.0, 1.0]), torch.tensor([3.0, 1.0])
    cond0, cond1 = torch.tensor([False, False]), torch.tensor([True, False])
    script = [(x0, cond0), (x1, cond1), (x0, cond0)]

    def op(post, pre):  # the condition passes through, values are differenced
        return post if post.dtype == torch.bool else post - pre

    (m1, ours), (m2, theirs) = ours_and_inferno(
        inferno, lambda: Holder(script),
        "value",
        tm.ConditionalCumulativeTraceReducer(1.0, 2.0, 1.0, 0.5, duration=1.0),
        inferno.ConditionalCumulativeTraceReducer(1.0, 2.0, 1.0, 0.5, duration=1.0),
        op_=op,
    )
    for _ in range(2):
        m1(torch.zeros(1)), m2(torch.zeros(1))
        assert_same_records(ours, theirs)
    assert ours.peek().abs().sum() > 0


def test_custom_filter_and_map_match_inferno(inferno):
    def filter_(post, pre):
        return bool((post - pre).sum() > 0)

    def map_(post, pre):
        return (post * 2 - pre,)

    (m1, ours), (m2, theirs) = ours_and_inferno(
        inferno, Leaky, "state", tm.PassthroughReducer(1.0, duration=4.0), inferno.PassthroughReducer(1.0, duration=4.0),
        filter_=filter_, map_=map_,
    )
    for x in (torch.ones(3), -torch.ones(3) * 3, torch.ones(3) * 2):
        m1(x), m2(x)
        assert_same_records(ours, theirs)
    assert ours.filter_ is filter_ and ours.map_ is map_
    # two accepted calls: rows 0 and 1 written, 2 and 3 still the fill value
    dump = ours.dump()
    assert dump[0].abs().sum() > 0 and dump[1].abs().sum() > 0 and dump[2].abs().sum() == 0


def test_clear_forgets_like_inferno(inferno):
    (m1, ours), (m2, theirs) = ours_and_inferno(
        inferno, Leaky, "state", tm.PassthroughReducer(1.0, duration=2.0), inferno.PassthroughReducer(1.0, duration=2.0)
    )
    for x in inputs(2):
        m1(x), m2(x)
    ours.clear(keepshape=True)
    theirs.clear(keepshape=True)
    assert ours.peek() is None and theirs.peek() is None
    m1(torch.ones(3)), m2(torch.ones(3))
    assert_same_records(ours, theirs)
    ours.clear()
    theirs.clear()
    assert ours.peek() is None and ours.dump() is None and theirs.dump() is None


def test_clear_between_hooks_forgets_the_captured_value():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m)

    def clear_in_forward(mod, args):
        mon.clear()

    m.register_forward_pre_hook(clear_in_forward)  # runs after our pre-hook
    m.state += 4.0
    m(torch.ones(3))
    # the capture (4) was forgotten: before counts as None -> post - 0
    torch.testing.assert_close(mon.peek(), torch.full((3,), 3.0))


def test_registers_on_a_module_that_is_falsy(inferno):
    class Empty(nn.Sequential):  # len() == 0, so bool(module) is False
        def __init__(self):
            super().__init__()
            self.register_buffer("state", torch.zeros(2))

        def forward(self, x):
            self.state = self.state + x
            return x

    m = Empty()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m)
    m(torch.ones(2))
    torch.testing.assert_close(mon.peek(), torch.ones(2))
    # inferno 0.0.5 tests `if module:` and takes the empty container for None
    with pytest.raises(RuntimeError, match="weak reference"):
        inferno.DifferenceMonitor(inferno.PassthroughReducer(1.0), "state", Empty())


def test_a_bare_torchscript_reducer_object_works_too():
    reducer = tm.PassthroughReducer(1.0, duration=2.0)
    m = Leaky()
    mon = tm.DifferenceMonitor(reducer.script_reducer, "state", m)
    m(torch.ones(3))
    torch.testing.assert_close(mon.peek(), torch.ones(3))
    torch.testing.assert_close(reducer.peek(), torch.ones(3))  # the same reducer
    torch.testing.assert_close(mon.view(1.0), torch.zeros(3))
    mon.clear(keepshape=True)
    assert mon.peek() is None and reducer.peek() is None


def test_partialconstructor_builds_registered_monitors():
    ctor = tm.DifferenceMonitor.partialconstructor(
        tm.PassthroughReducer(1.0, duration=1.0), train_update=True, eval_update=False, prepend=True
    )
    m = Leaky()
    mon = ctor("state", m)
    assert isinstance(mon, tm.DifferenceMonitor) and mon.registered and mon.prepend
    assert mon.trainexec and not mon.evalexec
    m(torch.ones(3))
    torch.testing.assert_close(mon.peek(), torch.ones(3))


# --------------------------------------------------------------- FIX rows


def test_fix_in_place_update_is_measured(inferno):
    (m1, ours), (m2, theirs) = ours_and_inferno(
        inferno, InPlace, "state", tm.PassthroughReducer(1.0, duration=2.0), inferno.PassthroughReducer(1.0, duration=2.0)
    )
    xs = inputs(2)
    for x in xs:
        m1(x), m2(x)
    torch.testing.assert_close(ours.peek(), xs[1])
    torch.testing.assert_close(ours.dump(), torch.stack([xs[1], xs[0]]))
    # inferno kept a reference to the very tensor that forward() updated
    assert torch.count_nonzero(theirs.dump()) == 0


def test_fix_batchnorm_running_mean_is_measured(inferno):
    torch.manual_seed(0)
    bn1, bn2 = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    ours = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "running_mean", bn1)
    theirs = inferno.DifferenceMonitor(inferno.PassthroughReducer(1.0), "running_mean", bn2)
    x = torch.randn(8, 3) + 2.0
    before = bn1.running_mean.clone()
    bn1(x), bn2(x)
    expected = bn1.running_mean - before  # momentum * (batch mean - old)
    assert expected.abs().min() > 0.05
    torch.testing.assert_close(ours.peek(), expected)
    assert torch.count_nonzero(theirs.peek()) == 0


def test_fix_none_before_counts_as_zeros(inferno):
    t = torch.tensor([1.0, -2.0])
    (m1, ours), (m2, theirs) = ours_and_inferno(
        inferno, lambda: Holder([None, t, None, None]), "value", tm.PassthroughReducer(1.0, duration=2.0),
        inferno.PassthroughReducer(1.0, duration=2.0),
    )
    m1(torch.zeros(1))
    torch.testing.assert_close(ours.peek(), t)  # t - 0
    with pytest.raises(TypeError):  # inferno 0.0.5: None - tensor
        m2(torch.zeros(1))
    m1(torch.zeros(1))  # t -> None: 0 - t
    torch.testing.assert_close(ours.peek(), -t)
    m1(torch.zeros(1))  # None -> None: rejected by the default filter
    torch.testing.assert_close(ours.dump(), torch.stack([-t, t]))


def test_fix_none_facing_a_tuple_is_zeros_per_element():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([2.0, 3.0])
    seen = []

    def op(post, pre):
        seen.append((post, pre))
        return post - pre

    m = Holder([None, (a, b)])
    mon = tm.DifferenceMonitor(tm.ConditionalCumulativeTraceReducer(1.0, 2.0, 1.0, 1.0), "value", m, op_=op)
    m(torch.zeros(1))
    assert mon.peek() is not None
    assert [(p.tolist(), q.tolist()) for p, q in seen] == [([1.0, 0.0], [0.0, 0.0]), ([2.0, 3.0], [0.0, 0.0])]


def test_fix_partialconstructor_honours_op(inferno):
    def add(post, pre):
        return post + pre

    ours_ctor = tm.DifferenceMonitor.partialconstructor(tm.PassthroughReducer(1.0), op_=add)
    inf_ctor = inferno.DifferenceMonitor.partialconstructor(inferno.PassthroughReducer(1.0), op_=add)
    m1, m2 = Leaky(), Leaky()
    m1.state += 2.0
    m2.state += 2.0
    ours, theirs = ours_ctor("state", m1), inf_ctor("state", m2)
    m1(torch.ones(3)), m2(torch.ones(3))
    torch.testing.assert_close(ours.peek(), torch.full((3,), 2.0 + 2.0))  # post + pre
    torch.testing.assert_close(theirs.peek(), torch.full((3,), 2.0 - 2.0))  # op_ dropped
    assert ours.op_ is add


class InPlaceParam(nn.Module):
    """A parameter updated in place during forward (as a plasticity rule would)."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(3))

    def forward(self, x):
        with torch.no_grad():
            self.p.mul_(3.0)
        return x


def test_keep_graph_keeps_the_captured_value_differentiable():
    seen = []

    def op(post, pre):
        seen.append(pre)
        return post - pre

    m = InPlaceParam()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "p", m, op_=op, keep_graph=True)
    m(torch.zeros(1))
    torch.testing.assert_close(mon.peek().detach(), torch.full((3,), 2.0))
    (pre,) = seen
    assert pre.requires_grad and pre.grad_fn is not None
    (pre * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    torch.testing.assert_close(m.p.grad, torch.tensor([1.0, 2.0, 3.0]))
    # without grad mode nothing is recorded
    seen.clear()
    with torch.no_grad():
        m(torch.zeros(1))
    assert seen[0].grad_fn is None


def test_history_is_detached_by_default():
    seen = []

    def op(post, pre):
        seen.append(pre)
        return post * 1.0 - pre

    m = InPlaceParam()
    plain = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "p", m)
    custom = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "p", m, op_=op)
    assert plain.keep_graph is False
    m(torch.zeros(1))
    for mon in (plain, custom):
        assert not mon.peek().requires_grad and mon.peek().grad_fn is None
        torch.testing.assert_close(mon.peek(), torch.full((3,), 2.0))
    assert seen[0].grad_fn is None  # the captured value is a plain copy
    with pytest.raises(TypeError, match="'keep_graph' must be a bool"):
        tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "p", m, keep_graph="no")


def test_forwards_in_inference_mode_then_training_keep_recording():
    # Buffers made under torch.inference_mode() are inference tensors, which
    # torch refuses to update in place outside it: the monitor's reused
    # capture and the reducer's history must then be replaced, not written.
    m = InPlaceParam()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, 3.0), "p", m)
    scripted = torch.jit.script(m)
    with torch.inference_mode():
        m(torch.zeros(1))
        scripted(torch.zeros(1))
    m(torch.zeros(1))
    scripted(torch.zeros(1))
    with torch.inference_mode():
        m(torch.zeros(1))
    m(torch.zeros(1))
    torch.testing.assert_close(mon.peek(), m.p.detach() * (2.0 / 3.0))
    assert mon.peek()[0].item() == 2 * 3**5  # six forwards, all recorded
    assert not mon.peek().is_inference()


# ------------------------------------------------------------------ errors


def test_a_missing_path_warns_when_registered_and_raises_at_forward_naming_path_and_part(inferno):
    # inferno resolves the path at every forward, so a monitor may be
    # registered before the module has the attribute (its own tests do that);
    # ours does the same, warns at registration and, at a forward that
    # cannot resolve it, names the whole path and the missing part (issue 25).
    outer = Outer()
    with pytest.warns(RuntimeWarning, match=r"'block\.missing'.*'block'.*'missing'.*first forward"):
        mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "block.missing", outer)
    assert mon.registered
    with pytest.raises(AttributeError) as info:
        outer(torch.ones(3))
    message = str(info.value)
    assert "'block.missing'" in message and "'missing'" in message and "'block'" in message
    mon.deregister()
    with pytest.warns(RuntimeWarning, match=r"'nope\.state'.*the module.*'nope'"):
        mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "nope.state", outer)
    outer.nope = Leaky()  # the attribute exists by the first forward: it records
    outer(torch.ones(3))
    assert mon.peek() is not None
    mon.deregister()
    # Removed after registration: the forward says so, naming the path.
    outer.extra = torch.nn.Linear(2, 2)
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "extra.weight", outer)
    del outer.extra
    with pytest.raises(AttributeError, match=r"'extra\.weight'"):
        outer(torch.ones(3))
    mon.deregister()
    # inferno registers too, and raises getattr's own AttributeError, which
    # names only the part
    other = Outer()
    theirs = inferno.DifferenceMonitor(inferno.PassthroughReducer(1.0), "block.missing", other)
    with pytest.raises(AttributeError) as info:
        other(torch.ones(3))
    assert "block.missing" not in str(info.value) and theirs.registered


def test_invalid_arguments(inferno):
    with pytest.raises(ValueError, match="attribute path"):
        tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "a..b")
    with pytest.raises(ValueError, match="attribute path"):
        tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "")
    with pytest.raises(TypeError, match="torch_monitor reducer"):
        tm.DifferenceMonitor(inferno.PassthroughReducer(1.0), "state")
    with pytest.raises(TypeError, match="filter_"):
        tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", filter_=3)
    with pytest.raises(TypeError, match="nn.Module"):
        tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", module=object())


def test_reducer_fed_another_shape_names_the_monitor():
    m = Holder([torch.zeros(2), torch.ones(2), torch.ones(5), torch.zeros(5)])
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=2.0), "value", m)
    m(torch.zeros(1))
    m.values[0] = torch.ones(3)  # the attribute changes shape between calls
    m.value = torch.zeros(3)
    with pytest.raises((ValueError, RuntimeError), match="DifferenceMonitor 'value'"):
        m(torch.zeros(1))
    torch.testing.assert_close(mon.peek(), torch.ones(2))  # the failed call recorded nothing


def test_view_out_of_range():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=2.0), "state", m)
    assert mon.view(0.0) is None  # nothing recorded yet
    m(torch.ones(3))
    with pytest.raises(ValueError):
        mon.view(5.0)
    with pytest.raises(ValueError):
        mon.view(-1.0)
    torch.testing.assert_close(mon.view(1.0), torch.zeros(3))  # the fill value
    torch.testing.assert_close(mon.view(0.0), torch.ones(3))


def test_python_errors_in_callables_propagate_unchanged():
    class Boom(Exception):
        pass

    def bad_filter(post, pre):
        raise Boom("from filter")

    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m, filter_=bad_filter)
    with pytest.raises(Boom, match="from filter"):
        m(torch.ones(3))
    assert mon.peek() is None


def test_map_must_return_a_tuple_of_tensors():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m, map_=lambda post, pre: post - pre)
    with pytest.raises(TypeError, match="map_ must return a tuple"):
        m(torch.ones(3))
    mon.deregister()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m, map_=lambda post, pre: (1.0,))
    with pytest.raises(TypeError, match="Tensor"):
        m(torch.ones(3))


def test_default_map_rejects_other_values_with_advice():
    m = Holder([1.5, 2.5])
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "value", m)
    with pytest.raises(TypeError, match="map_"):
        m(torch.zeros(1))
    assert mon.peek() is None
    # a custom map_ handles them
    m = Holder([{"v": 1.0}, {"v": 4.0}])
    mon = tm.DifferenceMonitor(
        tm.PassthroughReducer(1.0), "value", m, map_=lambda post, pre: (torch.tensor(post["v"] - pre["v"]),)
    )
    m(torch.zeros(1))
    torch.testing.assert_close(mon.peek(), torch.tensor(3.0))


def test_register_errors_and_reregistration():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state")
    assert not mon.registered
    with pytest.raises(RuntimeError, match="needs a module"):
        mon.register()
    mon.register(m)
    with pytest.raises(RuntimeError, match="already registered"):
        mon.register(Leaky())
    mon.register()  # registered already, no module: nothing to do (as inferno)
    assert len(m._forward_hooks) == 1
    mon.deregister()
    mon.deregister()  # safe twice
    mon.register()  # the last module again
    assert mon.registered and mon.module is m
    m(torch.ones(3))
    torch.testing.assert_close(mon.peek(), torch.ones(3))
    # the last module garbage collected: nothing to re-register to
    mon.deregister()
    del m
    gc.collect()
    with pytest.raises(RuntimeError, match="garbage collected"):
        mon.register()


# ------------------------------------------------------------ hook removal


def test_deregister_removes_hooks_and_state_attribute():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m)
    assert mon.key in m.__dict__ and len(m._forward_pre_hooks) == 1 and len(m._forward_hooks) == 1
    m(torch.ones(3))
    mon.deregister()
    assert not mon.registered
    assert mon.key not in m.__dict__ and len(m._forward_pre_hooks) == 0 and len(m._forward_hooks) == 0
    m(torch.ones(3) * 7)
    torch.testing.assert_close(mon.peek(), torch.ones(3))  # unchanged


def test_garbage_collected_monitor_removes_its_hooks():
    m = Leaky()
    other = m.register_forward_hook(lambda mod, a, o: None)
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m)
    key, ref = mon.key, weakref.ref(mon)
    assert len(m._forward_hooks) == 2
    del mon
    gc.collect()
    assert ref() is None
    assert len(m._forward_hooks) == 1 and len(m._forward_pre_hooks) == 0 and key not in m.__dict__
    m(torch.ones(3))
    other.remove()


def test_module_does_not_keep_the_monitor_alive_and_vice_versa():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m)
    mref = weakref.ref(m)
    del m
    gc.collect()
    assert mref() is None and mon.module is None


def test_deepcopy_of_a_monitored_module_gets_its_own_monitor_state():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m)
    m(torch.ones(3))
    clone = copy.deepcopy(m)
    clone_core = clone.__dict__[mon.key]
    assert clone_core is not mon.core
    clone(torch.ones(3) * 10)
    torch.testing.assert_close(mon.peek(), torch.ones(3))  # the original is untouched
    torch.testing.assert_close(clone_core.peek(), clone.state - m.state)


def test_deepcopy_of_a_monitor_copies_its_reducer():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m)
    m(torch.ones(3))
    twin = copy.deepcopy(mon)
    assert not twin.registered
    assert twin.core.reducer() == twin.reducer_.script_reducer and twin.reducer_ is not mon.reducer_
    assert not twin.core.reducer() == mon.core.reducer()
    m(torch.ones(3) * 5)
    torch.testing.assert_close(twin.peek(), torch.ones(3))  # copied history, not fed
    twin.register(m)  # both monitors on one module now, under two keys
    assert twin.key != mon.key and len(m._forward_hooks) == 2
    m(torch.ones(3))
    torch.testing.assert_close(twin.peek(), mon.peek())


def test_deepcopy_of_module_and_monitor_together_stays_wired():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m)
    for module_first in (True, False):
        if module_first:
            m2, mon2 = copy.deepcopy((m, mon))
        else:
            mon2, m2 = copy.deepcopy((mon, m))
        assert mon2.core is m2.__dict__[mon2.key] and mon2.core.reducer() == mon2.reducer_.script_reducer
        m2(torch.ones(3) * 4)  # the copied hooks feed the copied monitor
        torch.testing.assert_close(mon2.peek(), torch.full((3,), 4.0))
        assert mon.peek() is None
        if not module_first:
            assert not mon2.registered  # the module was not copied yet
            mon2.register(m2)  # takes the copied hooks over
        assert mon2.registered and mon2.module is m2 and len(m2._forward_hooks) == 1
        del mon2
        gc.collect()
        assert len(m2._forward_hooks) == 0 and len(m2._forward_pre_hooks) == 0
        assert len(m._forward_hooks) == 1


def test_monitor_pickles_unregistered_with_its_history():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=2.0), "state", m, train_update=False)
    m.eval()
    m(torch.ones(3))
    back = pickle.loads(pickle.dumps(mon))
    assert not back.registered and back.attr == "state" and not back.trainexec and back.evalexec
    torch.testing.assert_close(back.dump(), mon.dump())
    back.register(m)
    m(torch.ones(3))
    torch.testing.assert_close(back.peek(), mon.peek())


def _keep_all(post, pre):
    return True


def test_the_monitor_object_pickles_with_its_callables():
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=1.0), "state", m)
    m(torch.ones(3))
    copy_ = pickle.loads(pickle.dumps(mon.core))
    assert copy_.name() == "state" and copy_.train_update() and copy_.eval_update()
    torch.testing.assert_close(copy_.peek(), mon.peek())
    # A Python filter_ is pickled by Python's pickle: a module-level function
    # is, a lambda is refused by pickle itself.
    with_filter = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", filter_=_keep_all)
    again = pickle.loads(pickle.dumps(with_filter.core))
    assert tm._C._monitor_callables(again) == (_keep_all, None, None)
    with_lambda = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", filter_=lambda a, b: True)
    with pytest.raises((pickle.PicklingError, AttributeError), match="lambda"):
        pickle.dumps(with_lambda.core)
    # TorchScript cannot hold a Python callable: saving says so.
    with pytest.raises(RuntimeError, match="Python callable"):
        with_filter.core.__getstate__()


# -------------------------------------------------------------- TorchScript


class Annotated(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(3))
        self.block = Leaky()

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
        self.state.add_(x * scale)
        return self.state * 1.0, self.block(x)


class Unannotated(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(3))

    def forward(self, x):
        self.state = self.state + x
        return self.state, x


def test_scripted_module_runs_the_hooks_like_eager():
    eager, to_script = Annotated(), Annotated()
    mon_e = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=3.0), "state", eager)
    mon_s = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=3.0), "state", to_script)
    mon_e2 = tm.DifferenceMonitor(tm.EMAReducer(1.0, 0.5), "block.state", eager)
    mon_s2 = tm.DifferenceMonitor(tm.EMAReducer(1.0, 0.5), "block.state", to_script)
    scripted = torch.jit.script(to_script)
    for i, x in enumerate(inputs(4)):
        eager(x, 0.5 * i)
        scripted(x, 0.5 * i)
    assert_same(mon_s.dump(), mon_e.dump())
    assert_same(mon_s2.dump(), mon_e2.dump())
    assert mon_s.peek().abs().sum() > 0
    # gating reads the scripted module's mode
    scripted.eval()
    mon_s.evalexec = False
    # every argument given: TorchScript checks a scripted hook's `input`
    # against all of forward()'s parameters, defaults are not filled in
    scripted(torch.ones(3), 1.0)
    assert_same(mon_s.dump(), mon_e.dump())


def test_unannotated_forward_is_typed_from_the_first_output():
    m = Unannotated()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m)
    m(torch.ones(3))  # the hook learns that forward returns Tuple[Tensor, Tensor]
    scripted = torch.jit.script(m)
    scripted(torch.ones(3) * 2)
    torch.testing.assert_close(mon.peek(), torch.full((3,), 2.0))


def test_module_list_paths_and_two_monitors_script():
    m = Outer()
    a = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "layers.1.state", m)
    b = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "block.state", m, prepend=True)
    scripted = torch.jit.script(m)
    scripted(torch.ones(3))
    torch.testing.assert_close(a.peek(), torch.full((3,), 2.0))
    torch.testing.assert_close(b.peek(), torch.ones(3))


class Keyed(nn.Module):
    """A ModuleDict whose keys are no Python attribute names."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({"a-b": Leaky(), "class": Leaky(), "0x": Leaky()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks["a-b"](x) + self.blocks["class"](x * 2) + self.blocks["0x"](x * 3)


def test_attribute_path_parts_come_from_the_cpp_parser():
    import keyword

    parts = tm._C._attribute_path_parts
    assert parts("layers.1.state") == [
        ("attribute", "layers"),
        ("index", "1"),
        ("attribute", "state"),
    ]
    assert parts("blocks.a-b.state")[1] == ("key", "a-b")
    assert parts("blocks.0x")[1] == ("key", "0x")
    assert parts("_private.x1") == [("attribute", "_private"), ("attribute", "x1")]
    # `self.class` would not compile as Python: keywords are keys. The C++
    # list of keywords must match the running Python's.
    for word in keyword.kwlist:
        assert parts(f"blocks.{word}")[1] == ("key", word), word
    for soft in ("match", "case", "type", "_"):
        assert parts(soft) == [("attribute", soft)]
    for bad in ("", "a..b", ".a", "a."):
        with pytest.raises(ValueError, match="empty part"):
            parts(bad)


def test_module_dict_keys_that_are_no_identifiers_script():
    m = Keyed()
    monitors = [
        tm.DifferenceMonitor(tm.PassthroughReducer(1.0), f"blocks.{key}.state", m)
        for key in ("a-b", "class", "0x")
    ]
    m(torch.ones(3))  # eager: the same parts resolve through _modules
    scripted = torch.jit.script(m)
    scripted(torch.ones(3))
    for mon, scale in zip(monitors, (1.0, 2.0, 3.0)):
        torch.testing.assert_close(mon.peek(), torch.full((3,), scale * 0.5))


def test_monitors_registered_after_scripting_are_refused():
    scripted = torch.jit.script(Leaky())
    with pytest.raises(TypeError, match="register it on the nn.Module"):
        tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", scripted)


FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch_monitor  # registers the classes
    path, key, key2 = sys.argv[1:4]
    m = torch.jit.load(path)
    monitor = getattr(m, key)
    out = {"saved_dump": monitor.dump().tolist(), "name": monitor.name()}
    m(torch.full((3,), 2.0), 1.0)
    out["peek"] = monitor.peek().tolist()
    out["dump"] = monitor.dump().tolist()
    out["peek2"] = getattr(m, key2).peek().tolist()
    m.eval()
    monitor.set_eval_update(False)
    m(torch.full((3,), 5.0), 1.0)
    out["after_eval"] = monitor.peek().tolist()
    print(json.dumps(out))
    """
)


def test_saved_module_keeps_monitoring_in_a_fresh_process(tmp_path):
    m = Annotated()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=2.0), "state", m)
    mon2 = tm.DifferenceMonitor(tm.EMAReducer(1.0, alpha=0.5), "block.state", m)
    scripted = torch.jit.script(m)
    scripted(torch.ones(3), 1.0)
    path = tmp_path / "monitored.pt"
    torch.jit.save(scripted, str(path))
    saved_dump = mon.dump().tolist()
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(path), mon.key, mon2.key],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["name"] == "state"
    assert out["saved_dump"] == saved_dump  # the history travelled with the model
    assert out["peek"] == [2.0, 2.0, 2.0]
    assert out["dump"] == [[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]]
    assert out["after_eval"] == [2.0, 2.0, 2.0]  # gated off in eval mode
    # EMA of the block's change: first 1 (s: 0 -> 1), then 0.5*1.5 + 0.5*1
    assert out["peek2"] == pytest.approx([1.25] * 3)


def test_reducer_shared_with_the_module_stays_shared_after_loading(tmp_path):
    class WithReducer(Leaky):
        def __init__(self):
            super().__init__()
            self.history = tm.PassthroughReducer(1.0, duration=2.0)

    m = WithReducer()
    mon = tm.DifferenceMonitor(m.history, "state", m)
    scripted = torch.jit.script(m)
    scripted(torch.ones(3))
    torch.jit.save(scripted, str(tmp_path / "shared.pt"))
    loaded = torch.jit.load(str(tmp_path / "shared.pt"))
    loaded(torch.ones(3) * 4)
    # one reducer object in the saved file: the module's and the monitor's
    torch.testing.assert_close(loaded.history.peek(), getattr(loaded, mon.key).peek())
    torch.testing.assert_close(loaded.history.dump(), torch.stack([torch.full((3,), 3.5), torch.ones(3)]))


CPP_LOADER_CMAKE = """
cmake_minimum_required(VERSION 3.18)
project(LoadMonitored LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(TorchMonitor REQUIRED)
add_executable(load_monitored main.cpp)
target_link_libraries(load_monitored PRIVATE TorchMonitor::torch_monitor)
"""

CPP_LOADER_MAIN = r"""
// Loads a scripted module saved from Python, runs it, prints the monitor's
// newest record: `peek v0 v1 v2`, once after module(inputs) (runs the
// module's hooks) and once after module.forward(inputs) (does not).
#include <iostream>
#include <torch/script.h>

static void print(const char* label, torch::jit::Object& monitor) {
  torch::Tensor peek = monitor.run_method("peek").toTensor();
  std::cout << label;
  for (int64_t i = 0; i < peek.numel(); ++i) std::cout << " " << peek[i].item<float>();
  std::cout << std::endl;
}

int main(int argc, char** argv) {
  torch::jit::Module m = torch::jit::load(argv[1]);
  torch::jit::Object monitor(m.attr(argv[2]).toObject());
  m({torch::full({3}, 2.0), 1.0});
  print("call", monitor);
  m.forward({torch::full({3}, 5.0), 1.0});
  print("forward", monitor);
  return 0;
}
"""


def test_saved_module_keeps_monitoring_in_a_cpp_program(tmp_path):
    cpp_build = pytest.importorskip("cpp_build")
    source = tmp_path / "src"
    source.mkdir()
    (source / "CMakeLists.txt").write_text(CPP_LOADER_CMAKE)
    (source / "main.cpp").write_text(CPP_LOADER_MAIN)
    build = cpp_build.build_project(source, tmp_path / "build", tm, ("load_monitored",))
    m = Annotated()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m)
    scripted = torch.jit.script(m)
    scripted(torch.ones(3), 1.0)
    torch.jit.save(scripted, str(tmp_path / "monitored.pt"))
    proc = cpp_build.run([build / "load_monitored", tmp_path / "monitored.pt", mon.key], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert [float(v) for v in lines["call"].split()] == [2.0, 2.0, 2.0]
    # forward() runs no hooks of the module itself: the record is unchanged
    assert [float(v) for v in lines["forward"].split()] == [2.0, 2.0, 2.0]


def test_saving_python_callables_fails_clearly(tmp_path):
    m = Leaky()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m, filter_=lambda post, pre: True)
    scripted = torch.jit.script(m)
    scripted(torch.ones(3))  # runs in this process, callable included
    torch.testing.assert_close(mon.peek(), torch.ones(3))
    with pytest.raises(RuntimeError, match=r"DifferenceMonitor 'state'.*Python callable"):
        torch.jit.save(scripted, str(tmp_path / "x.pt"))
    # with the defaults it saves
    plain = Leaky()
    kept = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", plain)
    torch.jit.save(torch.jit.script(plain), str(tmp_path / "ok.pt"))
    loaded = torch.jit.load(str(tmp_path / "ok.pt"))
    loaded(torch.ones(3))
    torch.testing.assert_close(getattr(loaded, kept.key).peek(), torch.ones(3))


def test_torchscript_class_can_be_used_directly():
    reducer = tm.PassthroughReducer(1.0)
    core = torch.classes.torch_monitor.DifferenceMonitor(reducer.script_reducer, "x", True, False)
    core.before(torch.ones(2), True)
    core.after(torch.ones(2) * 3, True)
    torch.testing.assert_close(reducer.peek(), torch.full((2,), 2.0))
    core.before(torch.ones(2), False)  # eval: gated off
    core.after(torch.ones(2) * 9, False)
    torch.testing.assert_close(reducer.peek(), torch.full((2,), 2.0))
    assert core.name() == "x" and core.train_update() and not core.eval_update()


def test_the_python_core_takes_the_hook_calls_by_keyword_as_the_schema_names_them():
    reducer = tm.PassthroughReducer(1.0)
    core = tm.DifferenceMonitor(reducer, "x").core
    core.before(value=torch.ones(2), training=True)
    core.after(torch.ones(2) * 3, training=True)
    torch.testing.assert_close(reducer.peek(), torch.full((2,), 2.0))
    for args, kwargs in [
        ((), {"value": torch.ones(2)}),  # training missing
        ((torch.ones(2), True), {"training": True}),  # given twice
        ((torch.ones(2),), {"train": True}),  # not the schema's name
        ((torch.ones(2), True, True), {}),
    ]:
        with pytest.raises(TypeError, match=r"before\(value, training\) takes those 2 argument"):
            core.before(*args, **kwargs)
    # Its other methods are made as every face's: checked by kind.
    with pytest.raises(TypeError, match="set_keep_graph.. argument 'value' must be a bool"):
        core.set_keep_graph(value=1)


# --------------------------------------------------------------------- CUDA


@pytest.mark.cuda
def test_cuda_forward_does_not_synchronise():
    torch.manual_seed(0)
    m = InPlace().cuda()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=2.0).to("cuda"), "state", m)
    lin = nn.Linear(8, 8).cuda()
    mon_w = tm.DifferenceMonitor(tm.EMAReducer(1.0, 0.5).to("cuda"), "weight", lin)
    xs = [x.cuda() for x in inputs(3)]
    z = torch.randn(2, 8, device="cuda")
    m(xs[0]), lin(z)  # first records allocate the histories
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x in xs[1:]:
            m(x)
            lin(z)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert mon.peek().is_cuda
    torch.testing.assert_close(mon.dump().cpu(), torch.stack([xs[2], xs[1]]).cpu())
    assert torch.count_nonzero(mon_w.peek()) == 0


@pytest.mark.cuda
def test_cuda_scripted_forward_does_not_synchronise():
    m = Annotated().cuda()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0).to("cuda"), "state", m)
    scripted = torch.jit.script(m)
    x = torch.ones(3, device="cuda")
    scripted(x, 1.0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        scripted(x, 2.0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.testing.assert_close(mon.peek().cpu(), torch.full((3,), 2.0))


@pytest.mark.cuda
def test_cuda_module_with_cpu_reducer_names_the_monitor():
    m = InPlace().cuda()
    mon = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "state", m)  # reducer left on the CPU
    assert mon.registered
    with pytest.raises((RuntimeError, ValueError), match="DifferenceMonitor 'state'") as info:
        m(torch.ones(3, device="cuda"))
    assert "cuda" in str(info.value).lower()


# ------------------------------------------- differences written into the history


def test_differences_go_into_the_history_unless_someone_holds_it():
    """With the default callables the difference is subtracted straight into
    the reducer's history (Reducer::forwardInto); a peek() still held, or a
    state of another dtype, takes the ordinary way, which never changes
    what an earlier peek() returned."""
    module = InPlace(4)
    reducer = tm.PassthroughReducer(1.0, 2.0)
    monitor = tm.DifferenceMonitor(reducer, "state", module)
    module(torch.ones(4))
    memory = reducer.data.data_ptr()
    module(torch.full((4,), 2.0))
    assert reducer.data.data_ptr() == memory  # written in place
    held = monitor.peek()
    for k in (3.0, 4.0, 5.0):
        module(torch.full((4,), k))
        assert held.tolist() == [2.0] * 4  # never overwritten in place
    assert monitor.dump().tolist() == [[5.0] * 4, [4.0] * 4]  # 2 rows
    del held
    module(torch.full((4,), 6.0))
    assert monitor.dump().tolist() == [[6.0] * 4, [5.0] * 4]
    # A float64 state feeds a float32 history the ordinary way (cast).
    module64 = InPlace(2).double()
    monitor64 = tm.DifferenceMonitor(
        tm.PassthroughReducer(1.0, 1.0).float(), "state", module64)
    module64(torch.full((2,), 0.5, dtype=torch.float64))
    assert monitor64.peek().dtype == torch.float32
    assert monitor64.peek().tolist() == [0.5, 0.5]
