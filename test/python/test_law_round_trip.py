"""Law: settings survive every copy (issue 25).

For every class registered in ``torch.classes.torch_monitor`` (read from the
registry, so a new class is covered by being registered), an object built
with each constructor argument set to a value other than its default reads
back the same configuration after ``torch.jit.save``/``load``,
``copy.copy``, ``copy.deepcopy`` and ``pickle``, or that copy kind does what
its face's copy policy says (docs/design.md, "One object, every face"): a
sink, which stands for an output, is the same object when copied and refuses
pickling with a TypeError.

"Reads back" is the object's configuration, ``__obj_flatten__`` (what
PyTorch 2 sees), with the configuration of each object it was given (a
monitor's reducer). So that the comparison can fail, the test first checks
that every constructor argument shows in that configuration: leaving it at
its default (or giving a required one another value) must change it.

A new class needs only rows in SAMPLES (and ALTERNATIVES for a required
argument): the test fails naming what is missing.
"""

import copy
import pathlib
import io
import pickle
import socket

import pytest
import torch

tm = pytest.importorskip("torch_monitor")

from torch_monitor import _internals  # noqa: E402

SCHEMAS = _internals.custom_class_schemas("torch_monitor")


def constructor(cls_name):
    return next((s for s in SCHEMAS[cls_name] if s.name == "__init__"), None)


CLASSES = sorted(name for name in SCHEMAS if constructor(name) is not None)

# Classes a user never holds a face of, each with the reason.
NO_FACE = {
    "Event": "a value type: torch_monitor.Event is copied by value between C++ and Python",
}


def tensorboard(tmp):
    return tm.TensorBoardWriter(tmp / "law.tb", flush_interval=3600.0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reducer(**kwargs):
    return tm.reducers.EMAReducer(**{"step_time": 1.0, "alpha": 0.5, **kwargs}).script_reducer


# Per class, constructions (keyword arguments; a callable value is called
# with the test's tmp_path) that together give every constructor argument a
# value other than its default. Arguments that need a process group are in
# RANK_ARGUMENTS.
SAMPLES = {
    "Stat": [
        dict(name="law.a", aggregations=["max", "min"], window_size=2.5, max_samples=7, close_on_time=True),
        dict(name="law.b", aggregations=["sum"], window_steps=3),
    ],
    "IntStat": [
        dict(name="law.i", aggregations=["max"], window_size=4.0, max_samples=3, close_on_time=True),
        dict(name="law.j", aggregations=["count"], window_steps=5),
    ],
    "WaitCounter": [dict(key="law.wait", window_size=7.5, close_on_time=True)],
    "Reducer": [
        dict(kind="ScaledNearestTraceReducer", step_time=0.5, duration=2.0, inclusive=True, inplace=True,
             params={"time_constant": 3.0, "amplitude": 2.0, "scale": 0.5}, criterion="gt", threshold=0.25),
    ],
    "DifferenceMonitor": [
        dict(reducer=lambda tmp: reducer(duration=2.0), name="law.buffer", train_update=False,
             eval_update=False, keep_graph=True, kind="StateMonitor"),
    ],
    "TensorBoardWriter": [
        dict(log_dir=lambda tmp: tmp / "tb", flush_interval=2.5, max_buffer_bytes=1 << 20,
             event_names=["law"], step_key="law.step", ranks="zero"),
    ],
    "JsonLinesWriter": [
        dict(path=lambda tmp: tmp / "e.jsonl", flush_interval=2.5, max_buffer_bytes=1 << 20,
             event_names=["law"], append=False, ranks="zero"),
    ],
    "ConsoleHandler": [dict(stream="stdout", event_names=["law"])],
    "MemoryHandler": [dict(capacity=3, event_names=["law"])],
    "PrometheusExporter": [dict(port=lambda tmp: free_port(), host="localhost", labels={"job": "law"})],
    "PrometheusTextFile": [dict(path=lambda tmp: tmp / "m.prom", labels={"job": "law"})],
    "PytorchCounterCapture": [
        dict(window_size=2.5, include="law", exclude="other", close_on_time=True),
        dict(window_steps=3),
    ],
    "Watch": [
        dict(paths=["fc.weight", "fc"], kinds=["grad", "output"], window_steps=4, every=2,
             histograms_every=3, writer=tensorboard, memory=True, device="cpu", on_nonfinite="raise"),
        dict(paths=["fc.bias"], kinds=["update"], window_seconds=1.5, close_on_time=True),
    ],
}
# Another value for each required argument (they have no default to leave
# them at).
ALTERNATIVES = {
    "name": "law.other",
    "aggregations": ["mean"],
    "key": "law.other",
    "kind": "EMAReducer",
    "step_time": 2.0,
    "reducer": lambda tmp: reducer(step_time=3.0),
    "log_dir": lambda tmp: tmp / "other.tb",
    "path": lambda tmp: tmp / "other",
    "paths": ["fc.weight", "fc.bias"],
    "kinds": ["grad", "weight"],
}
# The defaults an argument's visibility is checked against when the schema's
# is not a valid choice on its own (Stat: one of window_size and
# window_steps).
ARGUMENT_DEFAULTS = {}
# Arguments whose non-default value needs torch.distributed's default group:
# test_settings_that_need_a_process_group_survive_every_copy.
RANK_ARGUMENTS = {"sync_ranks": True}
# Settings a copy kind changes on purpose, with the reason (docs say so).
CHANGED_ON_PURPOSE = {
    ("JsonLinesWriter", "jit", "append"): "a loaded writer appends: loading a model never truncates a log",
}
COPY_KINDS = ("jit", "copy", "deepcopy", "pickle")


def face_class(cls_name):
    face = tm._faces.FACE_CLASSES.get(cls_name)
    assert face is not None, (
        f"torch.classes.torch_monitor.{cls_name} has no Python face: make it with "
        "_faces.make_face (or list it in NO_FACE with the reason)"
    )
    return face


def build(cls_name, kwargs, tmp):
    tmp.mkdir(parents=True, exist_ok=True)
    given = {k: (v(tmp) if callable(v) else v) for k, v in kwargs.items()}
    return face_class(cls_name)(**given)


def config(obj):
    """The configuration: __obj_flatten__, with each object it holds (a
    watch's writer) or was given (a monitor's reducer) read as its own."""
    out = {k: config(v) if isinstance(v, torch.ScriptObject) else v for k, v in obj.__obj_flatten__()}
    schema = constructor(obj._type().qualified_name().rpartition(".")[2])
    for argument in schema.arguments[1:]:
        if isinstance(argument.type, torch.ClassType):
            out[argument.name] = config(getattr(obj, argument.name)())
    return out


class Holder(torch.nn.Module):
    def __init__(self, obj):
        super().__init__()
        self.obj = obj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def copied(obj, how):
    if how == "jit":
        buffer = io.BytesIO()
        torch.jit.save(torch.jit.script(Holder(obj)), buffer)
        buffer.seek(0)
        # A loaded sink opens its output again (an exporter its port).
        close(obj)
        return torch.jit.load(buffer).obj
    if how == "copy":
        return copy.copy(obj)
    if how == "deepcopy":
        return copy.deepcopy(obj)
    return pickle.loads(pickle.dumps(obj))


def close(*objects):
    for obj in objects:
        if hasattr(type(obj), "closed") and callable(getattr(obj, "close", None)):
            obj.close()


@pytest.mark.parametrize("cls_name", CLASSES)
def test_samples_give_every_constructor_argument_another_value(cls_name):
    if cls_name in NO_FACE:
        pytest.skip(NO_FACE[cls_name])
    face_class(cls_name)
    samples = SAMPLES.get(cls_name)
    assert samples, f"SAMPLES has no construction of {cls_name}"
    given = {name for kwargs in samples for name in kwargs}
    missing = [
        a.name for a in constructor(cls_name).arguments[1:]
        if a.name not in given and a.name not in RANK_ARGUMENTS
    ]
    assert missing == [], f"SAMPLES[{cls_name!r}] leaves {missing} at their defaults"


@pytest.mark.parametrize("cls_name", [c for c in CLASSES if c not in NO_FACE])
def test_every_constructor_argument_shows_in_the_configuration(cls_name, tmp_path):
    """Else a lost setting could not be seen by the round trip below."""
    schema = {a.name: a for a in constructor(cls_name).arguments[1:]}
    for kwargs in SAMPLES.get(cls_name, ()):
        full = build(cls_name, kwargs, tmp_path)
        reference = config(full)
        close(full)
        for name in kwargs:
            other = dict(kwargs)
            if (cls_name, name) in ARGUMENT_DEFAULTS:
                other[name] = ARGUMENT_DEFAULTS[(cls_name, name)]
            elif schema[name].has_default_value():
                del other[name]
            else:
                assert name in ALTERNATIVES, f"ALTERNATIVES has no other value for {cls_name}'s {name!r}"
                other[name] = ALTERNATIVES[name]
            try:
                obj = build(cls_name, other, tmp_path / f"other_{name}")
            except (ValueError, TypeError, RuntimeError):
                continue  # the argument cannot take that value on its own here
            assert config(obj) != reference, f"{cls_name}'s {name!r} does not show in its configuration"
            close(obj)


@pytest.mark.parametrize("how", COPY_KINDS)
@pytest.mark.parametrize("cls_name", [c for c in CLASSES if c not in NO_FACE])
def test_settings_survive_every_copy(cls_name, how, tmp_path):
    for index, kwargs in enumerate(SAMPLES.get(cls_name, ())):
        obj = build(cls_name, kwargs, tmp_path / str(index))
        check_copy(obj, how)
        close(obj)


def check_copy(obj, how):
    cls_name = obj._script_class
    policy = type(obj)._spelling.copies
    if policy != "state" and how != "jit":
        # A sink stands for an output: a copy is the same object, and
        # pickling is refused saying why (the TypeError the docs state).
        if how == "pickle":
            with pytest.raises(TypeError, match="cannot be pickled"):
                pickle.dumps(obj)
        else:
            assert copied(obj, how) is obj
        return
    before = config(obj)
    copy_ = copied(obj, how)
    after = config(copy_)
    for (name, kind, key), _reason in CHANGED_ON_PURPOSE.items():
        if (name, kind) == (cls_name, how):
            before.pop(key), after.pop(key)
    assert after == before, f"{cls_name} after {how}"
    if copy_ is not obj:
        close(copy_)


def test_settings_that_need_a_process_group_survive_every_copy(tmp_path):
    """sync_ranks=True: one rank of gloo in a fresh process."""
    import isolated

    isolated.run_isolated(
        f"""
        import pathlib, sys, torch, torch.distributed as dist
        sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
        import torch_monitor as tm
        import test_law_round_trip as law
        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
        try:
            for cls_name, samples in law.SAMPLES.items():
                names = {{a.name for a in law.constructor(cls_name).arguments[1:]}}
                extra = {{k: v for k, v in law.RANK_ARGUMENTS.items() if k in names}}
                if not extra:
                    continue
                for i, kwargs in enumerate(samples):
                    obj = law.build(cls_name, {{**kwargs, **extra}}, pathlib.Path({str(tmp_path)!r}) / str(i))
                    assert law.config(obj)["sync_ranks"] is True, cls_name
                    for how in law.COPY_KINDS:
                        law.check_copy(obj, how)
                    print("checked", cls_name)
        finally:
            tm.flush_rank_sync()
            dist.destroy_process_group()
        """,
        timeout=120,
    )
