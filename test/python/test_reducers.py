"""The reducers against inferno (inferno-ai 0.0.5) on the same inputs.

Every reducer is fed the same random observations as its inferno twin for
more steps than its history holds (so the ring wraps); after each step peek()
and dump() must agree, and at the end view() at exact and interpolated times,
with float and tensor times (one per element, or several along a trailing
dimension). The rest covers what inferno lacks or gets wrong (the duration
FIX), saving (state_dict, pickling, TorchScript), dtype/device handling,
errors, and CUDA (results, and no host synchronisation in forward).
"""

import copy
import io
import math
import pickle

import pytest
import torch
from torch import nn

inferno_observe = pytest.importorskip("inferno.observe")

from conftest import load_module  # noqa: E402

tm = load_module("torch_monitor")


DT = 0.3
DURATION = 2.1  # 2.1 / 0.3 = 7.000000000000001 -> 8 states (9 inclusive)
STEPS = 19  # more than twice the history: the ring wraps
SHAPE = (3, 4)


def close(actual, expected, rtol=1e-6, atol=1e-6):
    """Same shape and values (inf/nan where the other has them)."""
    if expected is None or actual is None:
        return actual is None and expected is None
    return actual.shape == expected.shape and torch.allclose(
        actual.double().cpu(), expected.double().cpu(), rtol=rtol, atol=atol, equal_nan=True
    )


def assert_close(actual, expected, what=""):
    assert close(actual, expected), f"{what}\nours:\n{actual}\ninferno:\n{expected}"


# -- the ten reducers, built the same way for both libraries ------------------
# Each case: (class name, positional args, keyword args, input maker). The
# criteria are torch_monitor.Criterion objects, which inferno accepts as the
# plain callables they also are.


def gaussian(gen, shape):
    return (torch.randn(shape, generator=gen),)


def binary(gen, shape):
    return ((torch.rand(shape, generator=gen) < 0.4).float(),)


def near_half(gen, shape):
    return (torch.rand(shape, generator=gen),)


def with_condition(gen, shape):
    return (torch.randn(shape, generator=gen), torch.rand(shape, generator=gen) < 0.4)


GT = tm.Criterion("gt", 0.3)

CASES = [
    ("PassthroughReducer", (DT,), {}, gaussian),
    ("EventReducer", (DT, GT), {}, gaussian),
    ("EventReducer", (DT, GT, "zero"), {}, gaussian),
    ("EventReducer", (DT, GT, "nan"), {}, gaussian),
    ("EMAReducer", (DT, 0.3), {}, gaussian),
    ("CAReducer", (DT,), {}, gaussian),
    ("NearestTraceReducer", (DT, 1.1, 1.5, 1.0), {}, binary),
    ("NearestTraceReducer", (DT, 1.1, 1.5, 0.5, 0.2), {}, near_half),
    ("CumulativeTraceReducer", (DT, 1.1, 1.5, 1.0), {}, binary),
    ("CumulativeTraceReducer", (DT, 1.1, -2.0, 0.5, 0.2), {}, near_half),
    ("ScaledNearestTraceReducer", (DT, 1.1, 0.5, 2.0, GT), {}, gaussian),
    ("ScaledCumulativeTraceReducer", (DT, 1.1, 0.5, 2.0, GT), {}, gaussian),
    ("ConditionalNearestTraceReducer", (DT, 1.1, 0.5, 2.0), {}, with_condition),
    ("ConditionalCumulativeTraceReducer", (DT, 1.1, 0.5, 2.0), {}, with_condition),
]
CASE_IDS = [f"{name}-{i}" for i, (name, *_rest) in enumerate(CASES)]


def build(module, case, **overrides):
    name, args, kwargs, _ = case
    kwargs = {"duration": DURATION, **kwargs, **overrides}
    return getattr(module, name)(*args, **kwargs)


def pair(case, **overrides):
    return build(tm, case, **overrides), build(inferno_observe, case, **overrides)


def feed_both(ours, theirs, case, steps=STEPS, shape=SHAPE, seed=0, check_each=True):
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        inputs = case[3](gen, shape)
        ours(*inputs)
        theirs(*inputs)
        if check_each:
            assert_close(ours.peek(), theirs.peek(), f"peek after step {step}")
            assert_close(ours.dump(), theirs.dump(), f"dump after step {step}")


@pytest.mark.parametrize("inclusive", [False, True])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_matches_inferno_step_by_step(case, inclusive):
    ours, theirs = pair(case, inclusive=inclusive)
    assert ours.peek() is None and theirs.peek() is None
    assert ours.dump() is None and ours.view(0.0) is None
    feed_both(ours, theirs, case)
    n = 9 if inclusive else 8
    assert ours.dump().shape == (n, *SHAPE)
    assert ours.recordsz == n


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_view_matches_inferno(case):
    ours, theirs = pair(case, inclusive=True)
    feed_both(ours, theirs, case, check_each=False)
    n = ours.recordsz
    # Exact steps, a float error away from steps, and between steps.
    times = [k * DT for k in range(n)] + [DT * 2 + 3e-8, DT * (n - 1) + 5e-8, -5e-8]
    gen = torch.Generator().manual_seed(1)
    times += (torch.rand(12, generator=gen, dtype=torch.float64) * DT * (n - 1)).tolist()
    times += [DT * 0.5, DT * 2.5, DT * (n - 1.5)]  # halfway: round half to even
    for t in times:
        assert_close(ours.view(t), theirs.view(t), f"view({t})")
    # A time per element.
    per_element = torch.rand(SHAPE, generator=gen) * DT * (n - 1)
    per_element[0, 0] = 2 * DT  # an exact step among interpolated ones
    assert_close(ours.view(per_element), theirs.view(per_element), "per-element times")
    # Several times per element along a trailing dimension.
    trailing = torch.rand((*SHAPE, 5), generator=gen) * DT * (n - 1)
    trailing[..., 0] = 0.0
    trailing[..., 1] = DT * (n - 1)
    assert_close(ours.view(trailing), theirs.view(trailing), "trailing times")
    # Non-default tolerance.
    assert_close(ours.view(DT + 0.01, 0.02), theirs.view(DT + 0.01, 0.02), "tolerance")


def test_scalar_state_and_zero_dim_time():
    case = ("EMAReducer", (1.0, 0.5), {}, gaussian)
    ours, theirs = pair(case, duration=3.0)
    feed_both(ours, theirs, case, shape=())
    assert_close(ours.view(torch.tensor(0.25)), theirs.view(torch.tensor(0.25)))
    assert_close(ours.view(torch.tensor([0.25, 1.5])), theirs.view(torch.tensor([0.25, 1.5])))


# -- the spec's oracle values -------------------------------------------------


def test_oracle_ema():
    r = tm.EMAReducer(1.0, 0.5, duration=2.0)
    states = []
    for v in (2.0, 4.0, 8.0):
        r(torch.tensor(v))
        states.append(r.peek().item())
    assert states == [2.0, 3.0, 5.5]
    assert r.view(0.25).item() == 4.875
    assert r.latest.item() == 5.5


def test_oracle_ca():
    r = tm.CAReducer(1.0)
    states = []
    for v in (1.0, 2.0, 6.0):
        r(torch.tensor(v))
        states.append(r.peek().item())
    assert states == [1.0, 1.5, 3.0]


def test_oracle_event():
    r = tm.EventReducer(0.5, lambda x: x, duration=1.0)
    expected = [[math.inf, 0], [math.inf, 0.5], [0, 1], [0.5, 1.5]]
    for crit, want in zip([[0, 1], [0, 0], [1, 0], [0, 0]], expected):
        r(torch.tensor(crit, dtype=torch.bool))
        assert r.peek().tolist() == want
    assert r.view(0.25).tolist() == [0.25, 1.25]


def test_oracle_nearest_trace():
    r = tm.NearestTraceReducer(1.0, 2.0, 1, 1)
    got = []
    for v in (1.0, 0.0, 0.0, 1.0):
        r(torch.tensor(v))
        got.append(r.peek().item())
    assert got == pytest.approx([1, 0.6065, 0.3679, 1], abs=1e-4)


def test_history_size_in_double_precision():
    assert tm.PassthroughReducer(0.3, 2.1).recordsz == 8
    assert tm.PassthroughReducer(0.3, 2.1, inclusive=True).recordsz == 9
    assert tm.PassthroughReducer(1.0, 0.0).recordsz == 1
    assert tm.PassthroughReducer(1.0, 0.0, inclusive=True).recordsz == 1


# -- time and history settings -------------------------------------------------


def test_duration_setter_fix():
    ours, theirs = pair(("PassthroughReducer", (1.0,), {}, gaussian), duration=3.0)
    for v in (1.0, 2.0, 3.0):
        ours(torch.tensor([v]))
        theirs(torch.tensor([v]))
    ours.duration = 5.0
    theirs.duration = 5.0
    # inferno 0.0.5 overwrites the step time and keeps the old duration...
    assert theirs.dt == 5.0 and theirs.duration == 3.0
    # ...ours sets the duration and keeps the step time.
    assert ours.dt == 1.0 and ours.duration == 5.0
    # Both resize the history the same way (newest kept, padding at the old end).
    assert_close(ours.dump(), theirs.dump())
    assert ours.dump().flatten().tolist() == [3.0, 2.0, 1.0, 0.0, 0.0]
    ours.duration = 1.0
    assert ours.dump().flatten().tolist() == [3.0]
    ours.duration = 0.0  # allowed, as in the constructor (inferno's setter refuses 0)
    assert ours.recordsz == 1


def test_growing_pads_with_the_fill_value():
    r = tm.EventReducer(1.0, tm.Criterion("nonzero"), duration=2.0)
    r(torch.tensor([1.0]))
    r(torch.tensor([0.0]))
    r.duration = 4.0
    # inferno pads with zeros; the fill value (here the initial inf) is what
    # a never-written row holds everywhere else.
    assert r.dump().flatten().tolist() == [1.0, 0.0, math.inf, math.inf]


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[6], CASES[12]], ids=lambda c: c[0])
def test_step_time_setter_matches_inferno(case):
    ours, theirs = pair(case)
    feed_both(ours, theirs, case, steps=5, check_each=False)
    ours.dt = 0.15
    theirs.dt = 0.15
    # 2.1 / 0.15 is 14.000000000000002 in double: 15 states, as inferno.
    assert ours.dt == 0.15 and ours.recordsz == 15 == theirs.data.shape[0]
    if hasattr(theirs, "decay"):
        assert ours.decay == pytest.approx(theirs.decay)
    assert_close(ours.dump(), theirs.dump())
    feed_both(ours, theirs, case, steps=20, seed=5)
    assert_close(ours.view(0.6), theirs.view(0.6))
    assert_close(ours.view(0.65), theirs.view(0.65))


def test_settable_properties():
    r = tm.EMAReducer(1.0, 0.5)
    r.inplace = True
    assert r.inplace is True
    r.alpha = 0.25
    assert r.alpha == 0.25
    with pytest.raises(ValueError, match="alpha"):
        r.alpha = 2.0
    r.inclusive = True
    assert r.inclusive and r.recordsz == 1
    t = tm.NearestTraceReducer(1.0, 2.0, 1.0, 1.0, 0.1)
    assert t.tolerance == pytest.approx(0.1)
    t.tolerance = None
    assert t.tolerance is None
    t.time_constant = 4.0
    assert t.decay == pytest.approx(math.exp(-0.25))
    s = tm.ScaledNearestTraceReducer(1.0, 2.0, 0.0, 3.0, "nonzero")
    assert s.scale == 3.0 and s.amplitude == 0.0
    s.criterion = lambda x: x < 0
    s(torch.tensor([-1.0, 1.0]))
    assert s.peek().tolist() == [-3.0, 0.0]


# -- clear ----------------------------------------------------------------------


@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[8]], ids=lambda c: c[0])
def test_clear_keepshape_matches_inferno(case):
    ours, theirs = pair(case)
    feed_both(ours, theirs, case, steps=11, check_each=False)
    ours.clear(keepshape=True)
    theirs.clear(keepshape=True)
    assert ours.peek() is None and ours.dump() is None and ours.view(0.0) is None
    assert ours.data.shape == theirs.data.shape == (8, *SHAPE)
    assert_close(ours.data, theirs.data)
    feed_both(ours, theirs, case, steps=11, seed=3)
    with pytest.raises(ValueError, match=r"expected \[3, 4\].*got \[2\]"):
        ours(*case[3](torch.Generator().manual_seed(0), (2,)))


def test_clear_forgets_shape():
    r = tm.PassthroughReducer(1.0, 2.0)
    r(torch.ones(3))
    r.clear()
    assert r.peek() is None and r.data.numel() == 0
    r(torch.ones(2, 2))
    assert r.peek().shape == (2, 2)


# -- dtype, device, autograd ------------------------------------------------------


def test_to_dtype_before_and_after_the_first_step():
    r = tm.EMAReducer(1.0, 0.5, duration=2.0).double()
    r(torch.tensor([1, 2], dtype=torch.int32))
    assert r.peek().dtype == torch.float64 and r.dump().dtype == torch.float64
    r.to(torch.float16)
    assert r.data.dtype == torch.float16
    r(torch.tensor([3.0, 4.0]))
    assert r.peek().dtype == torch.float16
    assert r.peek().tolist() == [2.0, 3.0]
    r.float()
    assert r.view(0.5).dtype == torch.float32
    assert r.view(0.5).tolist() == [1.5, 2.5]


def test_default_dtype_is_followed():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        r = tm.CAReducer(1.0)
    finally:
        torch.set_default_dtype(old)
    r(torch.tensor([1.0]))
    assert r.peek().dtype == torch.float64


def test_autograd_through_the_history():
    x = torch.ones(2, requires_grad=True)
    r = tm.EMAReducer(1.0, 0.5, duration=2.0)
    r(x * 2)
    r(x * 4)
    r.peek().sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


def test_out_of_place_peek_survives_the_wrap():
    r = tm.PassthroughReducer(1.0, 1.0)  # 1 state: every step overwrites it
    r(torch.tensor([1.0]))
    kept = r.peek()
    r(torch.tensor([2.0]))
    assert kept.tolist() == [1.0]
    r.inplace = True
    alias = r.peek()
    r(torch.tensor([3.0]))
    assert alias.tolist() == [3.0]  # in place, as inferno with inplace=True


# -- saving ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_state_dict_round_trip(case):
    ours = build(tm, case)
    theirs = build(inferno_observe, case)
    feed_both(ours, theirs, case, steps=11, check_each=False)
    buffer = io.BytesIO()
    torch.save(ours.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer)
    # The history only: the receiver keeps its own settings, as in inferno
    # (test_monitor_state.py), so it is built with the same ones.
    fresh = build(tm, case)
    fresh.load_state_dict(state)
    assert_close(fresh.dump(), ours.dump())
    assert_close(fresh.view(0.45), ours.view(0.45))
    # Both go on identically (CAReducer's count travels with the state).
    feed_both(fresh, theirs, case, steps=5, seed=9)


def test_pickle_and_deepcopy():
    r = tm.ScaledCumulativeTraceReducer(0.5, 2.0, 1.0, 2.0, lambda x: x > 0, duration=2.0)
    r(torch.tensor([1.0, -1.0]))
    twin = copy.deepcopy(r)
    assert_close(twin.dump(), r.dump())
    twin(torch.tensor([1.0, 1.0]))
    assert not close(twin.dump(), r.dump())  # independent
    saved = tm.CAReducer(1.0, 2.0)
    saved(torch.tensor([4.0]))
    saved(torch.tensor([8.0]))
    back = pickle.loads(pickle.dumps(saved))
    back(torch.tensor([0.0]))
    assert back.peek().item() == 4.0  # (4 + 8 + 0) / 3


class Recorder(nn.Module):
    def __init__(self, reducer):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.reducer = reducer

    def forward(self, x):
        y = self.linear(x)
        self.reducer(y)
        return y


class TwoInputRecorder(nn.Module):
    def __init__(self, reducer):
        super().__init__()
        self.reducer = reducer

    def forward(self, x, cond):
        self.reducer(x, cond)
        latest = self.reducer.peek()
        assert latest is not None
        return latest


class RawHolder(nn.Module):
    """Holds the TorchScript object itself, as a monitor does."""

    def __init__(self, reducer):
        super().__init__()
        self.reducer = reducer.script_reducer

    def forward(self, x):
        self.reducer.forward([x])
        out = self.reducer.view(0.5, 1e-7)
        assert out is not None
        return out


def jit_round_trip(module):
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


def test_torchscript_save_load_module_holding_a_reducer():
    torch.manual_seed(0)
    model = Recorder(tm.EMAReducer(0.5, 0.3, duration=2.0))
    scripted = torch.jit.script(model)
    for _ in range(7):
        scripted(torch.randn(2, 4))
    # Scripted and eager share the C++ reducer.
    assert_close(scripted.reducer.peek(), model.reducer.peek())
    loaded = jit_round_trip(scripted)
    for t in (0.0, 0.5, 0.7, 1.4, 1):
        assert_close(loaded.reducer.view(t), scripted.reducer.view(t))
    assert_close(loaded.reducer.dump(), scripted.reducer.dump())
    x = torch.randn(2, 4)
    scripted(x)
    loaded(x)
    assert_close(loaded.reducer.dump(), scripted.reducer.dump())


def test_torchscript_conditional_and_builtin_criterion():
    model = TwoInputRecorder(tm.ConditionalCumulativeTraceReducer(1.0, 2.0, 0.5, 2.0, duration=3.0))
    scripted = torch.jit.script(model)
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        scripted(*with_condition(gen, (3,)))
    loaded = jit_round_trip(scripted)
    assert_close(loaded.reducer.dump(), scripted.reducer.dump())

    event = RawHolder(tm.EventReducer(0.5, tm.Criterion("ge", 0.5), "zero", duration=1.0))
    scripted_event = torch.jit.script(event)
    for v in ([1.0, 0.0], [0.0, 0.0], [0.0, 1.0]):
        scripted_event(torch.tensor(v))
    loaded_event = jit_round_trip(scripted_event)
    assert loaded_event.reducer.criterion() == "ge(0.5)"
    # ge(0.5) on [1, 0], [0, 0], [0, 1] with initial 0: [0, 0], [.5, .5], [1, 0].
    assert_close(loaded_event.reducer.dump(), torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
    # One more step; forward returns view(0.5), the state before it.
    assert_close(loaded_event(torch.tensor([1.0, 0.0])), torch.tensor([1.0, 0.0]))
    assert_close(loaded_event.reducer.peek(), torch.tensor([0.0, 0.5]))


def test_python_criterion_runs_scripted_but_cannot_be_saved():
    model = RawHolder(tm.EventReducer(0.5, lambda x: x > 0, duration=1.0))
    scripted = torch.jit.script(model)
    scripted(torch.tensor([1.0, -1.0]))
    scripted(torch.tensor([-1.0, -1.0]))
    assert scripted.reducer.peek().tolist() == [0.5, math.inf]
    with pytest.raises(Exception, match="cannot be saved"):
        jit_round_trip(scripted)
    # state_dict() still works: it carries the state, not the criterion.
    reducer = tm.EventReducer(0.5, lambda x: x > 0)
    reducer(torch.tensor([1.0]))
    other = tm.EventReducer(0.5, lambda x: x > 0)
    other.load_state_dict(reducer.state_dict())
    assert other.peek().tolist() == [0.0]


def test_torchscript_class_directly():
    r = torch.classes.torch_monitor.Reducer("EMAReducer", 1.0, 2.0, False, False, {"alpha": 0.5})
    r.forward([torch.tensor(2.0)])
    r.forward([torch.tensor(4.0)])
    assert r.peek().item() == 3.0
    assert r.kind() == "EMAReducer" and r.history_size() == 2 and r.params() == {"alpha": 0.5}
    with pytest.raises(Exception, match="alpha"):
        torch.classes.torch_monitor.Reducer("EMAReducer", 1.0, 0.0, False, False, {}, "", 0.0)
    with pytest.raises(Exception, match="unknown reducer kind"):
        torch.classes.torch_monitor.Reducer("MaxReducer", 1.0, 0.0, False, False, {}, "", 0.0)


# -- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("module", [tm, inferno_observe], ids=["ours", "inferno"])
def test_invalid_timing_raises_value_error(module):
    with pytest.raises(ValueError, match="step_time"):
        module.EMAReducer(0.0, 0.5)
    with pytest.raises(ValueError, match="step_time"):
        module.PassthroughReducer(-1.0)
    with pytest.raises(ValueError, match="duration"):
        module.CAReducer(1.0, -0.1)
    with pytest.raises(ValueError, match="time_constant"):
        module.NearestTraceReducer(1.0, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        module.EMAReducer(1.0, -0.5)
    with pytest.raises(ValueError, match="initial"):
        module.EventReducer(1.0, GT, "one")


def test_setters_validate():
    r = tm.EMAReducer(1.0, 0.5, duration=2.0)
    with pytest.raises(ValueError, match="step_time"):
        r.dt = 0.0
    with pytest.raises(ValueError, match="duration"):
        r.duration = -1.0
    assert r.dt == 1.0 and r.duration == 2.0


@pytest.mark.parametrize("module", [tm, inferno_observe], ids=["ours", "inferno"])
def test_view_outside_the_range(module):
    r = module.PassthroughReducer(0.5, 1.0)  # times in [0, 0.5]
    r(torch.zeros(2))
    for bad in (0.6, -0.01):
        with pytest.raises(ValueError):
            r.view(bad)
    with pytest.raises(ValueError):
        r.view(torch.tensor([0.1, 0.9]))
    with pytest.raises(ValueError):
        r.view(torch.zeros(2, 2, 2))


def test_wrong_shape_and_arity():
    r = tm.EMAReducer(1.0, 0.5)
    r(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"expected \[2, 3\].*got \[3, 2\]"):
        r(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="two tensors"):
        tm.ConditionalNearestTraceReducer(1.0, 1.0, 1.0, 1.0)(torch.zeros(2))
    with pytest.raises(ValueError, match="got 2"):
        r(torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(TypeError, match="bool"):
        tm.EventReducer(1.0, lambda x: x)(torch.zeros(2))
    with pytest.raises(TypeError):
        tm.EventReducer(1.0, 42)



def test_reducer_object_forward_takes_a_list_of_tensors_by_position_or_keyword():
    # The reducer object's forward is a hand-written fast call (py_reducers.cpp):
    # it must take what its schema says, (inputs: List[Tensor]), and refuse the rest.
    r = tm.EMAReducer(1.0, 0.5)
    forward = r.script_reducer.forward
    forward([torch.ones(3)])
    forward(inputs=(torch.full((3,), 3.0),))
    torch.testing.assert_close(r.peek(), torch.full((3,), 2.0))
    with pytest.raises(TypeError, match="'inputs' must be a list of torch.Tensor, got str"):
        forward("x")
    with pytest.raises(TypeError, match="'inputs' item must be a torch.Tensor, got int"):
        forward([torch.ones(3), 1])
    with pytest.raises(TypeError, match=r"forward\(inputs\) takes those 1 argument"):
        forward(values=[torch.ones(3)])
    with pytest.raises(TypeError, match=r"forward\(inputs\) takes those 1 argument"):
        forward()
    torch.testing.assert_close(r.peek(), torch.full((3,), 2.0))  # nothing refused was folded

# -- CUDA -----------------------------------------------------------------------------


@pytest.mark.cuda
def test_wrong_device():
    r = tm.EMAReducer(1.0, 0.5)
    with pytest.raises(ValueError, match="cuda"):
        r(torch.zeros(2, device="cuda"))
    r.cuda()
    with pytest.raises(ValueError, match="cpu"):
        r(torch.zeros(2))


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_cuda_matches_cpu_without_host_sync(case):
    cpu = build(tm, case, inclusive=True)
    gpu = build(tm, case, inclusive=True).cuda()
    gen = torch.Generator().manual_seed(4)
    batches = [case[3](gen, SHAPE) for _ in range(STEPS)]
    for inputs in batches:
        cpu(*inputs)
    gpu_batches = [tuple(x.cuda() for x in inputs) for inputs in batches]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for inputs in gpu_batches:
            gpu(*inputs)
            gpu.peek()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert gpu.peek().is_cuda
    assert close(gpu.dump(), cpu.dump(), rtol=1e-5, atol=1e-5)
    assert close(gpu.view(0.45), cpu.view(0.45), rtol=1e-5, atol=1e-5)
    times = torch.rand((*SHAPE, 3), generator=gen) * DT * 8
    assert close(gpu.view(times.cuda()), cpu.view(times), rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_cuda_state_dict_and_script_round_trip():
    r = tm.EMAReducer(1.0, 0.5, duration=2.0).cuda()
    r(torch.ones(3, device="cuda"))
    twin = tm.EMAReducer(1.0, 0.5, duration=2.0).cuda()  # a history of the same length
    twin.load_state_dict(r.state_dict())
    assert twin.data.is_cuda and close(twin.dump(), r.dump())
    loaded = jit_round_trip(torch.jit.script(RawHolder(r)))
    assert loaded.reducer.storage().is_cuda
    assert close(loaded.reducer.dump(), r.dump())
    cpu = r.cpu()
    assert cpu.data.device.type == "cpu" and cpu.peek().tolist() == [1.0, 1.0, 1.0]


def test_history_written_in_place_once_nothing_holds_it():
    # Reading the history from Python must not pin it: with no view alive the
    # C++ side writes each step into the same storage instead of copying it.
    r = tm.EMAReducer(1.0, 0.5, duration=8.0)
    r(torch.ones(4))
    first = r.data.data_ptr()
    r.state_dict()
    r.double().float()
    r(torch.ones(4))
    r(torch.ones(4))
    before = r.data.data_ptr()
    for _ in range(10):
        r(torch.ones(4))
    assert r.data.data_ptr() == before
    held = r.peek()  # a live view: the next step must not overwrite it
    r(torch.zeros(4))
    assert r.data.data_ptr() != before and held.tolist() == [1.0] * 4
    assert first != 0
