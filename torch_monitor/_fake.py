"""Fake classes for torch.compile and torch.export, derived from the C++ classes.

Imported when PyTorch 2 is first used (Dynamo's import, or torch asking for
an op's fake through ``set_python_module``), not by ``import torch_monitor``:
listing the schemas and registering the fakes costs tens of milliseconds.

PyTorch 2 traces a custom-class object through a "fake" stand-in built from
the object's ``__obj_flatten__`` (its configuration). Rather than write one
by hand per class, this module reads every ``torch.classes.torch_monitor``
class's method schemas and derives its fake: so a method added in C++ is
traceable at once, and a fake can never drift from its class. While tracing,
a fake method

* returns the configuration value of the same name for a getter
  (``stat.name()``, ``monitor.train_update()``),
* does nothing for a method that returns nothing (``add``, ``before``): the
  real call is recorded in the graph and runs when the graph runs,
* and otherwise raises, naming the method: its result (a dict, a string, a
  tensor of unknown shape) depends on state that exists only at run time,
  so read it outside the traced code.
"""

from typing import Any, Dict, Tuple

import torch

from . import _internals

__all__ = ["FakeObject", "FAKE_CLASSES"]


class FakeObject:
    """A torch_monitor object as seen by PyTorch 2 tracing: its configuration."""

    _class_name = "object"

    def __init__(self, config: Dict[str, Any]):
        self._config = config

    def __repr__(self) -> str:
        return f"Fake{self._class_name}({self._config})"

    def __getattr__(self, name: str) -> Any:
        # Dynamo reads every flattened key as an attribute of the fake
        # (looking for symbolic sizes in it); methods are found before this.
        try:
            return self.__dict__["_config"][name]
        except KeyError:
            raise AttributeError(
                f"Fake{self._class_name} has no attribute {name!r}"
            ) from None


def _unflatten(cls, flattened: Tuple[Tuple[str, Any], ...]) -> FakeObject:
    return cls(dict(flattened))


def _fake_method(class_name: str, schema):
    name = schema.name
    returns_nothing = [str(r.type) for r in schema.returns] in ([], ["NoneType"])

    def method(self, *args, **kwargs):
        if not args and not kwargs and name in self._config:
            return self._config[name]
        if returns_nothing:
            return None
        raise RuntimeError(
            f"torch_monitor.{class_name}.{name}() cannot be called inside code "
            "that torch.compile or torch.export traces: its result depends on "
            "what happens at run time. Call it outside the compiled or exported "
            "function (e.g. after the training step)."
        )

    method.__name__ = name
    method.__qualname__ = f"Fake{class_name}.{name}"
    return method


_NOT_FAKED = {"__init__", "__getstate__", "__setstate__", "__obj_flatten__"}


def _make_fake_class(class_name: str, schemas) -> type:
    methods = {
        schema.name: _fake_method(class_name, schema)
        for schema in schemas
        if schema.name not in _NOT_FAKED
    }
    methods["_class_name"] = class_name
    # register_fake_class looks for it in the class's own __dict__.
    methods["__obj_unflatten__"] = classmethod(_unflatten)
    return type(f"Fake{class_name}", (FakeObject,), methods)


_SCHEMAS = _internals.custom_class_schemas("torch_monitor") or {}  # None: see _internals

#: {class name: fake class} for every torch.classes.torch_monitor class.
FAKE_CLASSES = {name: _make_fake_class(name, schemas) for name, schemas in _SCHEMAS.items()}
for _name, _fake_class in FAKE_CLASSES.items():
    _internals.register_fake_class(f"torch_monitor::{_name}", _fake_class)
# Strict torch.export would otherwise fail on modules holding our objects
# (torch 2.11); torch_monitor/__init__.py keeps the real objects in.
_internals.keep_captured_objects_in_strict_export("torch_monitor")
# torch.export.save would otherwise Python-pickle them on torch 2.11.
_internals.skip_discarded_pickles_in_export_save("torch_monitor")


def _faces() -> tuple:
    """Every Python face class: the ones made from schemas and the
    hand-written monitor core."""
    from . import _C, _spellings

    return tuple(
        cls for module in (_C, _spellings) for cls in vars(module).values()
        if isinstance(cls, type) and "_script_class" in vars(cls)
    )


# Graph calls of the faces' methods are routed to their TorchScript methods.
_internals.run_torchbind_methods_on(_faces())


def _returns_nothing_fake(*args, **kwargs):
    # register_fake also makes this the kernel for meta tensors of these ops
    # (of which only log_event_values takes tensors): a real one (not a
    # tracer's FakeTensor) holds no value to log, and would otherwise be
    # logged as nothing, silently.
    for position, arg in enumerate(args):
        for index, value in enumerate(arg if isinstance(arg, (list, tuple)) else (arg,)):
            # A tracer's tensors are subclasses (FakeTensor, FunctionalTensor).
            if type(value) in (torch.Tensor, torch.nn.Parameter) and value.is_meta:
                key = args[1][index] if position == 2 and isinstance(args[1], list) else index
                raise ValueError(
                    f"log_event: the value of {key!r} is a tensor on the meta device, which "
                    "holds no value to log; log the tensor computed on a real device"
                )
    return None


def _untraceable(op: str, known: str, tail: str = ""):
    """The fake of an op whose result is known only when the graph runs."""

    def fake(*args, **kwargs):
        raise RuntimeError(
            f"torch.ops.torch_monitor.{op}() cannot be called inside code that "
            f"torch.compile or torch.export traces: {known} is known only "
            "when the graph runs. Read it outside the compiled or exported "
            f"function{tail}."
        )

    return fake


#: Ops whose result PyTorch 2 cannot know while tracing: their fakes raise,
#: naming the op, rather than fail somewhere inside the tracer.
_UNTRACEABLE_OPS = {
    "torch_monitor::get_step": _untraceable(
        "get_step", "the training step", " (setting it, with set_step, is traceable)"),
    "torch_monitor::live_stat_names": _untraceable("live_stat_names", "which Stats are alive"),
}

# The other ops (log_event(Event), log_event_values, the op of
# log_event(name, data), see _events; set_step, see _spellings) return nothing:
# their fakes do nothing, and each runs as an ordered side effect, so
# compiled and exported graphs keep it, in order. Derived from the schemas
# like the classes' fakes; the C++ definition names this module
# (m.set_python_module).
for _schema in _internals.library_op_schemas("torch_monitor") or ():
    if _schema.is_mutable:
        # watch_observe_: it mutates its slots argument, which keeps it in
        # graphs and orders it there, and its C++ Meta kernel is its fake.
        continue
    if _schema.name in _UNTRACEABLE_OPS:
        torch.library.register_fake(_schema.name)(_UNTRACEABLE_OPS[_schema.name])
        continue
    if [str(r.type) for r in _schema.returns]:
        raise AssertionError(f"{_schema}: an op that returns something needs a real fake")
    torch.library.register_fake(_schema.name)(_returns_nothing_fake)
    _internals.mark_ordered_effect(_schema.name)
