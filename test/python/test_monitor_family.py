"""InputMonitor, OutputMonitor, StateMonitor and MultiStateMonitor against
inferno's (inferno-ai 0.0.5): same module, same inputs, same reducers, the
recorded history must be equal. Then the same monitors in scripted modules
(torch.jit.script, save, load) and what inferno has no counterpart for.
"""

import copy
import gc
import pathlib
import pickle
import sys
import weakref
from typing import Tuple

import pytest
import torch
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from isolated import run_isolated  # noqa: E402

tm = pytest.importorskip("torch_monitor")


@pytest.fixture
def inferno():
    """The reference, inferno-ai 0.0.5 (tests comparing with it skip without)."""
    return pytest.importorskip("inferno.observe")


# ---------------------------------------------------------------- modules


class Neuron(nn.Module):
    """A leaky neuron: membrane `v` replaced out of place, `spike` where it
    crosses 1 (then `v` resets). Returns (v, spike)."""

    def __init__(self, n: int = 4):
        super().__init__()
        self.register_buffer("v", torch.zeros(n))
        self.register_buffer("spike", torch.zeros(n, dtype=torch.bool))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.v * 0.6 + x
        self.spike = v > 1.0
        self.v = torch.where(self.spike, torch.zeros_like(v), v)
        return v


class Layer(nn.Module):
    """A neuron nested one level down (attribute paths with dots)."""

    def __init__(self):
        super().__init__()
        self.neuron = Neuron()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.neuron(x)


class Pair(nn.Module):
    """Two inputs (a value and a mask), a tuple out."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return a * 2, b


def inputs(steps=7, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(n, generator=g) * 0.9 for _ in range(steps)]


REDUCERS = {
    "passthrough": lambda lib: lib.PassthroughReducer(1.0, duration=4.0),
    "ema": lambda lib: lib.EMAReducer(1.0, 0.3, duration=3.0),
    "ca": lambda lib: lib.CAReducer(0.5, duration=2.0),
}


def run_both(inferno, make, monitor_ours, monitor_theirs, feed, reducer="passthrough"):
    """Builds a module and a monitor for each library, runs `feed(module)` on
    both and returns (ours, theirs) monitors."""
    m_ours, m_theirs = make(), make()
    m_theirs.load_state_dict(m_ours.state_dict())
    ours = monitor_ours(REDUCERS[reducer](tm), m_ours)
    theirs = monitor_theirs(REDUCERS[reducer](inferno), m_theirs)
    feed(m_ours)
    feed(m_theirs)
    return ours, theirs


def assert_same_history(ours, theirs):
    torch.testing.assert_close(ours.peek(), theirs.peek(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.dump(), theirs.dump(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.view(0.5), theirs.view(0.5), rtol=0, atol=1e-6)


def feed_steps(m):
    for x in inputs():
        m(x)


# ------------------------------------------------------ same as inferno's


@pytest.mark.parametrize("reducer", sorted(REDUCERS))
def test_input_monitor_matches_inferno(inferno, reducer):
    ours, theirs = run_both(
        inferno, Neuron,
        lambda r, m: tm.InputMonitor(r, m),
        lambda r, m: inferno.InputMonitor(r, m),
        feed_steps, reducer,
    )
    assert_same_history(ours, theirs)
    if reducer == "passthrough":
        torch.testing.assert_close(ours.peek(), inputs()[-1])


@pytest.mark.parametrize("reducer", sorted(REDUCERS))
def test_output_monitor_matches_inferno(inferno, reducer):
    ours, theirs = run_both(
        inferno, Neuron,
        lambda r, m: tm.OutputMonitor(r, m),
        lambda r, m: inferno.OutputMonitor(r, m),
        feed_steps, reducer,
    )
    assert_same_history(ours, theirs)


@pytest.mark.parametrize("as_prehook", [False, True])
@pytest.mark.parametrize("reducer", sorted(REDUCERS))
def test_state_monitor_matches_inferno(inferno, reducer, as_prehook):
    ours, theirs = run_both(
        inferno, Layer,
        lambda r, m: tm.StateMonitor(r, "neuron.v", m, as_prehook=as_prehook),
        lambda r, m: inferno.StateMonitor(r, "neuron.v", m, as_prehook=as_prehook),
        feed_steps, reducer,
    )
    assert_same_history(ours, theirs)


@pytest.mark.parametrize("as_prehook", [False, True])
def test_multi_state_monitor_matches_inferno(inferno, as_prehook):
    # Two inputs per step: the conditional trace takes (observation, condition).
    def make(lib):
        return lib.ConditionalNearestTraceReducer(1.0, 2.0, 1.0, 0.5, duration=3.0)

    m_ours, m_theirs = Layer(), Layer()
    ours = tm.MultiStateMonitor(make(tm), "neuron", ("v", "spike"), m_ours, as_prehook=as_prehook)
    theirs = inferno.MultiStateMonitor(make(inferno), "neuron", ("v", "spike"), m_theirs, as_prehook=as_prehook)
    for x in inputs(10):
        m_ours(x * 2)
        m_theirs(x * 2)
    assert_same_history(ours, theirs)
    assert ours.attrs == ("neuron.v", "neuron.spike")


def test_tuple_output_feeds_several_inputs_like_inferno(inferno):
    def make(lib):
        return lib.ConditionalCumulativeTraceReducer(1.0, 2.0, 1.0, 0.5, duration=2.0)

    m_ours, m_theirs = Pair(), Pair()
    ours = tm.OutputMonitor(make(tm), m_ours)
    theirs = inferno.OutputMonitor(make(inferno), m_theirs)
    for x in inputs():
        m_ours(x, x > 0.4)
        m_theirs(x, x > 0.4)
    assert_same_history(ours, theirs)


def test_custom_filter_and_map_match_inferno(inferno):
    def odd(args):
        return len(args) % 2 == 1

    def doubled(args):
        return tuple(2 * a for a in args)

    m_ours, m_theirs = Pair(), Pair()
    ours = tm.InputMonitor(tm.PassthroughReducer(1.0, duration=3.0), m_ours, filter_=lambda a: odd(a[1:]), map_=lambda a: doubled(a[:1]))
    theirs = inferno.InputMonitor(inferno.PassthroughReducer(1.0, duration=3.0), m_theirs, filter_=lambda a: odd(a[1:]), map_=lambda a: doubled(a[:1]))
    for x in inputs():
        m_ours(x, x)
        m_theirs(x, x)
    assert_same_history(ours, theirs)
    torch.testing.assert_close(ours.peek(), 2 * inputs()[-1])
    assert ours.filter_ is not None and ours.map_ is not None


def test_train_eval_gating_matches_inferno(inferno):
    m_ours, m_theirs = Neuron(), Neuron()
    ours = tm.StateMonitor(tm.PassthroughReducer(1.0, duration=4.0), "v", m_ours, train_update=False)
    theirs = inferno.StateMonitor(inferno.PassthroughReducer(1.0, duration=4.0), "v", m_theirs, train_update=False)
    for step, x in enumerate(inputs(8)):
        m_ours.train(step % 3 == 0)
        m_theirs.train(step % 3 == 0)
        m_ours(x)
        m_theirs(x)
        if step == 4:
            ours.evalexec, ours.trainexec = False, True
            theirs.evalexec, theirs.trainexec = False, True
    assert_same_history(ours, theirs)


def test_prepend_orders_the_hook_like_inferno(inferno):
    order = {"ours": [], "theirs": []}

    def make_hooked(which):
        m = Neuron()
        m.register_forward_hook(lambda *_: order[which].append("other"))
        return m

    m_ours, m_theirs = make_hooked("ours"), make_hooked("theirs")
    ours = tm.OutputMonitor(tm.PassthroughReducer(1.0), m_ours, prepend=True,
                            filter_=lambda v: order["ours"].append("monitor") or True)
    theirs = inferno.OutputMonitor(inferno.PassthroughReducer(1.0), m_theirs, prepend=True,
                                   filter_=lambda v: order["theirs"].append("monitor") or True)
    m_ours(torch.ones(4))
    m_theirs(torch.ones(4))
    assert order["ours"] == order["theirs"] == ["monitor", "other"]


def test_partialconstructors_take_the_constructors_arguments_but_attr_and_module(inferno):
    # Derived from each class's __init__: the same names, order and defaults
    # as inferno's hand-written ones, and wrong arguments fail at once.
    import inspect

    for name in ("DifferenceMonitor", "InputMonitor", "OutputMonitor", "StateMonitor", "MultiStateMonitor"):
        ours = inspect.signature(getattr(tm, name).partialconstructor).parameters
        theirs = inspect.signature(getattr(inferno, name).partialconstructor).parameters
        expected = [p for p in theirs if p != "cls"]
        assert [p for p in ours if p != "keep_graph"] == expected, name
        assert all(ours[p].default == theirs[p].default for p in theirs if p in ours), name
    with pytest.raises(TypeError, match="unexpected keyword argument 'module'"):
        tm.StateMonitor.partialconstructor(tm.PassthroughReducer(1.0), module=Layer())
    with pytest.raises(TypeError, match="missing a required argument: 'subattrs'"):
        tm.MultiStateMonitor.partialconstructor(tm.PassthroughReducer(1.0))


def test_partialconstructors_match_inferno(inferno):
    # Input/Output monitors register on the submodule at `attr`; State and
    # MultiState monitors on the module itself, reading `attr` through it.
    cases = [
        ("InputMonitor", "neuron", (), {}),
        ("OutputMonitor", "neuron", (), {}),
        ("StateMonitor", "neuron.v", (), {"as_prehook": True}),
        ("MultiStateMonitor", "neuron", (("v", "spike"),), {}),
    ]
    for name, attr, args, kwargs in cases:
        m_ours, m_theirs = Layer(), Layer()
        reducer = (lambda lib: lib.PassthroughReducer(1.0, duration=2.0)) if name != "MultiStateMonitor" else (
            lambda lib: lib.ConditionalNearestTraceReducer(1.0, 2.0, 1.0, 0.5, duration=2.0))
        ours = getattr(tm, name).partialconstructor(reducer(tm), *args, **kwargs)(attr, m_ours)
        theirs = getattr(inferno, name).partialconstructor(reducer(inferno), *args, **kwargs)(attr, m_theirs)
        assert ours.registered and theirs.registered
        for x in inputs(5):
            m_ours(x * 2)
            m_theirs(x * 2)
        assert_same_history(ours, theirs)
        expected = m_ours.neuron if name in ("InputMonitor", "OutputMonitor") else m_ours
        assert ours.module is expected, name


# ---------------------------------------------- registration and lifetime


def test_register_when_registered_says_what_inferno_says(inferno):
    """inferno's own tests match the words of this error; ours adds what to do."""
    said = []
    for lib in (inferno, tm):
        mon = lib.OutputMonitor(lib.PassthroughReducer(1.0), nn.Identity())
        with pytest.raises(RuntimeError) as raised:
            mon.register(nn.Identity())
        said.append(str(raised.value))
    assert said[1].startswith(said[0])


@pytest.mark.parametrize(
    "make, hooks",
    [
        (lambda r, m: tm.InputMonitor(r, m), "_forward_pre_hooks"),
        (lambda r, m: tm.OutputMonitor(r, m), "_forward_hooks"),
        (lambda r, m: tm.StateMonitor(r, "v", m, as_prehook=True), "_forward_pre_hooks"),
        (lambda r, m: tm.StateMonitor(r, "v", m), "_forward_hooks"),
        (lambda r, m: tm.MultiStateMonitor(r, "", ("v", "spike"), m, as_prehook=True), "_forward_pre_hooks"),
        (lambda r, m: tm.MultiStateMonitor(r, "", ("v",), m), "_forward_hooks"),
    ],
)
def test_one_hook_registered_and_removed_with_the_monitor(make, hooks):
    m = Neuron()
    mon = make(tm.PassthroughReducer(1.0), m)
    assert len(m._forward_pre_hooks) + len(m._forward_hooks) == 1
    assert len(getattr(m, hooks)) == 1
    mon.deregister()
    assert not mon.registered and len(getattr(m, hooks)) == 0
    mon.register()  # back on the last module
    assert mon.registered and len(getattr(m, hooks)) == 1
    with pytest.raises(RuntimeError, match="already registered"):
        mon.register(Neuron())
    ref = weakref.ref(mon)
    del mon
    gc.collect()
    assert ref() is None
    assert len(getattr(m, hooks)) == 0
    assert not [k for k in vars(m) if k.startswith("_torch_monitor_")]


def test_clear_and_default_filter_skip_empty_inputs():
    class NoArgs(nn.Module):
        def forward(self) -> torch.Tensor:
            return torch.ones(2)

    m = NoArgs()
    mon = tm.InputMonitor(tm.PassthroughReducer(1.0), m)
    m()  # no inputs: skipped, as inferno's bool(args) filter does
    assert mon.peek() is None
    out = tm.OutputMonitor(tm.PassthroughReducer(1.0, duration=1.0), m)
    m()
    assert out.peek().tolist() == [1.0, 1.0]
    out.clear()
    assert out.peek() is None


def test_values_the_default_map_cannot_feed_say_so():
    class Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.label = "x"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    m = Named()
    mon = tm.StateMonitor(tm.PassthroughReducer(1.0), "label", m)
    with pytest.raises(TypeError, match="map_"):
        m(torch.ones(2))
    mon.deregister()
    with pytest.raises(TypeError, match="subattrs"):
        tm.MultiStateMonitor(tm.PassthroughReducer(1.0), "", "v")
    with pytest.raises(ValueError, match="subattrs is empty"):
        tm.MultiStateMonitor(tm.PassthroughReducer(1.0), "", ())
    with pytest.raises(TypeError, match="filter_ must be a callable"):
        tm.OutputMonitor(tm.PassthroughReducer(1.0), filter_=3)
    with pytest.raises(TypeError, match="as_prehook"):
        tm.StateMonitor(tm.PassthroughReducer(1.0), "v", as_prehook="yes")


def test_history_is_detached_unless_keep_graph():
    lin = nn.Linear(3, 3)
    mon = tm.OutputMonitor(tm.PassthroughReducer(1.0), lin)
    lin(torch.ones(3))
    assert not mon.peek().requires_grad


def test_pickle_and_deepcopy_keep_the_settings():
    m = Layer()
    mon = tm.MultiStateMonitor(tm.ConditionalNearestTraceReducer(1.0, 2.0, 1.0, 0.5), "neuron", ("v", "spike"), m, as_prehook=True, train_update=False)
    clone = pickle.loads(pickle.dumps(mon))
    assert (clone.attrs, clone.as_prehook, clone.trainexec, clone.registered) == (mon.attrs, True, False, False)
    pair = copy.deepcopy((m, mon))
    assert pair[1].registered and pair[1].module is pair[0]
    pair[0].eval()
    pair[0](torch.ones(4) * 2)
    assert pair[1].peek() is not None and mon.peek() is None


# ------------------------------------------------------------ TorchScript


def attach_all(m):
    return {
        "input": tm.InputMonitor(tm.PassthroughReducer(1.0, duration=3.0), m.neuron),
        "output": tm.OutputMonitor(tm.EMAReducer(1.0, 0.5, duration=3.0), m.neuron),
        "state_pre": tm.StateMonitor(tm.PassthroughReducer(1.0, duration=3.0), "v", m.neuron, as_prehook=True),
        "state": tm.StateMonitor(tm.CAReducer(1.0, duration=3.0), "v", m.neuron),
        "multi": tm.MultiStateMonitor(
            tm.ConditionalNearestTraceReducer(1.0, 2.0, 1.0, 0.5, duration=3.0), "", ("v", "spike"), m.neuron
        ),
        "difference": tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=3.0), "v", m.neuron),
    }


def test_scripted_module_runs_the_hooks_like_eager(tmp_path):
    eager, to_script = Layer(), Layer()
    mons_eager, mons_script = attach_all(eager), attach_all(to_script)
    scripted = torch.jit.script(to_script)
    for x in inputs(6):
        eager(x * 2)
        scripted(x * 2)
    for name in mons_eager:
        torch.testing.assert_close(mons_script[name].dump(), mons_eager[name].dump(), msg=name)

    # Saved and loaded: the history travels and recording goes on.
    torch.jit.save(scripted, str(tmp_path / "family.pt"))
    loaded = torch.jit.load(str(tmp_path / "family.pt"))
    for x in inputs(3, seed=1):
        eager(x * 2)
        loaded(x * 2)
    for name, mon in mons_eager.items():
        state = getattr(loaded.neuron, mons_script[name].key)
        torch.testing.assert_close(state.dump(), mon.dump(), msg=name)


def test_scripted_tuple_inputs_and_outputs():
    m = Pair()
    ins = tm.InputMonitor(tm.ConditionalNearestTraceReducer(1.0, 2.0, 1.0, 0.5), m)
    outs = tm.OutputMonitor(tm.ConditionalNearestTraceReducer(1.0, 2.0, 1.0, 0.5), m)
    scripted = torch.jit.script(m)
    scripted(torch.tensor([1.0, 2.0]), torch.tensor([True, False]))
    assert ins.peek().tolist() == [1.5, 0.0]  # 0.5 * a + 1 where the mask is set
    assert outs.peek().tolist() == [2.0, 0.0]  # 0.5 * (2 * a) + 1


def test_python_callables_refuse_to_save(tmp_path):
    m = Neuron()
    mon = tm.OutputMonitor(tm.PassthroughReducer(1.0), m, map_=lambda y: (y * 2,))
    scripted = torch.jit.script(m)
    scripted(torch.ones(4))
    assert mon.peek().tolist() == [2.0] * 4  # map_ ran in the scripted hook
    with pytest.raises(RuntimeError, match="cannot save"):
        torch.jit.save(scripted, str(tmp_path / "x.pt"))


# -------------------------------------------- monitors written in Python


class Counting(tm.Monitor):
    """A Python monitor (inferno's Monitor base): counts calls, feeds inputs."""

    def __init__(self, reducer, module=None, **kwargs):
        self.calls = []
        tm.Monitor.__init__(self, reducer, module, prehook="_pre", posthook="_post",
                            posthook_kwargs={"prepend": True}, **kwargs)

    def _pre(self, module, args):
        self.calls.append("pre")
        self.reducer(*args)

    def _post(self, module, args, output):
        self.calls.append("post")


def test_python_monitor_base_runs_named_methods_as_gated_hooks():
    m = Neuron()
    m.register_forward_hook(lambda *_: mon.calls.append("other"))
    mon = Counting(tm.PassthroughReducer(1.0, duration=2.0), m, eval_update=False)
    m(torch.ones(4))
    assert mon.calls == ["pre", "post", "other"]  # posthook_kwargs: prepend
    assert mon.peek().tolist() == [1.0] * 4
    m.eval()
    m(torch.ones(4))
    assert mon.calls == ["pre", "post", "other", "other"]  # gated off
    with pytest.raises(NotImplementedError, match="partialconstructor"):
        Counting.partialconstructor()
    with pytest.raises(TypeError, match="no method 'missing'"):
        tm.Monitor(tm.PassthroughReducer(1.0), prehook="missing")
    ref = weakref.ref(mon)
    del mon
    gc.collect()
    assert ref() is None and len(m._forward_pre_hooks) == 0


# ---------------- with Python reducers, default callables, monitors_of kinds

# Each monitor on a module, built the same way for both libraries.
FAMILY = {
    "input": (Neuron, lambda lib, r, m, **kw: lib.InputMonitor(r, m, **kw)),
    "output": (Neuron, lambda lib, r, m, **kw: lib.OutputMonitor(r, m, **kw)),
    "state": (Layer, lambda lib, r, m, **kw: lib.StateMonitor(r, "neuron.v", m, **kw)),
    "multistate": (
        Layer,
        lambda lib, r, m, **kw: lib.MultiStateMonitor(r, "neuron", ("v",), m, **kw),
    ),
}


def latest_inputs_reducer(base):
    """inferno's MockReducer pattern (its test/observe/test_monitors.py):
    forward overridden to keep what it is called with, folding nothing."""

    class LatestInputs(base):
        def __init__(self):
            super().__init__(1.0, 0.0)
            self.latest_inputs = None

        def forward(self, *inputs, **kwargs):
            self.latest_inputs = inputs[0] if len(inputs) == 1 else inputs

    return LatestInputs


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_reducer_overriding_forward_is_called_by_every_monitor(inferno, name):
    module_type, make = FAMILY[name]
    m_ours, m_theirs = module_type(), module_type()
    ours = make(tm, latest_inputs_reducer(tm.PassthroughReducer)(), m_ours)
    theirs = make(inferno, latest_inputs_reducer(inferno.PassthroughReducer)(), m_theirs)
    for x in inputs():
        m_ours(x)
        m_theirs(x)
        torch.testing.assert_close(ours.reducer.latest_inputs, theirs.reducer.latest_inputs)
    assert ours.peek() is None  # the override folded nothing


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_python_fold_feeds_every_monitor_like_inferno(inferno, name):
    from test_custom_reducers import max_reducer

    module_type, make = FAMILY[name]
    m_ours, m_theirs = module_type(), module_type()
    ours = make(tm, max_reducer(tm.FoldReducer)(1.0, 4.0), m_ours)
    theirs = make(inferno, max_reducer(inferno.FoldReducer)(1.0, 4.0), m_theirs)
    feed_steps(m_ours)
    feed_steps(m_theirs)
    assert_same_history(ours, theirs)


def same_values(a, b):
    """Whether a default gave the very objects the other library's did."""
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(same_values, a, b))
    return a is b


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_default_filter_and_map_read_back_like_inferno(inferno, name, tmp_path):
    module_type, make = FAMILY[name]
    ours = make(tm, tm.PassthroughReducer(1.0), module_type())
    theirs = make(inferno, inferno.PassthroughReducer(1.0), module_type())
    t = torch.ones(2)
    for value in (None, (), (t,), (t, t)):
        assert ours.filter_(value) == theirs.filter_(value), value
    for value in ((t,), (t, t), t):
        assert same_values(ours.map_(value), theirs.map_(value)), value
    # Given back, the defaults are the defaults: the C++ path, saveable.
    module = module_type()
    rebuilt = make(tm, tm.PassthroughReducer(1.0), module, filter_=ours.filter_, map_=ours.map_)
    assert not rebuilt.core.has_custom_callables()
    assert (rebuilt.filter_, rebuilt.map_) == (ours.filter_, ours.map_)
    scripted = torch.jit.script(module)
    scripted(torch.ones(4))
    torch.jit.save(scripted, str(tmp_path / "m.pt"))
    assert pickle.loads(pickle.dumps(rebuilt)).map_ is ours.map_


def test_monitors_of_says_which_monitor(tmp_path):
    layer = Layer()
    made = {
        "DifferenceMonitor": tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "neuron.v", layer),
        "InputMonitor": tm.InputMonitor(tm.PassthroughReducer(1.0), layer),
        "OutputMonitor": tm.OutputMonitor(tm.PassthroughReducer(1.0), layer),
        "StateMonitor": tm.StateMonitor(tm.PassthroughReducer(1.0), "neuron.v", layer),
        "MultiStateMonitor": tm.MultiStateMonitor(tm.PassthroughReducer(1.0), "neuron", ("v",), layer),
    }
    layer(torch.ones(4))
    expected = {monitor.key: kind for kind, monitor in made.items()}
    scripted = torch.jit.script(layer)
    torch.jit.save(scripted, str(tmp_path / "m.pt"))
    loaded = torch.jit.load(str(tmp_path / "m.pt"))
    for model in (layer, scripted, loaded):
        assert {path: m.kind() for path, m in tm.monitors_of(model).items()} == expected
    # A monitor written in Python (eager only: its hooks are Python code).
    counting = Counting(tm.PassthroughReducer(1.0), layer.neuron)
    assert tm.monitors_of(layer)[f"neuron.{counting.key}"].kind() == "Monitor"


def test_monitors_of_gives_the_same_object_in_eager_and_scripted_models():
    """monitors_of's values answer every call of the TorchScript class alike,
    whether the model is eager (the Python face of the monitor's object) or
    scripted (the TorchScript object itself): same names, same kinds of
    result. The eager face once shadowed train_update(), eval_update(),
    keep_graph() and reducer() with Python properties."""
    layer = Layer()
    monitor = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "neuron.v", layer, eval_update=False)
    layer(torch.ones(4))
    scripted = torch.jit.script(layer)
    (eager,) = tm.monitors_of(layer).values()
    (script,) = tm.monitors_of(scripted).values()
    # One object: the eager face wraps what the scripted model holds.
    assert eager == script and hash(eager) == hash(script)

    def answers(monitor):
        return {
            "kind": monitor.kind(),
            "name": monitor.name(),
            "train_update": monitor.train_update(),
            "eval_update": monitor.eval_update(),
            "keep_graph": monitor.keep_graph(),
            "has_custom_callables": monitor.has_custom_callables(),
            "reducer": isinstance(monitor.reducer(), torch.ScriptObject),
            "peek": monitor.peek(),
            "dump": monitor.dump(),
            "view": monitor.view(time=0.0, tolerance=1e-7),
        }

    ours, theirs = answers(eager), answers(script)
    for key in ("peek", "dump", "view"):
        torch.testing.assert_close(ours.pop(key), theirs.pop(key))
    assert ours == theirs == {
        "kind": "DifferenceMonitor",
        "name": "neuron.v",
        "train_update": True,
        "eval_update": False,
        "keep_graph": False,
        "has_custom_callables": False,
        "reducer": True,  # its torch.classes.torch_monitor.Reducer
    }
    # The setters are the schema's too (called by keyword in both worlds),
    # and the Python monitor reads what they set.
    for found in (eager, script):
        found.set_keep_graph(value=True)
        assert found.keep_graph() is True
    assert monitor.keep_graph is True


# ------------------------------------------------------------ pickled modules

MONITORED_MODULE = '''
import torch
from typing import Tuple


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.register_buffer("seen", torch.zeros(3))
        self.register_buffer("other", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(x.sum(0))
        self.other.add_(1.0)
        return self.fc(x)
'''

PICKLE_MONITORED = '''
import pickle, sys, torch
sys.path.insert(0, {folder!r})
import torch_monitor as tm
from block import Block

model = Block()
monitors = [
    tm.DifferenceMonitor(tm.EMAReducer(1.0, 0.5, duration=2.0), "seen", model),
    tm.InputMonitor(tm.PassthroughReducer(1.0, duration=1.0), model),
    tm.OutputMonitor(tm.PassthroughReducer(1.0), model.fc),
    tm.StateMonitor(tm.PassthroughReducer(1.0), "other", model),
    tm.MultiStateMonitor(tm.PassthroughReducer(1.0), "", ("seen",), model),
]
model(torch.ones(2, 3))
with open({path!r}, "wb") as f:
    pickle.dump(model, f)
print(sorted(m.kind() for m in tm.monitors_of(model).values()))
'''

LOAD_MONITORED = '''
import pickle, sys, torch
sys.path.insert(0, {folder!r})
import torch_monitor as tm
with open({path!r}, "rb") as f:
    model = pickle.load(f)  # a process that never made these monitors
found = tm.monitors_of(model)
before = {{path: m.peek().clone() for path, m in found.items()}}
model(torch.full((2, 3), 2.0))
after = {{path: m.peek() for path, m in found.items()}}
difference = next(m for m in found.values() if m.kind() == "DifferenceMonitor")
# The buffer grew by 4 per element: the EMA of the changes 2 (saved) and 4.
torch.testing.assert_close(difference.peek(), torch.full((3,), 3.0))
assert all(not torch.equal(before[p], after[p]) for p in found if found[p].kind() != "StateMonitor")
scripted = torch.jit.script(model)  # the hooks made anew are typed too
scripted(torch.ones(2, 3))
print(sorted(m.kind() for m in found.values()))
'''


def test_a_module_holding_monitors_pickles_and_records_in_a_new_process(tmp_path):
    """pickle.dumps(module) failed (the generated hooks had no importable
    name, issue 25); each hook is now named after what it is made from, and
    a process that never made it makes it again on unpickling."""
    (tmp_path / "block.py").write_text(MONITORED_MODULE)
    path = str(tmp_path / "model.pkl")
    kinds = ["DifferenceMonitor", "InputMonitor", "MultiStateMonitor", "OutputMonitor", "StateMonitor"]
    saved = run_isolated(PICKLE_MONITORED.format(folder=str(tmp_path), path=path), timeout=120)
    assert saved.stdout.strip() == str(kinds)
    loaded = run_isolated(LOAD_MONITORED.format(folder=str(tmp_path), path=path), timeout=120)
    assert loaded.stdout.strip() == str(kinds)
