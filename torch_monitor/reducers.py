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
import warnings
import weakref
from typing import Any, Callable, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from . import _C, _faces, _reducer_table, _spellings
from . import _custom_reducers as _custom
from ._faces import strict_bool
from ._custom_reducers import overrides as _overrides

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

# The C++ kind under a reducer written in Python: its fold replaces this
# kind's (which keeps the observation), the history and view() stay.
_CUSTOM_BASE_KIND = "PassthroughReducer"

#: view()'s default tolerance: the C++ one (kViewTolerance), read from the
#: TorchScript schema of Reducer.view.
VIEW_TOLERANCE: float = next(
    argument.default_value
    for schema, _ in _C._script_methods("Reducer")
    if schema.name == "view"
    for argument in schema.arguments
    if argument.name == "tolerance"
)

# The reducer module that owns each Reducer object a monitor may feed (its
# script_reducer): what a monitor's
# copy or pickle takes along (_spellings._reducer_given). Faces hash by the
# C++ object, so any face of it finds the owner.
_OWNERS: "weakref.WeakValueDictionary[Any, FoldReducer]" = weakref.WeakValueDictionary()


def owner_of(reducer: Any) -> Optional["FoldReducer"]:
    """The torch_monitor reducer whose Reducer object ``reducer`` is, if any
    (a reducer called in Python holds its module itself)."""
    return _OWNERS.get(reducer) or _C._python_reducer_module(reducer)


class Criterion:
    """A built-in criterion: ``x <name> threshold`` element-wise.

    ``name`` is one of ``eq``, ``ne``, ``gt``, ``ge``, ``lt``, ``le`` (compared
    with ``threshold``) or ``nonzero`` (``x != 0``). Unlike an arbitrary
    callable, a reducer using one can be saved (TorchScript, pickling) and is
    evaluated without calling back into Python. Instances are also plain
    callables, ``Criterion("gt", 0.5)(x)``.
    """

    NAMES = tuple(_C._criterion_names())  # the C++ criterion's, as its evaluation

    def __init__(self, name: str, threshold: float = 0.0):
        if name not in self.NAMES:
            raise ValueError(
                f"unknown criterion {name!r}; the built-in criteria are "
                f"{', '.join(self.NAMES)}"
            )
        self.name = name
        self.threshold = 0.0 if name == "nonzero" else float(threshold)

    def __call__(self, x: Tensor) -> Tensor:
        return _C._apply_criterion(self.name, self.threshold, x)

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

    Subclasses set ``_kind`` (the C++ reducer kind, the inferno class name);
    their constructor and parameter properties then come from the C++ table
    of kinds (see ``_reducer_table``), unless they define their own.
    The state is in ``script_reducer`` (a ``torch.classes.torch_monitor.Reducer``);
    ``.to()``/``.cuda()``/``.double()`` move or cast its history, and
    ``state_dict()`` carries it (as the module's extra state).

    Scripting a module that holds a reducer compiles ``forward``, ``peek``,
    ``dump`` and ``view``; other methods are reachable through
    ``script_reducer`` in scripted code.
    """

    _kind = ""
    # Where inferno's constructor differs from the table's order: the
    # criterion before the parameters (EventReducer); duration, inclusive and
    # inplace keyword-only (the traces); defaults in another spelling.
    _criterion_first = False
    _keyword_only_timing = False
    _defaults: dict = {}

    @classmethod
    def _to_table(cls, name: str, value: Any) -> float:
        """A constructor argument as the table's number."""
        return float(value)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_kind" in vars(cls):
            _reducer_table.derive(cls, FoldReducer._init_kind)
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
        duration: float = 0.0,
        inclusive: bool = False,
        inplace: bool = False,
        fill: Any = 0,
    ):
        """For reducers written in Python (inferno's ``FoldReducer``
        signature): a subclass defining ``fold`` (and ``interpolate``) calls
        this. ``fill`` (the value of never-written rows) must be 0."""
        if not _overrides(type(self), "fold"):
            raise TypeError(
                f"{type(self).__name__} must define fold(*inputs, state) "
                "(a FoldReducer subclass written in Python), or subclass one "
                "of the built-in reducers"
            )
        if fill != 0:
            raise ValueError(
                f"{type(self).__name__}: fill must be 0 for a reducer written "
                f"in Python, got {fill!r}"
            )
        self._init_kind(step_time, duration, inclusive, inplace, {})

    def _init_kind(
        self,
        step_time: float,
        duration: float,
        inclusive: bool,
        inplace: bool,
        params: dict,
        criterion: Any = None,
    ) -> None:
        """The constructor of every reducer: the built-in ones (``_kind``)
        get theirs from the table, which calls this."""
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

    def _build(self, *config: Any) -> None:
        """(Re)creates ``script_reducer`` from its configuration: step_time,
        duration, inclusive, inplace and the parameters by name."""
        name, threshold, fn = ("", 0.0, None)
        if self._criterion is not None:
            name, threshold, fn = _criterion_parts(self._criterion)
        self.script_reducer = _spellings.Reducer(self._kind or _CUSTOM_BASE_KIND, *config, name, threshold)
        _OWNERS[self.script_reducer] = self
        if fn is not None:
            _C._set_python_criterion(self.script_reducer, fn)
        if _overrides(type(self), "fold") or _overrides(type(self), "interpolate"):
            _custom.install_fold(self)

    def _monitor_feed(self) -> Any:
        """What a monitor feeds (decided when it is built): the C++ reducer,
        or, when ``forward`` is overridden or hooked, an object calling this
        module in Python (slower, and it cannot be saved)."""
        if _custom.needs_python_call(self):
            return _faces.wrap(_spellings.Reducer, _C._python_reducer(self))
        self.__dict__["_fed_directly"] = True  # see _hook_added
        return self.script_reducer

    def _hook_added(self) -> None:
        """A hook added once a monitor feeds the C++ reducer directly would
        never run for that monitor's steps: said, not skipped silently."""
        if self.__dict__.get("_fed_directly"):
            warnings.warn(
                f"torch_monitor: a forward hook added to {type(self).__name__} after a monitor was "
                "built with it does not run for that monitor's steps (the monitor feeds the C++ "
                "reducer directly, as chosen when it was built); add the hook first, then build "
                "the monitor", stacklevel=3)

    def register_forward_hook(
        self, hook: Callable[..., Any], *, prepend: bool = False, with_kwargs: bool = False,
        always_call: bool = False,
    ) -> torch.utils.hooks.RemovableHandle:
        self._hook_added()
        return super().register_forward_hook(
            hook, prepend=prepend, with_kwargs=with_kwargs, always_call=always_call)

    def register_forward_pre_hook(
        self, hook: Callable[..., Any], *, prepend: bool = False, with_kwargs: bool = False,
    ) -> torch.utils.hooks.RemovableHandle:
        self._hook_added()
        return super().register_forward_pre_hook(hook, prepend=prepend, with_kwargs=with_kwargs)

    # -- the reducer interface -------------------------------------------

    def fold(self, *inputs_and_state: Any) -> Tensor:
        """Subclasses written in Python define it: ``fold(*inputs, state)``
        gives the new state from the step's inputs and the previous state
        (None at the first step), as inferno's ``FoldReducer.fold``. The
        built-in reducers fold in C++."""
        raise NotImplementedError(
            f"{type(self).__name__} folds in C++; define fold() in a subclass "
            "to write a reducer in Python"
        )

    def interpolate(
        self, prev_data: Tensor, next_data: Tensor, sample_at: Tensor, step_time: float
    ) -> Tensor:
        """Subclasses written in Python may define it: the state
        ``sample_at`` after ``prev_data`` (``next_data`` being ``step_time``
        after it), as inferno's ``FoldReducer.interpolate``. Without it,
        view() reads the older state (the built-in reducers interpolate in
        C++)."""
        raise NotImplementedError(
            f"{type(self).__name__} interpolates in C++; define interpolate() "
            "in a subclass to write a reducer in Python"
        )

    def forward(self, obs: Tensor, cond: Optional[Tensor] = None) -> None:
        """Folds one step's observation (and condition, for the conditional
        traces) into a new state and records it."""
        # The same call in every world (torch.compile and torch.export record
        # it as a call_torchbind).
        if cond is None:
            self.script_reducer.forward([obs])
        else:
            self.script_reducer.forward([obs, cond])

    @torch.jit.export
    def peek(self) -> Optional[Tensor]:
        """The newest state, ``None`` before the first step."""
        return self.script_reducer.peek()

    @torch.jit.export
    def dump(self) -> Optional[Tensor]:
        """All recorded states along dim 0, newest first (rows never written
        hold the fill value); ``None`` before the first step."""
        return self.script_reducer.dump()

    @torch.jit.export
    def view(
        self, time: Union[float, int, Tensor], tolerance: float = VIEW_TOLERANCE
    ) -> Optional[Tensor]:
        """The state ``time`` before the newest one, interpolated between
        recorded states; ``None`` before the first step.

        ``time`` is a float (one time for every element) or a tensor with the
        state's dimensions (one time per element) or one more (several times
        per element, along the last dimension). Times within ``tolerance`` of
        a step read that step exactly. ValueError outside
        ``[0, dt * (N - 1)]`` (widened by the tolerance).
        """
        return self.script_reducer.view(time, tolerance)

    def clear(self, keepshape: bool = False, **kwargs: Any) -> None:
        """Back to the initial state; ``keepshape`` keeps the history
        allocated (and its shape), refilled with the fill value."""
        self.script_reducer.clear(strict_bool(keepshape, "keepshape"))

    @property
    def latest(self) -> Optional[Tensor]:
        """The newest state: ``peek()``, a subclass's own too (as inferno's)."""
        return self.peek()

    # -- time and history ------------------------------------------------

    dt = _faces.setting(
        "script_reducer",
        "step_time",
        float,
        """Time between two recorded states; setting it resizes the history
        when its length changes (keeping the newest states).""",
    )
    step_time = property(dt.fget, dt.fset, doc="Alias of ``dt``.")
    duration = _faces.setting(
        "script_reducer",
        "duration",
        float,
        """Time the history covers; setting it resizes the history when its
        length changes (keeping the newest states, padding with the fill
        value on the oldest side).""",
    )
    inclusive = _faces.setting(
        "script_reducer",
        "inclusive",
        bool,
        """Whether the history holds one more state, so that ``duration``
        itself can be viewed.""",
    )
    inplace = _faces.setting(
        "script_reducer",
        "inplace",
        bool,
        """Whether states are written into the history in place (without
        autograd) rather than out of place.""",
    )

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
        # load_state_dict restores the history only, as in inferno: the
        # receiver keeps its step_time, duration, parameters, ...
        self.script_reducer.load_state(
            _custom.history_only(tuple(state), self.script_reducer.state())
        )

    def __getstate__(self) -> dict:
        # pickle / copy.deepcopy: a torch.ScriptObject cannot be pickled by
        # Python, so carry its state and rebuild it.
        state = self.__dict__.copy()
        state["script_reducer"] = self.script_reducer.state()
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

    # -- criterion ---------------------------------------------------------

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
            self.script_reducer.set_criterion(name, threshold)
        else:
            _C._set_python_criterion(self.script_reducer, fn)
        self._criterion = value


class PassthroughReducer(FoldReducer):
    """Records the observations themselves (interpolation: the older one)."""

    _kind = "PassthroughReducer"


class EventReducer(FoldReducer):
    """Records, per element, the time since ``criterion`` last matched.

    0 where the criterion matches, else the previous value + ``step_time``;
    ``initial`` (``"inf"``, ``"zero"`` or ``"nan"``) before the first match.
    """

    _kind = "EventReducer"
    # inferno's order and spelling: the criterion first, initial by name.
    _criterion_first = True
    _defaults = {"initial": "inf"}

    @classmethod
    def _to_table(cls, name: str, value: Any) -> float:
        if name != "initial":
            return super()._to_table(name, value)
        if not isinstance(value, str) or value.lower() not in ("inf", "zero", "nan"):
            raise ValueError(f"initial must be 'inf', 'zero' or 'nan', got {value!r}")
        return 0.0 if value.lower() == "zero" else float(value)


class EMAReducer(FoldReducer):
    """Exponential moving average: ``s = alpha * x + (1 - alpha) * s``
    (``s = x`` at the first step); linear interpolation.
    """

    _kind = "EMAReducer"


class CAReducer(FoldReducer):
    """Cumulative average of every observation since the last ``clear()``;
    linear interpolation.
    """

    _kind = "CAReducer"


class _TraceReducer(FoldReducer):
    """The traces: what they add to the table's parameters, and inferno's
    keyword-only timing arguments."""

    _keyword_only_timing = True

    @property
    def decay(self) -> float:
        """Decay per step, exp(-dt / time_constant)."""
        return math.exp(-self.dt / self.time_constant)


class NearestTraceReducer(_TraceReducer):
    """Trace of the latest match: ``amplitude`` where the observation equals
    ``target`` (within ``tolerance``), else the previous value decayed by
    exp(-dt / time_constant).
    """

    _kind = "NearestTraceReducer"


class CumulativeTraceReducer(_TraceReducer):
    """Trace of all matches: the previous value decayed by
    exp(-dt / time_constant), plus ``amplitude`` where the observation equals
    ``target`` (within ``tolerance``).
    """

    _kind = "CumulativeTraceReducer"


class ScaledNearestTraceReducer(_TraceReducer):
    """Trace of the latest match, scaled by the input: ``scale * x +
    amplitude`` where ``criterion(x)``, else the previous value decayed.
    """

    _kind = "ScaledNearestTraceReducer"


class ScaledCumulativeTraceReducer(_TraceReducer):
    """Trace of all matches, scaled by the input: the previous value decayed,
    plus ``scale * x + amplitude`` where ``criterion(x)``.
    """

    _kind = "ScaledCumulativeTraceReducer"


class ConditionalNearestTraceReducer(_TraceReducer):
    """Like :class:`ScaledNearestTraceReducer`, the matches being a second
    input: ``reducer(x, cond)`` (cond: bool, or nonzero elements).
    """

    _kind = "ConditionalNearestTraceReducer"


class ConditionalCumulativeTraceReducer(_TraceReducer):
    """Like :class:`ScaledCumulativeTraceReducer`, the matches being a second
    input: ``reducer(x, cond)``.
    """

    _kind = "ConditionalCumulativeTraceReducer"
