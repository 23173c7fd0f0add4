"""The Python reducer classes derived from the C++ table of reducer kinds.

``_C._reducer_kinds()`` is ``reducerKindTable()`` (csrc/.../reducers/kinds.h)
as plain data. From an entry, ``derive(cls)`` gives a class of
torch_monitor.reducers its constructor (inferno's signature: the step time,
the kind's parameters in the table's order with its defaults, the criterion
where the kind takes one, then duration, inclusive and inplace) and one
property per parameter. A class overrides only where inferno's interface
differs from the table (see FoldReducer's ``_criterion_first``,
``_keyword_only_timing``, ``_defaults`` and ``_to_table``).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Dict, Optional, Union

from torch import Tensor

from . import _C

#: Every kind by name, in the table's order.
KINDS: Dict[str, dict] = {kind["name"]: kind for kind in _C._reducer_kinds()}

# What the parameters mean, for the generated properties' docstrings.
_DOCS = {
    "initial": "The value before the first event (inf, 0 or nan).",
    "alpha": "Weight of each new observation.",
    "time_constant": "Time constant of the exponential decay (> 0).",
    "amplitude": "Value a match sets (nearest) or adds (cumulative).",
    "target": "Observations equal to it (within ``tolerance``) are matches.",
    "tolerance": "Largest absolute difference from ``target`` that still "
    "matches; None for exact equality.",
    "scale": "Factor of the observation in what a match contributes, "
    "``scale * x + amplitude``.",
}

# Annotations of inferno's constructors where they are not float.
_TYPES = {
    "initial": str,  # inferno's "inf", "zero" or "nan"
    "amplitude": Union[int, float],
    "target": Union[int, float, bool],
    "tolerance": Optional[Union[int, float]],
    "scale": Union[int, float],
}


def kind_of(cls: type) -> dict:
    try:
        return KINDS[cls._kind]
    except KeyError:
        raise ValueError(
            f"{cls.__name__}._kind is {cls._kind!r}, not a reducer kind; the "
            f"kinds are {', '.join(KINDS)}"
        ) from None


def _param_property(spec: dict) -> property:
    name = spec["name"]
    doc = _DOCS.get(name, f"The parameter {name} ({spec['check']}).")

    def get(self) -> Any:
        # An unset optional parameter is absent from params().
        return self.script_reducer.params().get(name)

    def set_(self, value: Any) -> None:
        value = math.nan if value is None and spec["unsettable"] else value
        self.script_reducer.set_param(name, float(value))

    # Read back as the table stores it: a float (None when an optional
    # parameter is unset).
    get.__annotations__["return"] = Optional[float] if spec["unsettable"] else float
    return property(get, None if spec["fixed"] else set_, doc=doc)


def _signature(cls: type, kind: dict) -> inspect.Signature:
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [
        inspect.Parameter("self", positional),
        inspect.Parameter("step_time", positional, annotation=float),
    ]
    criterion = inspect.Parameter(
        "criterion", positional, annotation=Callable[[Tensor], Tensor]
    )
    if kind["takes_criterion"] and cls._criterion_first:
        params.append(criterion)
    for spec in kind["params"]:
        name = spec["name"]
        default = inspect.Parameter.empty if spec["required"] else spec["default"]
        params.append(
            inspect.Parameter(
                name,
                positional,
                default=cls._defaults.get(name, default),
                annotation=_TYPES.get(name, float),
            )
        )
    if kind["takes_criterion"] and not cls._criterion_first:
        params.append(criterion)
    timing = (
        inspect.Parameter.KEYWORD_ONLY if cls._keyword_only_timing else positional
    )
    for name, default, annotation in (
        ("duration", 0.0, float),
        ("inclusive", False, bool),
        ("inplace", False, bool),
    ):
        params.append(inspect.Parameter(name, timing, default=default, annotation=annotation))
    return inspect.Signature(params)


def _constructor(cls: type, kind: dict, base_init: Callable) -> Callable:
    signature = _signature(cls, kind)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        params = {
            spec["name"]: self._to_table(spec["name"], given[spec["name"]])
            for spec in kind["params"]
            if not (spec["unsettable"] and given[spec["name"]] is None)
        }
        base_init(
            self,
            given["step_time"],
            given["duration"],
            given["inclusive"],
            given["inplace"],
            params,
            given.get("criterion"),
        )

    __init__.__signature__ = signature
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    __init__.__doc__ = f"Builds a {kind['name']}; see the class docstring."
    return __init__


# What every reducer's constructor arguments beyond the parameters mean.
_ARGUMENT_DOCS = {
    "step_time": "time between two observations.",
    "criterion": "tensor -> bool tensor of the matches: a callable, or a "
    ":class:`Criterion` / built-in name (those can be saved).",
    "duration": "time over which states are kept. Defaults to 0.",
    "inclusive": "keep one more state, so that ``duration`` can be viewed. Defaults to False.",
    "inplace": "write the history in place. Defaults to False.",
}


def _arguments_doc(signature: inspect.Signature) -> str:
    """The "Args:" section of a reducer's docstring, from its signature."""
    # Indented as the class docstrings' own lines (inspect.getdoc strips it).
    lines = ["", "    Args:"]
    for name, parameter in list(signature.parameters.items())[1:]:
        doc = _ARGUMENT_DOCS.get(name) or _DOCS.get(name, "")
        if parameter.default is not inspect.Parameter.empty and name not in _ARGUMENT_DOCS:
            doc += f" Defaults to {parameter.default!r}."
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            doc += " Keyword-only."
        lines.append(f"        {name}: {doc[0].lower() + doc[1:] if doc else ''}")
    return "\n".join(lines)


def derive(cls: type, base_init: Callable) -> None:
    """Gives `cls` (which sets ``_kind`` in its body) the table's constructor,
    unless it defines its own, a property per parameter it lacks, and the
    "Args:" of its docstring (which says what the state is)."""
    kind = kind_of(cls)
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + _arguments_doc(_signature(cls, kind))
    for spec in kind["params"]:
        if not hasattr(cls, spec["name"]):
            setattr(cls, spec["name"], _param_property(spec))
    if "__init__" not in vars(cls):
        cls.__init__ = _constructor(cls, kind, base_init)
