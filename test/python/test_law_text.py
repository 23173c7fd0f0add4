"""Law: text is checked once, everywhere (issue 25).

Every string a torch_monitor object takes (names, paths, keys, labels, event
names) passes the one check, UTF-8 without NUL (C++ ``detail::checkText``),
when the object is made and when it is loaded: a NUL would cut the string
short in files and C APIs, and bytes that are not UTF-8 would reach the
sinks' JSON and protobuf encoders.

For every class registered in ``torch.classes.torch_monitor`` (read from the
registry, so a new class is covered by being registered) and each of its
constructor arguments that holds text, the TorchScript constructor itself
(no Python face in between: TorchScript and C++ callers have none) refuses
the sample construction of test_law_round_trip with a NUL put into that
argument; and for every class with a state, each string in a saved state
with a NUL put into it is refused when loaded.
"""

import pathlib
import sys

import pytest
import torch

tm = pytest.importorskip("torch_monitor")

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import test_law_round_trip as law  # noqa: E402  (the registry and its samples)

from torch_monitor import _C  # noqa: E402

NUL = "\0"


def with_nul(value):
    """Every way of putting a NUL into one string of ``value`` (a str, a
    path, or a list or dict of them), or [] when it holds no text."""
    if isinstance(value, pathlib.PurePath):
        value = str(value)
    if isinstance(value, str):
        return [value + NUL + "x"]
    if isinstance(value, (list, tuple)):
        out = []
        for i, item in enumerate(value):
            for bad in with_nul(item):
                copy = list(value)
                copy[i] = bad
                out.append(copy)
        return out
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            for k in with_nul(key):
                out.append({**{kk: vv for kk, vv in value.items() if kk != key}, k: item})
            for v in with_nul(item):
                out.append({**value, key: v})
        return out
    return []


def concrete(kwargs, tmp):
    return {k: (v(tmp) if callable(v) else v) for k, v in kwargs.items()}


def script_arguments(kwargs):
    """What TorchScript's constructor takes: paths as str, faces as they are."""
    return {k: str(v) if isinstance(v, pathlib.PurePath) else v for k, v in kwargs.items()}


@pytest.mark.parametrize("cls_name", [c for c in law.CLASSES if c in law.SAMPLES])
def test_every_text_argument_is_checked_by_the_constructor(cls_name, tmp_path):
    checked = 0
    for index, sample in enumerate(law.SAMPLES[cls_name]):
        kwargs = script_arguments(concrete(sample, tmp_path / str(index)))
        for name, value in kwargs.items():
            for bad in with_nul(value):
                with pytest.raises((ValueError, RuntimeError), match="NUL") as info:
                    obj = getattr(torch.classes.torch_monitor, cls_name)(**{**kwargs, name: bad})
                    law.close(obj)
                assert "NUL" in str(info.value)
                checked += 1
    if cls_name not in ("MemoryHandler",):
        assert checked, f"{cls_name}: no text argument was tried"


def strings_with_nul(state):
    """Every copy of ``state`` (nested tuples, lists, dicts) with a NUL put
    into one of its strings."""
    if isinstance(state, str):
        return [state + NUL + "x"]
    if isinstance(state, (tuple, list)):
        out = []
        for i, item in enumerate(state):
            for bad in strings_with_nul(item):
                copy = list(state)
                copy[i] = bad
                out.append(type(state)(copy))
        return out
    if isinstance(state, dict):
        out = []
        for key, item in state.items():
            for bad in strings_with_nul(key):
                out.append({**{k: v for k, v in state.items() if k != key}, bad: item})
            for bad in strings_with_nul(item):
                out.append({**state, key: bad})
        return out
    return []


@pytest.mark.parametrize("cls_name", [c for c in law.CLASSES if c not in law.NO_FACE])
def test_every_string_of_a_saved_state_is_checked_when_loaded(cls_name, tmp_path):
    for index, sample in enumerate(law.SAMPLES[cls_name]):
        obj = law.build(cls_name, sample, tmp_path / str(index))
        state = obj.__getstate__()
        law.close(obj)
        variants = strings_with_nul(state)
        assert variants, f"{cls_name}'s state holds no text"
        for bad in variants:
            with pytest.raises((ValueError, RuntimeError), match="NUL|not a|must name|unknown|no attribute"):
                loaded = _C._restore_script_object(cls_name, bad)
                law.close(loaded)


# Example calls of the methods with text arguments that the shared table of
# test_same_call_every_world.py lacks (Event has no face there).
EVENT_SETTERS = {
    "set_float": {"key": "k", "value": 1.5},
    "set_int": {"key": "k", "value": 2},
    "set_bool": {"key": "k", "value": True},
    "set_str": {"key": "k", "value": "v"},
}


@pytest.mark.parametrize("cls_name", [c for c in law.CLASSES if c in law.SAMPLES or c == "Event"])
def test_every_text_argument_of_a_method_is_refused_with_a_nul_by_the_method(cls_name, tmp_path):
    """Methods too (a TensorBoardWriter's tags went to the event file with a
    NUL or half a character from TorchScript): each str argument of each
    TorchScript method, called on the script object with a NUL in it, is a
    ValueError (a NUL, or a name none of a closed set has)."""
    import test_same_call_every_world as calls

    if cls_name == "Event":
        obj = torch.classes.torch_monitor.Event("law")
    else:
        obj = getattr(torch.classes.torch_monitor, cls_name)(
            **script_arguments(concrete(law.SAMPLES[cls_name][0], tmp_path)))
    try:
        for schema, _doc in _C._script_methods(cls_name):
            texts = [a.name for a in schema.arguments if str(a.type) == "str"]
            if not texts or schema.name.startswith("__"):
                continue
            table = {**calls.KWARGS, **EVENT_SETTERS}
            assert schema.name in table, f"{cls_name}.{schema.name} needs example arguments"
            for name in texts:
                with pytest.raises(ValueError):
                    getattr(obj, schema.name)(**{**table[schema.name], name: "a" + NUL + "b"})
    finally:
        law.close(obj)
