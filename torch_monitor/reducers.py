"""Reducers: tensor histories fed by monitors (inferno-compatible).

Each class has the name, constructor and behaviour of the inferno (0.0.5)
reducer of the same name, but its state lives in a C++ reducer: the
``script_reducer`` attribute, a ``torch.classes.torch_monitor.Reducer``. That
object is what monitors feed, what TorchScript code calls, and what
``torch.jit.save`` pickles.

Differences from inferno: setting ``duration`` changes the duration (inferno
overwrote the step time); a grown history is padded with the fill value
(inferno used zeros); ``forward`` takes ``(obs)`` or ``(obs, cond)`` rather
than ``*inputs`` so that a module holding a reducer can be scripted; view()
returns the history's dtype whatever the dtype of the times.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from . import _C
from ._checks import strict_bool

__all__ = [
    "Criterion",
    "FoldReducer",
    "PassthroughReducer",
    "EventReducer",
    "EMAReducer",
    "CAReducer",
    "NearestTraceReducer",
    "CumulativeTraceReducer",
    "ScaledNearestTraceReducer",
    "ScaledCumulativeTraceReducer",
    "ConditionalNearestTraceReducer",
    "ConditionalCumulativeTraceReducer",
]

_COMPARISONS = {
    "eq": torch.eq,
    "ne": torch.ne,
    "gt": torch.gt,
    "ge": torch.ge,
    "lt": torch.lt,
    "le": torch.le,
}


class Criterion:
    """A built-in criterion: ``x <name> threshold`` element-wise.

    ``name`` is one of ``eq``, ``ne``, ``gt``, ``ge``, ``lt``, ``le`` (compared
    with ``threshold``) or ``nonzero`` (``x != 0``). Unlike an arbitrary
    callable, a reducer using one can be saved (TorchScript, pickling) and is
    evaluated without calling back into Python. Instances are also plain
    callables, ``Criterion("gt", 0.5)(x)``.
    """

    NAMES = tuple(_COMPARISONS) + ("nonzero",)

    def __init__(self, name: str, threshold: float = 0.0):
        if name not in self.NAMES:
            raise ValueError(
                f"unknown criterion {name!r}; the built-in criteria are "
                f"{', '.join(self.NAMES)}"
            )
        self.name = name
        self.threshold = 0.0 if name == "nonzero" else float(threshold)

    def __call__(self, x: Tensor) -> Tensor:
        if self.name == "nonzero":
            return x if x.dtype == torch.bool else x != 0
        return _COMPARISONS[self.name](x, self.threshold)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Criterion)
            and other.name == self.name
            and other.threshold == self.threshold
        )

    def __hash__(self) -> int:
        return hash((self.name, self.threshold))

    def __repr__(self) -> str:
        if self.name == "nonzero":
            return "Criterion('nonzero')"
        return f"Criterion({self.name!r}, {self.threshold!r})"


def _criterion_parts(criterion: Any) -> Tuple[str, float, Optional[Callable]]:
    """(built-in name, threshold, Python callable or None) of a criterion."""
    if isinstance(criterion, str):
        criterion = Criterion(criterion)
    if isinstance(criterion, Criterion):
        return criterion.name, criterion.threshold, None
    if callable(criterion):
        # A stand-in until the callable replaces it (the C++ constructor
        # needs some criterion).
        return "nonzero", 0.0, criterion
    raise TypeError(
        "criterion must be a callable (tensor -> bool tensor), a "
        f"torch_monitor.Criterion or a built-in name, got {type(criterion).__name__}"
    )


class FoldReducer(nn.Module):
    """Base of the reducers: a fold over the inputs, recorded in a history.

    Subclasses set ``_kind`` (the C++ reducer kind, the inferno class name).
    The state is in ``script_reducer`` (a ``torch.classes.torch_monitor.Reducer``);
    ``.to()``/``.cuda()``/``.double()`` move or cast its history, and
    ``state_dict()`` carries it (as the module's extra state).

    Scripting a module that holds a reducer compiles ``forward``, ``peek``,
    ``dump`` and ``view``; other methods are reachable through
    ``script_reducer`` in scripted code.
    """

    _kind = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # TorchScript would try to compile every property otherwise.
        cls.__jit_unused_properties__ = sorted(
            {
                name
                for klass in cls.__mro__
                for name, value in vars(klass).items()
                if isinstance(value, property)
            }
        )

    def __init__(
        self,
        step_time: float,
        duration: float,
        inclusive: bool,
        inplace: bool,
        params: dict,
        criterion: Any = None,
    ):
        nn.Module.__init__(self)
        self._criterion = criterion
        self._build(
            float(step_time),
            float(duration),
            strict_bool(inclusive, "inclusive"),
            strict_bool(inplace, "inplace"),
            {k: float(v) for k, v in params.items()},
        )
        # Like a new inferno reducer, whose empty history follows the default
        # dtype.
        if torch.get_default_dtype() != torch.float32:
            self.script_reducer.to(None, torch.get_default_dtype())

    def _build(
        self,
        step_time: float,
        duration: float,
        inclusive: bool,
        inplace: bool,
        params: dict,
    ) -> None:
        name, threshold, fn = ("", 0.0, None)
        if self._criterion is not None:
            name, threshold, fn = _criterion_parts(self._criterion)
        self.script_reducer = torch.classes.torch_monitor.Reducer(
            self._kind, step_time, duration, inclusive, inplace, params, name, threshold
        )
        self._handle = _C._ReducerHandle(self.script_reducer)
        if fn is not None:
            self._handle.set_python_criterion(fn)

    # -- the reducer interface -------------------------------------------

    def forward(self, obs: Tensor, cond: Optional[Tensor] = None) -> None:
        """Folds one step's observation (and condition, for the conditional
        traces) into a new state and records it."""
        if torch.jit.is_scripting():
            if cond is None:
                self.script_reducer.forward([obs])
            else:
                self.script_reducer.forward([obs, cond])
        else:
            if cond is None:
                self._handle.forward(obs)
            else:
                self._handle.forward(obs, cond)

    @torch.jit.export
    def peek(self) -> Optional[Tensor]:
        """The newest state, ``None`` before the first step."""
        if torch.jit.is_scripting():
            return self.script_reducer.peek()
        return self._handle.peek()

    @torch.jit.export
    def dump(self) -> Optional[Tensor]:
        """All recorded states along dim 0, newest first (rows never written
        hold the fill value); ``None`` before the first step."""
        if torch.jit.is_scripting():
            return self.script_reducer.dump()
        return self._handle.dump()

    @torch.jit.export
    def view(
        self, time: Union[float, int, Tensor], tolerance: float = 1e-7
    ) -> Optional[Tensor]:
        """The state ``time`` before the newest one, interpolated between
        recorded states; ``None`` before the first step.

        ``time`` is a float (one time for every element) or a tensor with the
        state's dimensions (one time per element) or one more (several times
        per element, along the last dimension). Times within ``tolerance`` of
        a step read that step exactly. ValueError outside
        ``[0, dt * (N - 1)]`` (widened by the tolerance).
        """
        if torch.jit.is_scripting():
            return self.script_reducer.view(time, tolerance)
        return self._handle.view(time, float(tolerance))

    def clear(self, keepshape: bool = False, **kwargs: Any) -> None:
        """Back to the initial state; ``keepshape`` keeps the history
        allocated (and its shape), refilled with the fill value."""
        self.script_reducer.clear(strict_bool(keepshape, "keepshape"))

    @property
    def latest(self) -> Optional[Tensor]:
        """The newest state (``peek()``)."""
        return self._handle.peek()

    # -- time and history ------------------------------------------------

    @property
    def dt(self) -> float:
        """Time between two recorded states; setting it resizes the history
        when its length changes (keeping the newest states)."""
        return self.script_reducer.step_time()

    @dt.setter
    def dt(self, value: float) -> None:
        self.script_reducer.set_step_time(float(value))

    @property
    def step_time(self) -> float:
        """Alias of ``dt``."""
        return self.dt

    @step_time.setter
    def step_time(self, value: float) -> None:
        self.dt = value

    @property
    def duration(self) -> float:
        """Time the history covers; setting it resizes the history when its
        length changes (keeping the newest states, padding with the fill
        value on the oldest side)."""
        return self.script_reducer.duration()

    @duration.setter
    def duration(self, value: float) -> None:
        self.script_reducer.set_duration(float(value))

    @property
    def inclusive(self) -> bool:
        """Whether the history holds one more state, so that ``duration``
        itself can be viewed."""
        return self.script_reducer.inclusive()

    @inclusive.setter
    def inclusive(self, value: bool) -> None:
        self.script_reducer.set_inclusive(strict_bool(value, "inclusive"))

    @property
    def inplace(self) -> bool:
        """Whether states are written into the history in place (without
        autograd) rather than out of place."""
        return self.script_reducer.inplace()

    @inplace.setter
    def inplace(self, value: bool) -> None:
        self.script_reducer.set_inplace(strict_bool(value, "inplace"))

    @property
    def recordsz(self) -> int:
        """Number of states kept, max(ceil(duration / dt) + inclusive, 1)."""
        return self.script_reducer.history_size()

    @property
    def data(self) -> Tensor:
        """The history tensor in storage order (not time order; see
        ``dump()``). Assigning a tensor of the same shape changes its dtype or
        device."""
        return self.script_reducer.storage()

    @data.setter
    def data(self, value: Tensor) -> None:
        self.script_reducer.set_storage(value)

    # -- nn.Module integration -------------------------------------------

    def _apply(self, fn, recurse=True):
        # .to(), .cuda(), .double(), ... : the history is not a buffer (its
        # shape is unknown until the first step), so apply fn to it here.
        super()._apply(fn, recurse)
        storage = self.script_reducer.storage()
        applied = fn(storage)
        if applied is not storage:
            self.script_reducer.set_storage(applied)
        return self

    def get_extra_state(self) -> Any:
        return self.script_reducer.state()

    def set_extra_state(self, state: Any) -> None:
        self.script_reducer.load_state(tuple(state))

    def __getstate__(self) -> dict:
        # pickle / copy.deepcopy: a torch.ScriptObject cannot be pickled by
        # Python, so carry its state and rebuild it.
        state = self.__dict__.copy()
        state["script_reducer"] = self.script_reducer.state()
        state.pop("_handle", None)
        return state

    def __setstate__(self, state: dict) -> None:
        saved = state.pop("script_reducer")
        super().__setstate__(state)
        _, kind, step_time, duration, inclusive, inplace, params = saved[:7]
        self._build(step_time, duration, inclusive, inplace, dict(params))
        self.script_reducer.load_state(tuple(saved))

    def extra_repr(self) -> str:
        parts = [f"step_time={self.dt}", f"duration={self.duration}"]
        if self.inclusive:
            parts.append("inclusive=True")
        if self.inplace:
            parts.append("inplace=True")
        for name, value in sorted(self.script_reducer.params().items()):
            parts.append(f"{name}={value}")
        if self._criterion is not None:
            parts.append(f"criterion={self._criterion!r}")
        return ", ".join(parts)

    # -- parameters --------------------------------------------------------

    def _param(self, name: str) -> float:
        return self.script_reducer.params()[name]

    def _set_param(self, name: str, value: float) -> None:
        self.script_reducer.set_param(name, float(value))

    @property
    def criterion(self) -> Any:
        """The criterion as given (a callable, a Criterion or a name); None
        for reducers without one. Assignable."""
        return self._criterion

    @criterion.setter
    def criterion(self, value: Any) -> None:
        if not self.script_reducer.criterion():
            raise AttributeError(f"{type(self).__name__} takes no criterion")
        name, threshold, fn = _criterion_parts(value)
        if fn is None:
            self._handle.set_builtin_criterion(name, threshold)
        else:
            self._handle.set_python_criterion(fn)
        self._criterion = value


class PassthroughReducer(FoldReducer):
    """Records the observations themselves (interpolation: the older one).

    Args:
        step_time: time between observations.
        duration: time over which observations are kept. Defaults to 0.
        inclusive: keep one more observation, so that ``duration`` can be
            viewed. Defaults to False.
        inplace: write the history in place. Defaults to False.
    """

    _kind = "PassthroughReducer"

    def __init__(
        self,
        step_time: float,
        duration: float = 0.0,
        inclusive: bool = False,
        inplace: bool = False,
    ):
        FoldReducer.__init__(self, step_time, duration, inclusive, inplace, {})


class EventReducer(FoldReducer):
    """Records, per element, the time since ``criterion`` last matched.

    0 where the criterion matches, else the previous value + ``step_time``;
    ``initial`` (``"inf"``, ``"zero"`` or ``"nan"``) before the first match.

    Args:
        step_time: time between observations.
        criterion: tensor -> bool tensor; a callable, or a
            :class:`Criterion` / built-in name (those can be saved).
        initial: value before the first event. Defaults to ``"inf"``.
        duration, inclusive, inplace: as for :class:`PassthroughReducer`.
    """

    _kind = "EventReducer"

    def __init__(
        self,
        step_time: float,
        criterion: Callable[[Tensor], Tensor],
        initial: str = "inf",
        duration: float = 0.0,
        inclusive: bool = False,
        inplace: bool = False,
    ):
        if not isinstance(initial, str) or initial.lower() not in ("inf", "zero", "nan"):
            raise ValueError(
                f"initial must be 'inf', 'zero' or 'nan', got {initial!r}"
            )
        value = 0.0 if initial.lower() == "zero" else float(initial)
        FoldReducer.__init__(
            self, step_time, duration, inclusive, inplace, {"initial": value}, criterion
        )

    @property
    def initial(self) -> float:
        """The value before the first event (inf, 0 or nan)."""
        return self._param("initial")


class EMAReducer(FoldReducer):
    """Exponential moving average: ``s = alpha * x + (1 - alpha) * s``
    (``s = x`` at the first step); linear interpolation.

    Args:
        step_time: time between observations.
        alpha: weight of each new observation, in [0, 1].
        duration, inclusive, inplace: as for :class:`PassthroughReducer`.
    """

    _kind = "EMAReducer"

    def __init__(
        self,
        step_time: float,
        alpha: float,
        duration: float = 0.0,
        inclusive: bool = False,
        inplace: bool = False,
    ):
        FoldReducer.__init__(
            self, step_time, duration, inclusive, inplace, {"alpha": alpha}
        )

    @property
    def alpha(self) -> float:
        """Weight of each new observation."""
        return self._param("alpha")

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._set_param("alpha", value)


class CAReducer(FoldReducer):
    """Cumulative average of every observation since the last ``clear()``;
    linear interpolation.

    Args:
        step_time: time between observations.
        duration, inclusive, inplace: as for :class:`PassthroughReducer`.
    """

    _kind = "CAReducer"

    def __init__(
        self,
        step_time: float,
        duration: float = 0.0,
        inclusive: bool = False,
        inplace: bool = False,
    ):
        FoldReducer.__init__(self, step_time, duration, inclusive, inplace, {})


class _TraceMixin:
    """Parameters shared by the trace reducers."""

    @property
    def time_constant(self) -> float:
        """Time constant of the exponential decay (> 0)."""
        return self._param("time_constant")

    @time_constant.setter
    def time_constant(self, value: float) -> None:
        self._set_param("time_constant", value)

    @property
    def decay(self) -> float:
        """Decay per step, exp(-dt / time_constant)."""
        return math.exp(-self.dt / self.time_constant)

    @property
    def amplitude(self) -> float:
        """Value a match sets (nearest) or adds (cumulative)."""
        return self._param("amplitude")

    @amplitude.setter
    def amplitude(self, value: float) -> None:
        self._set_param("amplitude", value)


class _TargetTraceMixin(_TraceMixin):
    @property
    def target(self) -> float:
        """Observations equal to it (within ``tolerance``) are matches."""
        return self._param("target")

    @target.setter
    def target(self, value: float) -> None:
        self._set_param("target", value)

    @property
    def tolerance(self) -> Optional[float]:
        """Largest absolute difference from ``target`` that still matches;
        None for exact equality."""
        return self.script_reducer.params().get("tolerance")

    @tolerance.setter
    def tolerance(self, value: Optional[float]) -> None:
        self._set_param("tolerance", math.nan if value is None else value)


class _ScaledTraceMixin(_TraceMixin):
    @property
    def scale(self) -> float:
        """Factor of the observation in what a match contributes,
        ``scale * x + amplitude``."""
        return self._param("scale")

    @scale.setter
    def scale(self, value: float) -> None:
        self._set_param("scale", value)


class NearestTraceReducer(_TargetTraceMixin, FoldReducer):
    """Trace of the latest match: ``amplitude`` where the observation equals
    ``target`` (within ``tolerance``), else the previous value decayed by
    exp(-dt / time_constant).

    Args:
        step_time: time between observations.
        time_constant: time constant of the decay (> 0).
        amplitude: value of a match (non-zero).
        target: value that counts as a match.
        tolerance: largest absolute difference that still matches (> 0), or
            None for equality. Defaults to None.
        duration, inclusive, inplace: keyword-only, as for
            :class:`PassthroughReducer`.
    """

    _kind = "NearestTraceReducer"

    def __init__(
        self,
        step_time: float,
        time_constant: float,
        amplitude: Union[int, float],
        target: Union[int, float, bool],
        tolerance: Optional[Union[int, float]] = None,
        *,
        duration: float = 0.0,
        inclusive: bool = False,
        inplace: bool = False,
    ):
        params = {"time_constant": time_constant, "amplitude": amplitude, "target": target}
        if tolerance is not None:
            params["tolerance"] = tolerance
        FoldReducer.__init__(self, step_time, duration, inclusive, inplace, params)


class CumulativeTraceReducer(_TargetTraceMixin, FoldReducer):
    """Trace of all matches: the previous value decayed by
    exp(-dt / time_constant), plus ``amplitude`` where the observation equals
    ``target`` (within ``tolerance``).

    Args: as for :class:`NearestTraceReducer`.
    """

    _kind = "CumulativeTraceReducer"

    def __init__(
        self,
        step_time: float,
        time_constant: float,
        amplitude: Union[int, float],
        target: Union[int, float, bool],
        tolerance: Optional[Union[int, float]] = None,
        *,
        duration: float = 0.0,
        inclusive: bool = False,
        inplace: bool = False,
    ):
        params = {"time_constant": time_constant, "amplitude": amplitude, "target": target}
        if tolerance is not None:
            params["tolerance"] = tolerance
        FoldReducer.__init__(self, step_time, duration, inclusive, inplace, params)


class ScaledNearestTraceReducer(_ScaledTraceMixin, FoldReducer):
    """Trace of the latest match, scaled by the input: ``scale * x +
    amplitude`` where ``criterion(x)``, else the previous value decayed.

    Args:
        step_time: time between observations.
        time_constant: time constant of the decay (> 0).
        amplitude: constant part of a match's value.
        scale: factor of the observation in a match's value.
        criterion: tensor -> bool tensor; a callable, or a
            :class:`Criterion` / built-in name (those can be saved).
        duration, inclusive, inplace: keyword-only, as for
            :class:`PassthroughReducer`.
    """

    _kind = "ScaledNearestTraceReducer"

    def __init__(
        self,
        step_time: float,
        time_constant: float,
        amplitude: Union[int, float],
        scale: Union[int, float],
        criterion: Callable[[Tensor], Tensor],
        *,
        duration: float = 0.0,
        inclusive: bool = False,
        inplace: bool = False,
    ):
        params = {"time_constant": time_constant, "amplitude": amplitude, "scale": scale}
        FoldReducer.__init__(
            self, step_time, duration, inclusive, inplace, params, criterion
        )


class ScaledCumulativeTraceReducer(_ScaledTraceMixin, FoldReducer):
    """Trace of all matches, scaled by the input: the previous value decayed,
    plus ``scale * x + amplitude`` where ``criterion(x)``.

    Args: as for :class:`ScaledNearestTraceReducer`.
    """

    _kind = "ScaledCumulativeTraceReducer"

    def __init__(
        self,
        step_time: float,
        time_constant: float,
        amplitude: Union[int, float],
        scale: Union[int, float],
        criterion: Callable[[Tensor], Tensor],
        *,
        duration: float = 0.0,
        inclusive: bool = False,
        inplace: bool = False,
    ):
        params = {"time_constant": time_constant, "amplitude": amplitude, "scale": scale}
        FoldReducer.__init__(
            self, step_time, duration, inclusive, inplace, params, criterion
        )


class ConditionalNearestTraceReducer(_ScaledTraceMixin, FoldReducer):
    """Like :class:`ScaledNearestTraceReducer`, the matches being a second
    input: ``reducer(x, cond)`` (cond: bool, or nonzero elements).

    Args:
        step_time, time_constant, amplitude, scale: as for
            :class:`ScaledNearestTraceReducer`.
        duration, inclusive, inplace: keyword-only, as for
            :class:`PassthroughReducer`.
    """

    _kind = "ConditionalNearestTraceReducer"

    def __init__(
        self,
        step_time: float,
        time_constant: float,
        amplitude: Union[int, float],
        scale: Union[int, float],
        *,
        duration: float = 0.0,
        inclusive: bool = False,
        inplace: bool = False,
    ):
        params = {"time_constant": time_constant, "amplitude": amplitude, "scale": scale}
        FoldReducer.__init__(self, step_time, duration, inclusive, inplace, params)


class ConditionalCumulativeTraceReducer(_ScaledTraceMixin, FoldReducer):
    """Like :class:`ScaledCumulativeTraceReducer`, the matches being a second
    input: ``reducer(x, cond)``.

    Args: as for :class:`ConditionalNearestTraceReducer`.
    """

    _kind = "ConditionalCumulativeTraceReducer"

    def __init__(
        self,
        step_time: float,
        time_constant: float,
        amplitude: Union[int, float],
        scale: Union[int, float],
        *,
        duration: float = 0.0,
        inclusive: bool = False,
        inplace: bool = False,
    ):
        params = {"time_constant": time_constant, "amplitude": amplitude, "scale": scale}
        FoldReducer.__init__(self, step_time, duration, inclusive, inplace, params)
