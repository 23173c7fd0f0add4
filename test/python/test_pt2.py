"""torch_monitor under PyTorch 2: torch.compile and (non-strict) torch.export.

Each test runs the same module twice, once eagerly and once compiled or
exported, and compares what the torch_monitor objects recorded (Stat
windows, monitor histories). Graph breaks are counted with
``torch._dynamo.explain`` and with ``fullgraph=True``; recompilation is made
an error with ``torch._dynamo.config.error_on_recompile``. Strict export,
saving and AOTInductor have their own files (test_pt2_*.py).
"""

from datetime import timedelta

import pytest
import torch
from torch import nn

tm = pytest.importorskip("torch_monitor")
import torch_monitor.testing  # noqa: E402,F401  (tm.testing)
from windows import closed_windows  # noqa: E402

BACKENDS = ["eager", "aot_eager", "inductor"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ---------------------------------------------------------------- modules


class Adds(nn.Module):
    """Adds a constant and a tensor-derived value to a Stat every call."""

    def __init__(self, name="pt2.loss"):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.stat = tm.Stat(name, [tm.SUM, tm.COUNT, tm.MAX], timedelta(hours=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.stat.add(1.0)
        self.stat.add(y.detach().abs().sum())
        return y


class Counts(nn.Module):
    """Adds integer tensors to an IntStat."""

    def __init__(self, name="pt2.hits"):
        super().__init__()
        self.stat = tm.IntStat(name, [tm.SUM, tm.COUNT], timedelta(hours=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stat.add(3)
        self.stat.add((x > 0).long())  # every element one sample
        return x * 2


class InPlace(nn.Module):
    """Updates a buffer in place inside forward (what a monitor measures)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(x.sum(0))
        return x + self.state


def monitored():
    module = InPlace()
    reducer = tm.PassthroughReducer(1.0, 30.0)  # dump(): 30 rows, newest first
    monitor = tm.DifferenceMonitor(reducer, "state", module)
    return module, monitor


def assert_same_windows(stat, reference):
    """Closes the open windows now and compares the two stats' aggregates."""
    got, want = closed_windows(stat, reference)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6), key


def inputs(steps, features=4):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, features, generator=gen) for _ in range(steps)]


# ---------------------------------------------------------------- compile


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_stat_adds_match_eager_without_graph_breaks(backend):
    torch.manual_seed(0)
    eager = Adds("pt2.eager")
    compiled_module = Adds("pt2.compiled")
    compiled_module.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_module, fullgraph=True, backend=backend)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for x in inputs(20):  # values change, configuration does not
            eager(x)
            compiled(x)
    assert compiled_module.stat.count == eager.stat.count == 40
    assert_same_windows(compiled_module.stat, eager.stat)


class AddsOutOfReadyOrder(nn.Module):
    """Side effects whose inputs come ready in the other order: the first
    waits for a matmul, the second only for a sum of the input. A monitor's
    hooks (an InputMonitor on ``lin``) take part in the same chain."""

    def __init__(self, name):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.stat = tm.Stat(name, [tm.VALUE, tm.COUNT], window_steps=1)
        self.inputs = tm.InputMonitor(tm.PassthroughReducer(1.0), self.lin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x @ x)
        self.stat.add(h[0, 0])
        tm.log_event("first", {"v": h[0, 0]})
        self.stat.add(x.sum())
        tm.log_event("second", {"v": x.sum()})
        return h


def run_out_of_ready_order(module, step):
    """The events the call logged, in order, and its Stat window."""
    with tm.MemoryHandler() as memory:
        tm.set_step(step)
        module(torch.ones(4, 4))
    tm.set_step(step + 1)
    module.stat.add(0.0)  # closes the call's window
    return [e.name for e in memory.events() if e.name in ("first", "second")], module.stat.get()


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_side_effects_run_in_program_order(backend):
    """Inductor lost the chain between effectful ops (torch 2.13 keys it by
    buffer name, its scheduler reads it by operation name): the ops ran as
    their inputs came ready, so a Stat's VALUE was the wrong sample and
    events came out of order (_internals.keep_effectful_ops_in_order)."""
    eager = AddsOutOfReadyOrder("pt2.order.eager")
    compiled_module = AddsOutOfReadyOrder("pt2.order.compiled")
    compiled_module.load_state_dict(eager.state_dict())
    want = run_out_of_ready_order(eager, 0)
    got = run_out_of_ready_order(torch.compile(compiled_module, fullgraph=True, backend=backend), 0)
    assert want == (["first", "second"], {tm.VALUE: 16.0, tm.COUNT: 2})
    assert got == want
    assert torch.equal(compiled_module.inputs.reducer.peek(), eager.inputs.reducer.peek())


def test_torch_still_needs_the_effect_order_patch(monkeypatch):
    """Torch 2.13's inductor runs effectful ops out of program order without
    the patch; fails once it no longer does (then delete
    ``keep_effectful_ops_in_order`` and this test)."""
    if torch.__version__ < "2.13":
        pytest.skip("checked on the torch this is tested with (2.13)")
    from torch._inductor import scheduler

    patched = scheduler.Scheduler.compute_dependencies
    monkeypatch.setattr(scheduler.Scheduler, "compute_dependencies", patched._torch_monitor_unpatched)
    names, got = run_out_of_ready_order(
        torch.compile(AddsOutOfReadyOrder("pt2.order.unpatched"), fullgraph=True, backend="inductor"), 0)
    assert names == ["second", "first"] or got[tm.VALUE] != 16.0, (
        "torch's inductor keeps effectful ops in order by itself now: delete "
        "_internals.keep_effectful_ops_in_order and this test")


def stat_read_back(stat, writer, x):
    """A training step's usual feeding: ``.item()`` breaks the graph inside
    the call's arguments, after ``stat.add`` (a builtin method) was looked
    up."""
    stat.add(x.sum().item())
    return x + 1


def writer_read_back(stat, writer, x):
    """The same with a face's Python method."""
    writer.add_scalar("pt2.read_back", x.max().item())
    return x + 1


def both_read_back(stat, writer, x):
    return stat_read_back(stat, writer, writer_read_back(stat, writer, x) - 1)


def run_read_back(fn, name, tmp_path):
    """The Stat's window and the writer's points after three calls."""
    stat = tm.Stat(f"pt2.read_back.{name}", [tm.VALUE, tm.COUNT, tm.SUM], timedelta(hours=1))
    with tm.TensorBoardWriter(str(tmp_path / name)) as writer, tm.MemoryHandler() as memory:
        for v in (1.0, 2.0, 3.0):
            fn(stat, writer, torch.full((3,), v))
        del stat  # logs its window
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points = EventAccumulator(str(tmp_path / name))
    points.Reload()
    (window,) = [dict(e.data) for e in memory.events() if e.name == "torch.monitor.Stat"]
    return window, [p.value for p in points.Scalars("pt2.read_back")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_method_looked_up_before_a_graph_break_is_called_after_it(backend, tmp_path):
    """``stat.add(loss.item())`` in a compiled step failed: Dynamo could not
    call the bound method the resumed frame was given
    (_internals.call_script_methods_across_graph_breaks)."""
    want = run_read_back(both_read_back, "eager", tmp_path)
    got = run_read_back(torch.compile(both_read_back, backend=backend), "compiled", tmp_path)
    assert want == ({"pt2.read_back.eager.value": 9.0, "pt2.read_back.eager.count": 3.0,
                     "pt2.read_back.eager.sum": 18.0}, [1.0, 2.0, 3.0])
    assert got == ({k.replace(".eager.", ".compiled."): v for k, v in want[0].items()}, want[1])


def test_torch_still_needs_the_bound_method_patch(monkeypatch, tmp_path):
    """Fails once Dynamo calls such methods by itself (then delete
    ``call_script_methods_across_graph_breaks`` and this test)."""
    if torch.__version__ < "2.13":
        pytest.skip("checked on the torch this is tested with (2.13)")
    from torch._dynamo.variables.functions import BoundBuiltinMethodVariable
    from torch._dynamo.variables.user_defined import UserDefinedObjectVariable

    for cls in (BoundBuiltinMethodVariable, UserDefinedObjectVariable):
        monkeypatch.setattr(cls, "call_function", cls.call_function._torch_monitor_unpatched)
    with pytest.raises(Exception, match="Weird method call on TorchScript object"):
        run_read_back(torch.compile(stat_read_back, backend="eager"), "stat", tmp_path)
    with pytest.raises(Exception, match="FakeScriptObject missing method implementation"):
        run_read_back(torch.compile(writer_read_back, backend="eager"), "writer", tmp_path)


class Monitored(nn.Module):
    """A model whose every instance carries the same two monitors."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.monitors = [
            tm.DifferenceMonitor(tm.PassthroughReducer(1.0, 3.0), "bn.running_mean", self),
            tm.OutputMonitor(tm.PassthroughReducer(1.0, 3.0), self.bn),
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x).sum()


def test_instances_of_one_model_share_one_compiled_graph():
    """Each monitor's hooks were functions of their own (a process-wide
    number in their attribute's name) and Dynamo guards on a hook's code:
    every instance of a model recompiled, and from the ninth on it ran
    eagerly (the recompile limit). Numbered per module, the monitors at one
    place of every instance share their hooks, and one graph serves all."""
    x = torch.randn(8, 4)
    torch.compile(Monitored(), backend="eager")(x)
    models = [Monitored() for _ in range(10)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for model in models:
            torch.compile(model, backend="eager")(x)
    for model in models:
        assert [m.key for m in model.monitors] == ["_torch_monitor_difference_0", "_torch_monitor_output_0"]
        assert all(m.dump() is not None for m in model.monitors)


class AddsTensors(nn.Module):
    """Adds a whole tensor through add_tensor (TorchScript's typed method)."""

    def __init__(self, name):
        super().__init__()
        self.stat = tm.Stat(name, [tm.VALUE, tm.MEAN, tm.COUNT, tm.SUM, tm.MAX, tm.MIN], 3600.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stat.add_tensor(x * 2)
        return x


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compiled_add_tensor_on_the_accelerator_path_matches_eager(backend):
    # The path CUDA tensors take (rows kept as tensors until the window
    # closes), forced for CPU tensors, inside a compiled graph.
    eager, compiled_module = AddsTensors("pt2.eager_rows"), AddsTensors("pt2.compiled_rows")
    compiled = torch.compile(compiled_module, fullgraph=True, backend=backend)
    with tm.testing.cpu_tensors_take_device_path():
        for x in inputs(6):
            eager(x)
            compiled(x)
    assert compiled_module.stat.count == eager.stat.count == 6 * 8
    assert_same_windows(compiled_module.stat, eager.stat)


def test_explain_counts_no_graph_break_for_stat_and_monitor():
    explanation = torch._dynamo.explain(Adds())(torch.randn(2, 4))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    module, _monitor = monitored()
    # through a lambda: explain() of the module itself compiles hooks apart
    explanation = torch._dynamo.explain(lambda x: module(x))(torch.randn(2, 3))
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compiled_intstat_takes_ints_and_integer_tensors(backend):
    eager, compiled_module = Counts("pt2.eager_hits"), Counts("pt2.compiled_hits")
    compiled = torch.compile(compiled_module, fullgraph=True, backend=backend)
    for x in inputs(5):
        eager(x)
        compiled(x)
    assert compiled_module.stat.count == eager.stat.count == 5 * (1 + 8)
    assert_same_windows(compiled_module.stat, eager.stat)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_difference_monitor_records_as_eager(backend):
    eager, eager_monitor = monitored()
    module, monitor = monitored()
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for x in inputs(20, features=3):
            eager(x)
            compiled(x)
    want, got = eager_monitor.dump(), monitor.dump()
    torch.testing.assert_close(got, want)
    assert got[:20].abs().sum(1).gt(0).all()  # in-place updates are measured
    assert got[20:].abs().sum() == 0  # nothing more was recorded


def test_compiled_monitor_guards_on_training_mode():
    module, monitor = monitored()
    monitor.evalexec = False  # record in training only
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    compiled(torch.ones(2, 3))
    module.eval()
    compiled(torch.ones(2, 3))  # recompiles once: training is configuration
    rows = monitor.dump().abs().sum(1)
    assert rows[0] > 0 and rows[1:].sum() == 0  # the eval call recorded nothing


def test_a_tensor_step_in_compiled_code_says_to_pass_an_int():
    """Eager set_step takes a 0-dim integer tensor; compiled, its value is
    known only when the graph runs, and Dynamo failed deep in the op's
    schema check (GuardOnDataDependentSymNode)."""

    def step_and_add(x, step):
        tm.set_step(step)
        return x + 1

    with pytest.raises(Exception, match=r"must be a Python int in torch.compile'd code.*pass int\(value\)"):
        torch.compile(step_and_add, fullgraph=True)(torch.ones(2), torch.tensor(3))
    tm.set_step(torch.tensor(3))  # eager: read at once
    assert tm.get_step() == 3


def test_traced_code_cannot_read_run_time_results():
    stat = tm.Stat("pt2.read", [tm.MEAN], timedelta(hours=1))

    def reads(x):
        stat.add(x.sum())
        return stat.get()  # a dict of run-time values

    with pytest.raises(Exception, match="cannot be called inside code"):
        torch.compile(reads, fullgraph=True, backend="eager")(torch.ones(2))


# ---------------------------------------------------------------- export


def test_exported_stat_calls_run_on_the_original_stat():
    module = Adds("pt2.exported")
    twin = Adds("pt2.twin")
    twin.load_state_dict(module.state_dict())
    exported = torch.export.export(module, (torch.randn(2, 4),), strict=False)
    calls = [n for n in exported.graph.nodes if n.target is torch.ops.higher_order.call_torchbind]
    assert [n.args[1] for n in calls] == ["add", "add"]
    assert module.stat.count == 0  # tracing added nothing
    runnable = exported.module()
    for x in inputs(4):
        runnable(x)
        twin(x)
    assert module.stat.count == 8
    assert_same_windows(module.stat, twin.stat)


@pytest.mark.parametrize("strict", [False, True])
def test_exported_intstat_counts_like_eager(strict):
    module, twin = Counts("pt2.exported_hits"), Counts("pt2.twin_hits")
    runnable = torch.export.export(module, (torch.randn(2, 4),), strict=strict).module()
    for x in inputs(3):
        runnable(x)
        twin(x)
    assert module.stat.count == 3 * (1 + 8)
    assert_same_windows(module.stat, twin.stat)


def test_exported_monitor_records_like_eager():
    module, monitor = monitored()
    twin, twin_monitor = monitored()
    exported = torch.export.export(module, (torch.randn(2, 3),), strict=False)
    assert monitor.peek() is None  # tracing recorded nothing
    runnable = exported.module()
    for x in inputs(5, features=3):
        runnable(x)
        twin(x)
    torch.testing.assert_close(monitor.dump(), twin_monitor.dump())


@pytest.mark.parametrize("strict", [False, True])
def test_module_holding_reducers_and_monitors_exports(strict):
    class Holds(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.reducer = tm.EMAReducer(0.5, 1.0, 10.0)
            self.passthrough = tm.PassthroughReducer(1.0, 0.0)  # keeps one

        def forward(self, x):
            return self.lin(x)

    module = Holds()
    monitor = tm.DifferenceMonitor(module.passthrough, "lin.weight", module)  # noqa: F841 (kept alive)
    exported = torch.export.export(module, (torch.randn(2, 3),), strict=strict)
    exported.module()(torch.randn(2, 3))
    assert module.passthrough.peek().shape == (3, 3)


# ---------------------------------------------------------------- fakes


def test_every_custom_class_has_a_fake_derived_from_its_schema():
    from torch_monitor import _fake

    schemas = {}
    for schema in torch._C._jit_get_custom_class_schemas():
        owner = str(schema.arguments[0].type) if schema.arguments else ""
        if owner.startswith("__torch__.torch.classes.torch_monitor."):
            schemas.setdefault(owner.rsplit(".", 1)[1], set()).add(schema.name)
    assert set(_fake.FAKE_CLASSES) == set(schemas)
    for name, methods in schemas.items():
        fake = _fake.FAKE_CLASSES[name]
        missing = {m for m in methods - {"__init__", "__getstate__", "__setstate__", "__obj_flatten__"} if not hasattr(fake, m)}
        assert not missing, f"fake {name} lacks {missing}"
        qualname = f"__torch__.torch.classes.torch_monitor.{name}"
        assert torch._library.fake_class_registry.find_fake_class(qualname) is fake


def test_flatten_holds_configuration_only():
    stat = tm.Stat("pt2.config", [tm.MEAN, tm.MAX], timedelta(seconds=7))
    before = stat.__obj_flatten__()
    stat.add(1.0)
    assert stat.__obj_flatten__() == before
    assert dict(before) == {
        "name": "pt2.config",
        "aggregations": ["mean", "max"],
        "window_size_ms": 7000,
        "window_steps": 0,
        "max_samples": 2**63 - 1,
        "close_on_time": False,
        "sync_ranks": False,
    }
    _module, monitor = monitored()
    assert dict(monitor.core.__obj_flatten__())["name"] == "state"


def test_faces_offer_every_torchscript_method():
    stat = tm.Stat("pt2.face", [tm.MEAN], timedelta(seconds=3))
    assert stat.window_size_ms() == 3000  # forwarded TorchScript method
    stat.add(torch.tensor([1.0, 2.0, 3.0]))
    assert stat.count == 3


# ---------------------------------------------------------------- ops


def test_every_op_passes_opcheck():
    """torch.library.opcheck on each torch_monitor op (schema, fake kernel,
    dispatch); log_event_values has its own in test_pt2_sinks.py, set_step
    and get_step (not traceable: its fake raises) in test_steps.py,
    live_stat_names (not traceable either) in test_python_api.py,
    watch_observe_ in test_watch.py."""
    names = {s.name for s in torch._C._jit_get_all_schemas() if s.name.startswith("torch_monitor::")}
    assert names == {
        "torch_monitor::log_event",
        "torch_monitor::log_event_values",
        "torch_monitor::set_step",
        "torch_monitor::get_step",
        "torch_monitor::live_stat_names",
        "torch_monitor::watch_observe_",
    }, (
        "a new op needs an opcheck here"
    )
    event = torch.classes.torch_monitor.Event("pt2.opcheck")
    event.set_float("a", 1.5)
    seen = []
    handle = tm.register_event_handler(seen.append)
    try:
        # test_schema is left out: torch's schema check calls len() on every
        # argument, which a custom-class object without __len__ refuses.
        torch.library.opcheck(
            torch.ops.torch_monitor.log_event.default,
            (event,),
            test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
        )
    finally:
        tm.unregister_event_handler(handle)
    assert seen and all(e.name == "pt2.opcheck" and e.data == {"a": 1.5} for e in seen)


@pytest.mark.parametrize("kind", ["compile", "export", "strict"])
def test_a_forward_calling_a_reducer_traces_and_records(kind):
    class Calls(nn.Module):
        def __init__(self):
            super().__init__()
            self.reducer = tm.EMAReducer(0.5, 1.0, 10.0)

        def forward(self, x):
            self.reducer(x)
            return x + 1

    module, twin = Calls(), Calls()
    if kind == "compile":
        explanation = torch._dynamo.explain(module)(torch.ones(3))
        assert explanation.graph_break_count == 0, explanation.break_reasons
        module.reducer.clear()
        runnable = torch.compile(module, fullgraph=True, backend="eager")
    else:
        runnable = torch.export.export(module, (torch.ones(3),), strict=kind == "strict").module()
        assert module.reducer.peek() is None  # tracing recorded nothing
    for x in inputs(4, features=3):
        runnable(x[0])
        twin(x[0])
    torch.testing.assert_close(module.reducer.dump(), twin.reducer.dump())
