"""Reducers written in Python: what a subclass of ``torch_monitor.FoldReducer``
overrides decides how the C++ monitors reach its code.

* ``fold`` / ``interpolate``: the C++ history calls them (``install_fold``),
  the rest (history, ``view``) stays in C++.
* ``forward`` overridden, or forward hooks on the reducer: monitors call the
  reducer as a module (``needs_python_call``), as inferno does.

Built-in reducers override nothing and keep the direct C++ path. Neither
kind can be saved by TorchScript or torch.export (their code is not state):
saving raises, never drops the Python code silently.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, List, Optional, Tuple

from torch import Tensor

from . import _C, _internals

# Where the reducers' own definitions live: anything defined elsewhere is the
# user's.
_LIBRARY_MODULE = "torch_monitor.reducers"

# Fields of a reducer state tuple (ScriptReducer::State): version and kind,
# then the configuration (step_time, duration, inclusive, inplace,
# parameters, criterion, threshold), then the history.
_CONFIG = slice(2, 9)


def overrides(cls: type, name: str) -> bool:
    """Whether ``cls`` (or a base outside torch_monitor) defines ``name``."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass.__module__ != _LIBRARY_MODULE
    return False


def _method_of(reducer: Any, name: str) -> Callable:
    """``type(reducer).<name>`` bound through a weak reference: the C++
    reducer must not keep its Python owner alive (a cycle Python's garbage
    collector cannot see through C++)."""
    function = getattr(type(reducer), name)
    owner = weakref.ref(reducer)
    label = f"{type(reducer).__qualname__}.{name}"

    def call(*args: Any) -> Any:
        self = owner()
        if self is None:
            raise RuntimeError(
                f"{label}: the Python reducer was garbage collected while its "
                "C++ history was still in use; keep a reference to the reducer"
            )
        return function(self, *args)

    return call


def install_fold(reducer: Any) -> None:
    """Makes the C++ history of ``reducer`` fold and interpolate with its
    Python methods, those it defines (a subclass of a built-in reducer may
    define interpolate only)."""
    fold_inputs: Optional[Callable] = None  # None: the kind's
    if overrides(type(reducer), "fold"):
        fold = _method_of(reducer, "fold")

        def python_fold(inputs: List[Tensor], state: Optional[Tensor]) -> Tensor:
            return fold(*inputs, state)

        fold_inputs = python_fold

    interpolate = (
        _method_of(reducer, "interpolate")
        if overrides(type(reducer), "interpolate")
        else None
    )
    _C._set_python_fold(reducer.script_reducer, fold_inputs, interpolate, type(reducer).__qualname__)


def needs_python_call(reducer: Any) -> bool:
    """Whether monitors must call ``reducer`` as a module: its ``forward`` is
    overridden, or forward hooks (its own or global ones) would run."""
    return overrides(type(reducer), "forward") or _internals.forward_hooks_would_run(reducer)


def history_only(saved: Tuple, current: Tuple) -> Tuple:
    """A reducer state with the history of ``saved`` and the configuration of
    ``current``: what ``load_state_dict`` restores (as inferno does)."""
    return saved[:_CONFIG.start] + current[_CONFIG] + saved[_CONFIG.stop:]
