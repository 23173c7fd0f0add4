"""The faces follow from the C++ schemas (torch_monitor/_faces.py): the
Python signature is the TorchScript registration's, help() shows it with the
C++ doc string, every argument of a kind is checked the same way, and no
face carries torch.ScriptObject's operator methods."""

import datetime
import inspect
import pydoc
import re

import pytest
import torch
from isolated import run_isolated

tm = pytest.importorskip("torch_monitor")

FACES = [
    tm.Stat, tm.IntStat, tm.WaitCounter, tm.WaitCounterTracker, tm.TensorBoardWriter,
    tm.JsonLinesWriter, tm.ConsoleHandler, tm.MemoryHandler, tm.PrometheusExporter,
    tm.PrometheusTextFile,
]


def schemas(face):
    return {schema.name: schema for schema, _doc in tm._C._script_methods(face._script_class)}


@pytest.mark.parametrize("face", FACES, ids=lambda f: f.__name__)
def test_python_signatures_are_the_schemas(face):
    for name, schema in schemas(face).items():
        if name == "__init__":
            python = inspect.signature(face)
        elif name.startswith("__") or not inspect.isfunction(face.__dict__.get(name)):
            continue  # a property, or a hand-written hot path
        else:
            python = inspect.signature(face.__dict__[name])
        expected = [a.name for a in schema.arguments[1:]]
        assert [p for p in python.parameters if p != "self"] == expected, (face, name)
        for argument in schema.arguments[1:]:
            if argument.has_default_value() and argument.name not in face._spelling.defaults:
                assert python.parameters[argument.name].default == argument.default_value


def test_help_starts_with_the_signature_and_documents_tensor_samples():
    text = pydoc.render_doc(tm.Stat, renderer=pydoc.plaintext)
    head = text.splitlines()[3].strip(" |")
    assert head.startswith("Stat(name: str, aggregations:") and "window_steps" in head
    assert "sync_ranks" in head and "close_on_time" in head
    assert "every element is one sample" in text  # tensor samples, in the class doc
    assert "add(self, /, value)" in text and "tensor" in tm.Stat.add.__doc__
    assert list(inspect.signature(tm.Stat.add).parameters) == ["self", "value"]
    assert tm.Stat.add_tensor.__doc__
    for operator in ("__abs__", "__iadd__", "__getitem__", "__len__"):
        assert operator not in dir(tm.Stat), operator
    assert len(text.splitlines()) < 120, len(text.splitlines())


# Public classes that users do not construct: help() shows how they are made.
NOT_MADE_BY_USERS = {
    "WaitCounterTracker": "WaitCounter.guard() makes it",
    "EventHandlerHandle": "register_event_handler() returns it",
}
INTERNALS = [
    (re.compile(r"^ \|  \w+ lambda\b"), "a lambda"),
    (re.compile(r"^ \|  (\w+) = (?!\1\b)\w+\("), "a member shown as the helper it was made from"),
    (re.compile(r"^ \|  +#"), "a source comment shown as documentation"),
    (re.compile(r"Wraps a torch\.classes"), "the Face base class's constructor"),
]


@pytest.mark.parametrize("name", [n for n in tm.__all__ if isinstance(getattr(tm, n), type)])
def test_help_of_every_public_class_shows_its_signature_and_no_internals(name):
    cls = getattr(tm, name)
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    own = text.split("inherited from")[0]  # what the class defines itself
    for pattern, what in INTERNALS:
        lines = [line for line in own.splitlines() if pattern.search(line)]
        assert not lines, f"help({name}) shows {what}: {lines}"
    if cls.__name__ not in NOT_MADE_BY_USERS:
        signature = inspect.signature(cls)
        assert f"{cls.__name__}{signature}" in text.splitlines()[3], (name, text.splitlines()[:5])
    for member, value in vars(cls).items():
        if not member.startswith("_") and callable(value) and not isinstance(value, type):
            try:
                inspect.signature(value)
            except ValueError:  # a pybind11 function: its doc's first line is the signature
                assert (value.__doc__ or "").startswith(f"{member}("), (name, member)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: tm.Stat("x", [tm.SUM], 1.0, max_samples=True), TypeError, "Stat() argument 'max_samples' must be an int"),
        (lambda: tm.WaitCounter("x", "1"), TypeError, "WaitCounter() argument 'window_size' must be a number"),
        (lambda: tm.MemoryHandler(True), TypeError, "MemoryHandler() argument 'capacity' must be an int"),
        (lambda: tm.PrometheusExporter(2**64), ValueError, "PrometheusExporter() argument 'port' must be an int in"),
        (lambda: tm.JsonLinesWriter("x.jsonl", append=1), TypeError, "JsonLinesWriter() argument 'append' must be a bool"),
        (lambda: tm.ConsoleHandler(b"std\xff"), ValueError, "ConsoleHandler() argument 'stream' is not valid UTF-8"),
        (lambda: tm.set_step(True), TypeError, "set_step() argument 'step' must be an int"),
        (lambda: tm.set_step(2**70), ValueError, "set_step() argument 'step' must be an int in"),
        (lambda: tm.set_step(-1), ValueError, "set_step(): the training step must be in [0, 2**63-1], got -1"),
        (lambda: tm.Stat("x", [], 1.0), ValueError, "Stat() argument 'aggregations' is empty: give at least one aggregation"),
    ],
)
def test_one_check_per_kind_of_argument(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_stat_add_errors_name_the_stat():
    stat = tm.Stat("named", [tm.SUM], 60.0)
    with pytest.raises(TypeError, match="Stat 'named': add\\(\\) takes a float or an int or a tensor, got str"):
        stat.add("0.5")
    with pytest.raises(TypeError, match="IntStat 'ints'"):
        tm.IntStat("ints", [tm.SUM], 60.0).add(0.5)


def test_a_module_level_stat_in_an_exported_forward_says_what_to_do():
    stat = tm.Stat("exported.global", [tm.MEAN], window_steps=10)

    class UsesGlobal(torch.nn.Module):
        def forward(self, x):
            stat.add(x.mean())
            return x

    with pytest.raises(RuntimeError, match="Hold it as one"):
        torch.export.export(UsesGlobal(), (torch.ones(3),), strict=False)


def test_scripted_objects_read_back_are_equal_to_their_face():
    stat = tm.Stat("faces.same", [tm.SUM], datetime.timedelta(seconds=60))

    class Holds(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stat = stat

        def forward(self, x: float) -> float:
            self.stat.add(x)
            return x

    scripted = torch.jit.script(Holds())
    scripted(2.0)
    assert scripted.stat == stat and stat.count == 1
    # Hashed by the C++ object: the face of what is read back hashes alike.
    assert hash(tm._faces.wrap(tm.Stat, scripted.stat)) == hash(stat)
    reducer = tm.EMAReducer(1.0, 0.5)
    monitor = tm.DifferenceMonitor(reducer, "weight", torch.nn.Linear(2, 2))
    # Each read of the monitor's reducer is a new TorchScript object around
    # the one C++ reducer: equal, and its face hashes as the module's does.
    assert monitor.core.reducer() == reducer.script_reducer
    assert hash(monitor.core.reducer()) == hash(reducer.script_reducer)


def test_a_constructor_that_raises_leaves_no_half_made_object_in_the_traceback():
    """pytest, debuggers and IDEs show the locals of a traceback's frames; a
    face whose constructor raised was never made, and reading it crashed the
    process (in a subprocess: a crash is the failure)."""
    run_isolated(
        """
        import torch_monitor as tm
        for make in (lambda: tm.Stat("s", ["mean"]),
                     lambda: tm.capture_pytorch_counters(include="("),
                     lambda: tm.JsonLinesWriter("x\\0y")):
            try:
                make()
            except ValueError as e:
                tb = e.__traceback__
                while tb is not None:
                    for value in list(tb.tb_frame.f_locals.values()):
                        repr(value)
                    tb = tb.tb_next
            else:
                raise AssertionError("no error")
        """,
        timeout=60,
    )


def test_a_sync_ranks_error_names_what_it_is_about():
    """Without torch.distributed each object says which it is (the message
    used to say "creating the Stat" for a watch or a capture too)."""
    run_isolated(
        """
        import pytest
        import torch_monitor as tm
        from torch import nn

        cases = [
            (lambda: tm.Stat("x", ["mean"], 1.0, sync_ranks=True), "Stat(): sync_ranks needs", "the Stat"),
            (lambda: tm.IntStat("x", ["sum"], 1.0, sync_ranks=True), "IntStat(): sync_ranks needs", "the Stat"),
            (lambda: tm.watch(nn.Linear(2, 2), what="output", window_steps=2, sync_ranks=True),
             "torch_monitor.watch: sync_ranks needs", "calling watch()"),
            (lambda: tm.capture_pytorch_counters(sync_ranks=True),
             "torch_monitor.capture_pytorch_counters: sync_ranks needs", "starting the capture"),
        ]
        for make, head, before in cases:
            with pytest.raises(ValueError) as refused:
                make()
            assert str(refused.value).startswith(head) and before in str(refused.value), str(refused.value)
        """
    )


@pytest.mark.parametrize(
    "cls_name, kwargs",
    [
        ("Stat", dict(name="s", aggregations=["mean", "max"], window_size=60.0, max_samples=5, close_on_time=True)),
        ("IntStat", dict(name="s", aggregations=["sum"], max_samples=2**62, window_steps=3)),
        ("WaitCounter", dict(key="k", window_size=0.25, close_on_time=True)),
    ],
)
def test_plain_arguments_reach_cpp_as_torch_converts_them(cls_name, kwargs):
    """The faces convert plain values (exact float, int, bool, str, None, a
    list of str) for C++ themselves, since torch's conversion of an Any
    argument costs most of a construction: each object is configured as the
    one torch.classes makes with torch's conversion of the same values."""
    ours = getattr(tm, cls_name)(**kwargs)
    theirs = getattr(torch.classes.torch_monitor, cls_name)(**kwargs)
    assert ours._call("__obj_flatten__", (), {}) == theirs.__obj_flatten__()
    # A method call by position (converted here) and by keyword (torch).
    if cls_name != "WaitCounter":
        sample = 3 if cls_name == "IntStat" else 2.5
        ours._call("add", (sample,), {})
        ours._call("add", (), {"v": sample})
        tm._close_all_stats()  # logs the open window: get() reads it
        expected = {"sum": 6} if cls_name == "IntStat" else {"mean": 2.5, "max": 2.5}
        assert ours._call("get", (), {}) == expected


def test_every_public_member_of_every_face_is_documented():
    """help() says what each method and property is: its doc comes from the
    TorchScript registration (or, for a Python-only property, the table of
    spellings), so a member registered without one fails here."""
    from torch_monitor import _faces

    missing = []
    for name, cls in _faces.FACE_CLASSES.items():
        for member, value in vars(cls).items():
            if member.startswith("_"):
                continue
            if not (value.__doc__ or "").strip():
                missing.append(f"{name}.{member}")
    assert not missing, f"members without a doc string: {missing}"


def test_setting_an_attribute_of_any_face_is_an_attribute_error(tmp_path):
    """As on torch.monitor's objects (and any Python object without a
    __dict__): torch.ScriptObject's own __setattr__ raised RuntimeError."""
    import test_law_round_trip as law

    reference = torch.monitor.Stat("s", [torch.monitor.Aggregation.MEAN], datetime.timedelta(seconds=60))
    with pytest.raises(AttributeError):
        reference.not_an_attribute = 1
    for cls_name in law.CLASSES:
        if cls_name in law.NO_FACE or cls_name not in law.SAMPLES:
            continue
        obj = law.build(cls_name, law.SAMPLES[cls_name][0], tmp_path / cls_name)
        try:
            with pytest.raises(AttributeError, match="not_an_attribute"):
                obj.not_an_attribute = 1
            with pytest.raises(AttributeError):
                del obj.not_an_attribute
            read_only = [k for k, v in vars(type(obj)).items() if isinstance(v, property)]
            if read_only:
                with pytest.raises(AttributeError):
                    setattr(obj, read_only[0], getattr(obj, read_only[0]))
        finally:
            law.close(obj)


# Faces a user holds only inside the Python object that made them, which
# reads its settings back itself.
INTERNAL_FACES = {
    "Reducer": "held by torch_monitor.reducers' modules (threshold: their criterion's)",
    "PytorchCounterCapture": "held by capture_pytorch_counters' handle",
    "Watch": "held by watch()'s handle",
}


def test_every_constructor_argument_of_a_face_reads_back():
    """What a face was made with can be read from it (a property or method
    of the argument's name): the sinks' flush_interval, event_names and
    append could not, from Python."""
    from torch_monitor import _faces

    missing = []
    for name, cls in _faces.FACE_CLASSES.items():
        init = [schema for schema, _doc in tm._C._script_methods(name) if schema.name == "__init__"]
        if not init or name in INTERNAL_FACES:
            continue
        missing += [f"{name}.{a.name}" for a in init[0].arguments[1:] if not hasattr(cls, a.name)]
    assert not missing, f"constructor arguments that cannot be read back: {missing}"
