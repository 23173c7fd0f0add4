"""torch.export.export(..., strict=True) of modules that feed torch_monitor objects.

The exported program must call the ORIGINAL objects (the module's Stat, the
DifferenceMonitor attached to it), exactly as eager mode does: same events,
same histories, and nothing recorded while exporting. Torch 2.13 needs a
patch for that (``_internals.keep_real_objects_in_strict_export``), torch
2.11 a second one before it (``_internals.keep_captured_objects_in_strict_export``);
the last two tests fail once torch no longer needs them, so they can go.
"""

import inspect
import pathlib
import sys
from datetime import timedelta

import pytest
import torch
from torch import nn

tm = pytest.importorskip("torch_monitor")
testing = pytest.importorskip("torch_monitor.testing")

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from isolated import run_isolated  # noqa: E402

WINDOW = timedelta(milliseconds=100)
INPUTS = [torch.tensor([1.0, 2.0]), torch.tensor([-3.0, 0.5]), torch.tensor([4.0, 4.0])]


class StatFeeder(nn.Module):
    """Adds a float and a value computed from the input to its Stat."""

    def __init__(self, stat):
        super().__init__()
        self.stat = stat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stat.add(1.5)
        self.stat.add(x.sum())
        return x * 2


class InPlace(nn.Module):
    """Updates a buffer in place in forward (what a DifferenceMonitor watches)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.mul_(0.5).add_(x)
        return self.state * 1.0


def face_stat(name):
    return tm.Stat(name, [tm.MEAN, tm.COUNT, tm.SUM], WINDOW)


def script_stat(name):
    return torch.classes.torch_monitor.Stat(name, ["mean", "count", "sum"], WINDOW.total_seconds())


@pytest.fixture
def events():
    """The (name, data) of every event logged during the test."""
    logged = []
    handle = tm.register_event_handler(lambda e: logged.append((e.name, dict(e.data))))
    yield logged
    tm.unregister_event_handler(handle)


def stat_events(logged, stat_name):
    """The data of the Stat events of ``stat_name``, keys without the name."""
    prefix = stat_name + "."
    return [
        {key[len(prefix):]: value for key, value in data.items()}
        for name, data in logged
        if name == "torch.monitor.Stat" and all(k.startswith(prefix) for k in data)
    ]


@pytest.mark.parametrize("make_stat", [face_stat, script_stat], ids=["face", "torch.classes"])
def test_strict_export_feeds_the_modules_own_stat(events, make_stat):
    # Names of their own: a Stat of another test logs its open window when freed.
    eager_name, exported_name = f"{make_stat.__name__}.eager", f"{make_stat.__name__}.exported"
    with testing.fake_clock(0) as clock:
        eager = StatFeeder(make_stat(eager_name))
        module = StatFeeder(make_stat(exported_name))
        ep = torch.export.export(module, (INPUTS[0],), strict=True)

        (constant,) = ep.constants.values()
        assert constant is module.stat, ep.constants
        exported = ep.module()
        for x in INPUTS:
            torch.testing.assert_close(exported(x), eager(x))
        clock.set_ms(150)  # the next add closes the window and logs it
        eager.stat.add(0.0)
        module.stat.add(0.0)

    total = 1.5 * len(INPUTS) + sum(float(x.sum()) for x in INPUTS)
    count = 2.0 * len(INPUTS)
    expected = stat_events(events, eager_name)
    assert expected == [{"mean": total / count, "count": count, "sum": total}]
    # Exporting traced with a fake: the real Stat saw only the program's calls.
    assert stat_events(events, exported_name) == expected


BATCHES = [torch.arange(6.0).reshape(3, 2), torch.tensor([[1.0, -1.0], [0.5, 2.0], [3.0, 0.0]])]


@pytest.mark.parametrize(
    "make_module, attr, inputs",
    [(InPlace, "state", INPUTS), (lambda: nn.BatchNorm1d(2), "running_mean", BATCHES)],
    ids=["in-place-buffer", "batchnorm-train"],
)
def test_strict_export_feeds_the_attached_difference_monitor(make_module, attr, inputs):
    eager, module = make_module(), make_module()
    eager_monitor = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=5.0), attr, eager)
    monitor = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, duration=5.0), attr, module)

    ep = torch.export.export(module, (inputs[0],), strict=True)
    assert monitor.dump() is None, "exporting recorded a difference"
    (constant,) = ep.constants.values()
    assert constant is _monitor_core(module), ep.constants

    exported = ep.module()
    for x in inputs:
        torch.testing.assert_close(exported(x), eager(x))
    torch.testing.assert_close(monitor.peek(), eager_monitor.peek())
    torch.testing.assert_close(monitor.dump(), eager_monitor.dump())


def _monitor_core(module):
    """The custom-class object a DifferenceMonitor keeps on its module (its
    hooks call it), whatever attribute name it has."""
    (core,) = [v for v in vars(module).values() if isinstance(v, torch.ScriptObject)]
    return core


def test_strict_export_as_the_first_use_of_pytorch_2():
    # torch.export._trace imports Dynamo half-way through its own import, and
    # Dynamo's import sets up the fakes: the patch of _strict_export must
    # still wait for _trace to be whole (it once ran on the half-imported
    # module, warned, and strict export then left fakes in the program).
    # A fresh process: nothing else has imported PyTorch 2's machinery.
    run_isolated(
        """
        import torch, torch_monitor as tm
        class Feeder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.stat = tm.Stat("first", [tm.COUNT], window_steps=10)
            def forward(self, x):
                self.stat.add(x.sum())
                return x * 2
        model = Feeder()
        program = torch.export.export(model, (torch.ones(2),), strict=True)
        program.module()(torch.ones(2))
        assert model.stat.count == 1, model.stat.count
        """,
        env={"PYTHONWARNINGS": "error::RuntimeWarning"},
        timeout=240,
    )


def test_torch_still_needs_the_strict_export_patch(monkeypatch):
    """Fails once torch keeps real custom objects in strict export by itself.

    Then delete ``keep_real_objects_in_strict_export`` and this test.
    """
    from torch._library import fake_class_registry
    from torch.export import _trace

    patched = _trace._strict_export
    assert getattr(patched, "_torch_monitor_real_objects", False), (
        "torch_monitor's strict-export patch is not installed"
    )
    strict_export, to_fake = patched._torch_monitor_unpatched
    monkeypatch.setattr(_trace, "_strict_export", strict_export)
    monkeypatch.setattr(fake_class_registry, "maybe_to_fake_obj", to_fake)

    module = StatFeeder(script_stat("unpatched"))
    ep = torch.export.export(module, (INPUTS[0],), strict=True)
    (constant,) = ep.constants.values()
    assert isinstance(constant, fake_class_registry.FakeScriptObject), (
        f"torch {torch.__version__} now keeps the real object ({constant!r}) in "
        "strict export: remove _internals.keep_real_objects_in_strict_export"
    )


def test_torch_still_needs_the_strict_capture_patch(monkeypatch):
    """Torch 2.11's strict export fails on any module holding a custom-class
    object; torch 2.13 captures it itself (its ``DynamoGraphTransformer``
    takes the inputs' sources as ``graph_inputs``), and there the patch must
    not be installed. Fails once the torch in use no longer matches either.

    Then delete ``keep_captured_objects_in_strict_export`` and this test.
    """
    from torch._dynamo import functional_export

    transformer = functional_export.DynamoGraphTransformer
    unpatched = getattr(transformer.placeholder, "_torch_monitor_unpatched", None)
    if "graph_inputs" in inspect.signature(transformer.__init__).parameters:
        # test_torch_still_needs_the_strict_export_patch exports with this
        # torch's own capture.
        assert unpatched is None, "the strict capture patch is installed on a torch that needs none"
        return
    assert unpatched is not None, "torch_monitor's strict capture patch is not installed"
    capture, placeholder = unpatched
    monkeypatch.setattr(functional_export, "fullgraph_capture", capture)
    monkeypatch.setattr(transformer, "placeholder", placeholder)

    module = StatFeeder(script_stat("uncaptured"))
    try:
        torch.export.export(module, (INPUTS[0],), strict=True)
    except AssertionError as error:
        assert "AttrSource" in str(error) and "stat" in str(error), error
    else:
        pytest.fail(
            f"torch {torch.__version__} now exports a module holding a custom "
            "object strictly: remove _internals.keep_captured_objects_in_strict_export"
        )
