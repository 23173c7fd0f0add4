"""The documented Python call works in every world (issue 16, "same call,
every world"): each public method of each object, called with keywords as
Python users write it, in eager code, in TorchScript, under
torch.compile(fullgraph=True) and through torch.export (strict and not).

The keywords are the TorchScript schema's own argument names (the faces are
made from them), so a name that drifted between worlds fails here. Getters
of run-time state (get(), count(), dropped(), ...) cannot run inside traced
code by design: there the test checks the clear error that says so; getters
of configuration (name(), window_size_ms(), ...) read the object's
configuration, which traced code may.
"""

import datetime
import pathlib
import sys

import pytest
import torch

tm = pytest.importorskip("torch_monitor")

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import test_law_round_trip as law  # noqa: E402  (the registry and a sample of each class)


def make_objects(tmp_path):
    """{class name: a fresh object}, for every class of the registry: the
    first sample construction of the round-trip law (sinks write under
    tmp_path)."""
    return {
        name: law.build(name, samples[0], tmp_path / name)
        for name, samples in law.SAMPLES.items()
        if name in CLASSES
    }


# Keyword arguments of the methods that take any, as the docs spell them.
KWARGS = {
    "add": {"v": 2.0},
    "add_tensor": {"values": torch.ones(3)},
    "add_scalar": {"tag": "kw", "scalar_value": 1.5, "global_step": 3, "walltime": 10.0},
    "add_histogram": {"tag": "kw.h", "values": torch.arange(4.0), "global_step": 3},
    "before": {"value": torch.ones(2), "training": True},
    "after": {"value": torch.ones(2), "training": True},
    "observe": {"value": torch.ones(2), "training": True},
    "set_train_update": {"value": True},
    "set_eval_update": {"value": True},
    "set_keep_graph": {"value": False},
    "view": {"time": 0.0, "tolerance": 1e-7},
    # Reducer
    "forward": {"inputs": [torch.ones(2)]},
    "set_step_time": {"value": 0.5},
    "set_duration": {"value": 2.0},
    "set_inclusive": {"value": True},
    "set_inplace": {"value": True},
    "set_param": {"name": "time_constant", "value": 3.0},
    "set_criterion": {"name": "gt", "threshold": 0.25},
    "to": {"device": torch.device("cpu"), "dtype": torch.float32},
    # Watch (its sample's key 0 is a gradient)
    "observe_watch": {"values": [torch.ones(3)], "keys": [0], "before": []},
    "watch_steps": {"keys": [0], "parameters": [torch.ones(3)]},
    "before_step": {"gradients_after": True},
    "after_step": {"skipped": False},
}
# IntStat.add takes ints.
INT_KWARGS = {"add": {"v": 2}, "add_tensor": {"values": torch.ones(3, dtype=torch.int64)}}

# Methods that change state and return nothing: a compiled or exported graph
# records them, and they run when it runs.
SIDE_EFFECTS = {
    "add", "add_tensor", "add_scalar", "add_histogram", "flush", "register", "unregister",
    "before", "after", "observe", "forget", "forget_all",
    "set_train_update", "set_eval_update", "set_keep_graph",
    "forward", "set_step_time", "set_duration", "set_inclusive", "set_inplace", "set_param",
    "set_criterion", "to", "watch_steps", "before_step", "after_step",
}
# Ending an object's life is not something the test does in graphs, nor
# replacing its whole history (set_storage, load_state: test_monitor_state.py).
SKIPPED = {"close", "clear", "guard", "render", "remove", "set_storage", "load_state"}


def public_methods(obj):
    """(name, kwargs) of the object's TorchScript methods a user calls."""
    cls = type(obj)._script_class
    methods = []
    for schema, _doc in tm._C._script_methods(cls):
        name = schema.name
        if name.startswith("__") or name in SKIPPED:
            continue
        table = INT_KWARGS if cls == "IntStat" and name in INT_KWARGS else KWARGS
        key = f"{name}_watch" if cls == "Watch" and f"{name}_watch" in table else name
        assert key in table or len(schema.arguments) == 1, f"{cls}.{name} needs example arguments"
        methods.append((name, table.get(key, {})))
    return methods


# Every class of the registry a user holds a face of.
CLASSES = [name for name in law.CLASSES if name not in law.NO_FACE]


@pytest.fixture
def objects(tmp_path):
    made = make_objects(tmp_path)
    yield made
    for obj in made.values():
        if hasattr(obj, "close") and callable(obj.close) and hasattr(obj, "closed"):
            obj.close()


class Holder(torch.nn.Module):
    def __init__(self, obj):
        super().__init__()
        self.obj = obj


def traced_call(name, kwargs):
    """A forward calling obj.<name>(**kwargs) (one line per method, since
    Dynamo and TorchScript need the call spelled out)."""

    def forward(self, x):
        getattr(self.obj, name)(**kwargs)
        return x + 1

    return forward


@pytest.mark.parametrize("cls", CLASSES)
def test_eager_and_torchscript_take_the_same_keywords(objects, cls):
    obj = objects[cls]
    for name, kwargs in public_methods(obj):
        if isinstance(getattr(type(obj), name, None), property):
            getattr(obj, name)  # a getter reads as a property in Python (_spellings.py)
        else:
            getattr(obj, name)(**kwargs)
        # TorchScript: the same keywords, compiled against the schema.
        args = ", ".join(f"{k}: {type_name(v)}" for k, v in kwargs.items())
        call = ", ".join(f"{k}={k}" for k in kwargs)
        source = (
            f"def call(obj: __torch__.torch.classes.torch_monitor.{cls}{', ' if args else ''}{args}):\n"
            f"    obj.{name}({call})\n"
        )
        cu = torch.jit.CompilationUnit(source)
        cu.call(obj, **kwargs)


@pytest.mark.parametrize("cls", CLASSES)
def test_constructors_take_the_same_keywords_in_eager_and_torchscript(cls, tmp_path):
    """The documented Python construction, written in TorchScript with the
    same keywords, makes an object of the same configuration."""
    for index, sample in enumerate(law.SAMPLES[cls]):
        kwargs = {k: (v(tmp_path / str(index)) if callable(v) else v) for k, v in sample.items()}
        kwargs = {k: str(v) if isinstance(v, pathlib.PurePath) else v for k, v in kwargs.items()}
        eager = law.face_class(cls)(**kwargs)
        expected = law.config(eager)
        law.close(eager)  # a sink's output (a port) is free again
        objects = {k: v for k, v in kwargs.items() if isinstance(v, torch.ScriptObject)}
        args = ", ".join(f"{k}: {type_name(v)}" for k, v in objects.items())
        call = ", ".join(f"{k}={k if k in objects else literal(v)}" for k, v in kwargs.items())
        source = (
            f"def make({args}):\n"
            f"    return torch.classes.torch_monitor.{cls}({call})\n"
        )
        scripted = torch.jit.CompilationUnit(source).make(**objects)
        assert law.config(scripted) == expected, source
        law.close(scripted)


def literal(value):
    """``value`` as TorchScript source (a list or dict typed by its items)."""
    return repr(value)


def type_name(value):
    """TorchScript's name of the type of ``value``."""
    if isinstance(value, torch.Tensor):
        return "torch.Tensor"
    if isinstance(value, torch.device):
        return "torch.device"
    if isinstance(value, torch.dtype):
        return "torch.dtype"
    if isinstance(value, torch.ScriptObject):
        return value._type().qualified_name()
    if isinstance(value, list):
        return f"List[{type_name(value[0]) if value else 'torch.Tensor'}]"
    if isinstance(value, dict):
        key, item = next(iter(value.items()))
        return f"Dict[{type_name(key)}, {type_name(item)}]"
    return type(value).__name__


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("world", ["compile", "export", "strict export"])
def test_traced_worlds_take_the_same_keywords(objects, cls, world):
    obj = objects[cls]
    x = torch.zeros(2)
    for name, kwargs in public_methods(obj):
        module = type("Calls", (Holder,), {"forward": traced_call(name, kwargs)})(obj)
        if name in SIDE_EFFECTS:
            run_traced(module, x, world)
            continue
        config = dict(obj.__obj_flatten__())
        if name in config:
            # A configuration getter: traced code may read the configuration
            # (a constant of the object) when it is a number or a flag; what
            # torch does with other results (a str, a list) is torch's.
            if isinstance(config[name], (bool, int, float)):
                run_traced(module, x, world)
            continue
        # A getter of run-time state (a count, a dict, a flag) is refused
        # while tracing, naming the method: never a silently baked-in value.
        with pytest.raises(Exception, match=rf"{name}\(\) cannot be called inside code"):
            run_traced(module, x, world)


def run_traced(module, x, world):
    torch._dynamo.reset()
    if world == "compile":
        torch.compile(module, fullgraph=True, backend="eager")(x)
    else:
        ep = torch.export.export(module, (x,), strict=world == "strict export")
        ep.module()(x)


def test_windows_agree_across_worlds():
    # The same thing, one name per world's duration type: Python's
    # window_size (a timedelta), TorchScript's window_size_ms() (an int).
    stat = tm.Stat("kw.window", [tm.MEAN], datetime.timedelta(seconds=2.5))
    assert stat.window_size == datetime.timedelta(seconds=2.5)
    assert stat.window_size_ms() == 2500


def test_every_torchscript_argument_has_a_name():
    """A call by keyword needs the schema to name the argument: an argument
    registered without torch::arg reads as `_1` and can only be passed by
    position, in every world. (Reducer's and Event's setters, the monitor's
    set_keep_graph and others were such.)"""
    unnamed = []
    for cls, schemas in tm._internals.custom_class_schemas("torch_monitor").items():
        for schema in schemas:
            if schema.name.startswith("__"):
                continue  # a protocol (__exit__, __setstate__): called by position
            unnamed += [f"{cls}.{schema}" for a in schema.arguments[1:] if a.name.startswith("_")]
    for schema in tm._internals.library_op_schemas("torch_monitor"):
        unnamed += [f"op {schema}" for a in schema.arguments if a.name.startswith("_")]
    assert unnamed == []
