"""The C++ table of reducer kinds, the TorchScript class and the Python
classes agree, for every kind.

``_C._reducer_kinds()`` is the table. Each kind is built through
torch.classes.torch_monitor.Reducer with the table's defaults (and a valid
value for each required parameter), and its kind(), arity(), params() and
criterion() must be what the table says; the Python class of the same name
must take the table's parameters with its defaults, in inferno's signature,
and expose each as a property.
"""

import inspect
import math
import re

import pytest
import torch

from conftest import load_module

tm = load_module("torch_monitor")
KINDS = tm._C._reducer_kinds()
# Table parameters that are not inferno-named reducer arguments.
TIMING = ["duration", "inclusive", "inplace"]

# A value each check accepts, and one it refuses.
ALLOWED = {
    "any number": 0.5,
    "greater than 0": 2.0,
    "non-zero": 1.5,
    "in [0, 1]": 0.25,
}
REFUSED = {"greater than 0": 0.0, "non-zero": 0.0, "in [0, 1]": 1.5}


def ids(kinds):
    return [kind["name"] for kind in kinds]


def valid_params(kind):
    """The table's defaults, plus an accepted value for required ones."""
    params = {}
    for spec in kind["params"]:
        if spec["required"]:
            params[spec["name"]] = ALLOWED[spec["check"]]
        elif spec["default"] is not None:
            params[spec["name"]] = spec["default"]
    return params


def script_reducer(kind, params, **kwargs):
    criterion = "gt" if kind["takes_criterion"] else ""
    return torch.classes.torch_monitor.Reducer(
        kind["name"], 1.0, 2.0, False, False, params, criterion, 0.0, **kwargs
    )


def same(a, b):
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def test_the_table_lists_the_python_classes():
    exported = [
        name
        for name in tm.reducers.__all__
        if name.endswith("Reducer") and name != "FoldReducer"
    ]
    assert ids(KINDS) == exported and len(exported) == 10
    for kind in KINDS:
        for spec in kind["params"]:
            assert spec["required"] == (spec["default"] is None and not spec["unsettable"])


@pytest.mark.parametrize("kind", KINDS, ids=ids(KINDS))
def test_torchscript_class_follows_the_table(kind):
    params = valid_params(kind)
    r = script_reducer(kind, params)
    assert r.kind() == kind["name"]
    assert r.arity() == kind["arity"]
    assert bool(r.criterion()) == kind["takes_criterion"]
    got = dict(r.params())
    assert sorted(got) == sorted(params)
    for name, value in params.items():
        assert same(got[name], value), name


@pytest.mark.parametrize("kind", KINDS, ids=ids(KINDS))
def test_torchscript_class_refuses_what_the_table_refuses(kind):
    params = valid_params(kind)
    for spec in kind["params"]:
        if spec["required"]:
            missing = {k: v for k, v in params.items() if k != spec["name"]}
            with pytest.raises(ValueError, match=f"needs the parameter '{spec['name']}'"):
                script_reducer(kind, missing)
        if spec["check"] in REFUSED:
            bad = dict(params, **{spec["name"]: REFUSED[spec["check"]]})
            with pytest.raises(ValueError, match=re.escape(f"{spec['name']} must be {spec['check']}")):
                script_reducer(kind, bad)
    with pytest.raises(ValueError, match="has no parameter 'bogus'"):
        script_reducer(kind, dict(params, bogus=1.0))


def test_unknown_kind_lists_the_kinds():
    with pytest.raises(ValueError, match="unknown reducer kind 'MaxReducer'; the kinds are PassthroughReducer, "):
        torch.classes.torch_monitor.Reducer("MaxReducer", 1.0)


@pytest.mark.parametrize("kind", KINDS, ids=ids(KINDS))
def test_python_class_follows_the_table(kind):
    cls = getattr(tm, kind["name"])
    assert issubclass(cls, tm.reducers.FoldReducer) and cls._kind == kind["name"]
    signature = inspect.signature(cls)
    names = [spec["name"] for spec in kind["params"]]
    expected = ["step_time"] + names + TIMING
    if kind["takes_criterion"]:
        expected.insert(expected.index(TIMING[0]) if not cls._criterion_first else 1, "criterion")
    assert list(signature.parameters) == expected
    for spec in kind["params"]:
        default = signature.parameters[spec["name"]].default
        if spec["required"]:
            assert default is inspect.Parameter.empty, spec["name"]
        elif spec["unsettable"]:
            assert default is None, spec["name"]
        else:
            assert same(cls._to_table(spec["name"], default), spec["default"]), spec["name"]
        prop = getattr(cls, spec["name"])
        assert isinstance(prop, property) and prop.__doc__
        assert (prop.fset is None) == spec["fixed"], spec["name"]

    # Built with the table's values, the Python reducer holds them.
    args = {}
    for spec in kind["params"]:
        if spec["required"]:
            args[spec["name"]] = ALLOWED[spec["check"]]
    if kind["takes_criterion"]:
        args["criterion"] = tm.Criterion("gt", 0.0)
    reducer = cls(1.0, **args)
    assert isinstance(reducer, cls)
    assert dict(reducer.script_reducer.params()) == valid_params(kind)
    for name, value in valid_params(kind).items():
        assert same(getattr(reducer, name), value), name


def test_python_classes_can_be_subclassed():
    class Smoothed(tm.EMAReducer):
        def __init__(self, step_time):
            super().__init__(step_time, 0.5, duration=1.0)

    r = Smoothed(1.0)
    assert isinstance(r, tm.EMAReducer) and r.alpha == 0.5 and r.recordsz == 1
    r.alpha = 0.25
    assert r.script_reducer.params()["alpha"] == 0.25
    with pytest.raises(TypeError, match="alpha"):
        tm.EMAReducer(1.0)  # missing required argument, as a plain class


@pytest.mark.parametrize("kind", KINDS, ids=ids(KINDS))
def test_python_signature_is_infernos(kind):
    inferno_observe = pytest.importorskip("inferno.observe")
    ours = inspect.signature(getattr(tm, kind["name"]))
    theirs = inspect.signature(getattr(inferno_observe, kind["name"]))
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == [
        (p.name, p.kind, p.default) for p in theirs.parameters.values()
    ]
