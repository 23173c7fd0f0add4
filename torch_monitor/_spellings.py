"""Everything the Python faces say differently from the C++ schemas: one table.

``_faces.make_face`` derives each class from its TorchScript registration
(``csrc/src/script``); the entries below are the only places where Python
differs, each with its reason:

* argument kinds Python takes beyond TorchScript's types (a ``timedelta`` for
  seconds, a path-like for a path, one ``str`` for a list of event names, a
  ``ProcessGroup`` for ``sync_ranks``);
* constructor arguments that are keyword-only in Python (TorchScript has no
  keyword-only arguments);
* argument-less getters read as properties, as ``torch.monitor`` and
  ``SummaryWriter`` users expect (TorchScript custom classes have methods);
* results converted to Python types (``timedelta``, ``Aggregation``,
  ``Event``);
* the context-manager protocol and copy/pickle policy.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any, Dict

import torch

from . import _C, _faces
from ._faces import Kind, Spelling
from ._ranks import sync_process_rank


def _ms_to_timedelta(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=ms)


# Aggregation members by their TorchScript names ("mean"), and the names by
# value: read once (each read of a pybind11 enum's __members__ builds it anew).
_AGGREGATIONS = {name.lower(): member for name, member in _C.Aggregation.__members__.items()}
_AGGREGATION_NAMES = {int(member): name for name, member in _AGGREGATIONS.items()}


def _aggregations(value: Any, where: str) -> Any:
    """Aggregation members, names or ints, as TorchScript takes them."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(
            f"{where} must be a sequence such as [Aggregation.MEAN, Aggregation.MAX], "
            f"got {type(value).__name__}"
        )
    names = _AGGREGATION_NAMES
    if not value:
        raise ValueError(f"{where} is empty: give at least one aggregation (e.g. [Aggregation.MEAN])")
    out = []
    for item in value:
        if isinstance(item, _C.Aggregation) and int(item) in names:
            out.append(names[int(item)])
        elif isinstance(item, _C.Aggregation):
            return [int(item)]  # C++ says why, naming the choices
        elif isinstance(item, str):
            out.append(_faces.KINDS_OF_SCHEMA["str"].convert(item, f"{where} item"))
        elif isinstance(item, int) and not isinstance(item, bool):
            if item not in names:
                return [item]  # C++ says why, naming the choices
            out.append(names[item])
        else:
            raise TypeError(
                f"{where}: an aggregation is a torch_monitor.Aggregation member, a name "
                f"such as 'mean' or an int 1..6, got {type(item).__name__}"
            )
    return out


def _rank_group(value: Any, where: str) -> bool:
    """True (or torch.distributed's world group) merges over the default
    group, set now; another ProcessGroup is checked now and attached after
    construction (TorchScript only knows True)."""
    if value is None or value is False:
        return False
    from . import _rank_sync

    # The error names the object: "Stat(): sync_ranks needs ...".
    prefix = where.split(" argument ")[0] + ": "
    return _rank_sync.resolve(value, prefix=prefix) == _rank_sync.DEFAULT_GROUP


def _sync_given_group(stat: Any, given: Dict[str, Any]) -> None:
    group = given["sync_ranks"]
    if group is not None and not isinstance(group, bool):
        from . import _rank_sync

        spec = _rank_sync.resolve(group, prefix=f"{type(stat).__name__}(): ")
        if spec != _rank_sync.DEFAULT_GROUP:  # the world group was set by the constructor
            _C._sync_stat_ranks(stat, *spec)


def _aggregation_dict(values: Dict[str, Any]) -> Dict[Any, Any]:
    return {_AGGREGATIONS[name]: value for name, value in values.items()}


_STAT = Spelling(
    kinds={
        "aggregations": Kind("Sequence[Union[Aggregation, str, int]]", _aggregations),
        "window_size": "optional seconds",
        "sync_ranks": Kind("Union[bool, torch.distributed.ProcessGroup]", _rank_group),
    },
    positional=4,  # torch.monitor.Stat(name, aggregations, window_size, max_samples)
    # TorchScript has no duration type: its window_size_ms() and
    # window_steps() (0: not that kind of window) read here as a timedelta
    # and an int, None for the other kind of window.
    getters=("count", "name", "max_samples", "close_on_time", "sync_ranks"),
    properties={
        "window_size": (
            lambda self: (
                None if self._call("window_steps", (), {}) else _ms_to_timedelta(self._call("window_size_ms", (), {}))
            ),
            "Optional[datetime.timedelta]",
            "The time window (None for a window of steps)",
        ),
        "window_steps": (
            lambda self: self._call("window_steps", (), {}) or None,
            "Optional[int]",
            "The window in training steps (None for a time window)",
        ),
        "aggregations": (
            lambda self: [_AGGREGATIONS[n] for n in self._call("aggregations", (), {})],
            "List[Aggregation]",
            "The aggregations logged per window",
        ),
    },
    results={"get": (_aggregation_dict, "Dict[Aggregation, float]")},
    after_init=_sync_given_group,
    install=_C._install_stat_add,
    signatures={"add": "(self, v: Union[float, torch.Tensor]) -> None"},
    overloads={"__init__": [
        "(self, name: str, aggregations: Sequence[Union[Aggregation, str, int]], "
        "window_size: Union[float, datetime.timedelta], max_samples: int = ..., *, "
        "close_on_time: bool = ..., sync_ranks: Union[bool, torch.distributed.ProcessGroup] = ...) -> None",
        "(self, name: str, aggregations: Sequence[Union[Aggregation, str, int]], *, "
        "window_steps: int, max_samples: int = ..., "
        "sync_ranks: Union[bool, torch.distributed.ProcessGroup] = ...) -> None",
    ]},
)


_WAIT_COUNTER = Spelling(
    kinds={"window_size": "seconds"},
    positional=2,
    getters=("key", "close_on_time"),
    properties={
        "window_size": (
            lambda self: _ms_to_timedelta(self._call("window_size_ms", (), {})),
            "datetime.timedelta",
            "The window",
        ),
    },
    results={"get": (_aggregation_dict, "Dict[Aggregation, float]")},
    install=_C._install_wait_counter_guard,
    signatures={"guard": "(self) -> WaitCounterTracker"},
)

_WAIT_COUNTER_TRACKER = Spelling(
    install=_C._install_wait_counter_tracker,
    signatures={"__enter__": "(self) -> WaitCounterTracker", "__exit__": "(self, *exc_info: Any) -> None"},
    copies="refuse",
    no_pickle="it is a unit of work being timed; pickle its WaitCounter and call guard() on the copy",
)


def _enter_sink(self: Any) -> Any:
    self.register()
    return self


def _exit_sink(self: Any, *exc_info: Any) -> bool:
    self.close()
    return False


def _sink(**entries: Any) -> Spelling:
    """A sink's spelling: the properties and protocol every sink shares."""
    getters = ("registered", "closed", "dropped", "problems") + entries.pop("getters", ())
    kinds = {
        "log_dir": "path",
        "path": "path",
        "flush_interval": "seconds",
        "event_names": "event names",
        "labels": "labels",
    }
    methods = {"__enter__": _enter_sink, "__exit__": _exit_sink}
    methods.update(entries.pop("methods", {}))
    signatures = {"__enter__": "(self: _Sink) -> _Sink", "__exit__": "(self, *exc_info: Any) -> bool"}
    signatures.update(entries.pop("signatures", {}))
    return Spelling(
        kinds=kinds,
        getters=getters,
        methods=methods,
        copies="share",
        no_pickle=(
            "it stands for an output of this process; make a new one with the same "
            "arguments (TorchScript and torch.export archives save its configuration)"
        ),
        repr_method="description",
        signatures=signatures,
        **entries,
    )


# What both buffered file sinks read back (sinks.cpp, defineFileSinkMethods).
_FILE_SINK_GETTERS = ("file_path", "ranks", "flush_interval", "max_buffer_bytes", "event_names")


def _memory_events(events: Any) -> Any:
    return [_C._event_from_script(e) for e in events]


FACES: Dict[str, Spelling] = {
    "Stat": _STAT,
    "IntStat": _STAT._replace(
        results={"get": (_aggregation_dict, "Dict[Aggregation, int]")},
        signatures={"add": "(self, v: Union[int, torch.Tensor]) -> None"},
    ),
    "WaitCounterTracker": _WAIT_COUNTER_TRACKER,  # before WaitCounter: guard() makes one
    "WaitCounter": _WAIT_COUNTER,
    "TensorBoardWriter": _sink(
        positional=1,
        before_init=sync_process_rank,  # the folder is chosen now
        getters=("log_dir", "step_key") + _FILE_SINK_GETTERS + ("run_dir",),
    ),
    "JsonLinesWriter": _sink(
        positional=1,
        before_init=sync_process_rank,  # the file is chosen now
        getters=("path", "append") + _FILE_SINK_GETTERS,
    ),
    "ConsoleHandler": _sink(positional=1, getters=("stream", "event_names")),
    "MemoryHandler": _sink(
        positional=1,
        getters=("capacity", "event_names"),
        results={"events": (_memory_events, "List[Event]")},
        methods={"__len__": lambda self: self._call("size", (), {})},
        signatures={"__len__": "(self) -> int"},
    ),
    "PrometheusExporter": _sink(
        before_init=sync_process_rank,  # the rank label is chosen now
        getters=("port", "host", "labels", "serving"),
    ),
    "PrometheusTextFile": _sink(
        before_init=sync_process_rank,
        getters=("path", "labels"),
    ),
}

# The nn side's objects. A reducer's Python callables (a criterion, a fold
# written in Python) are attached after construction onto its C++ setters
# (_C._set_python_criterion, _C._set_python_fold); torch_monitor.reducers'
# nn.Modules hold one as ``script_reducer``.
FACES["Reducer"] = Spelling(
    install=_C._install_reducer_calls,  # every call of a reducer module
    signatures={"forward": "(self, inputs: List[torch.Tensor]) -> None"},
)


def _reducer_feed(value: Any, where: str) -> Any:
    """A monitor's reducer: a torch_monitor reducer (what it says a monitor
    feeds) or a torch.classes.torch_monitor.Reducer object."""
    if isinstance(value, torch.ScriptObject):
        return value  # TorchScript's own check names another class
    feed = getattr(value, "_monitor_feed", None)
    if feed is None:
        raise TypeError(
            f"{where} must be a torch_monitor reducer (e.g. torch_monitor.PassthroughReducer(1.0)) "
            f"or its torch.classes.torch_monitor.Reducer object, got {type(value).__name__} "
            "(inferno's reducers are Python objects that the C++ monitor cannot feed)"
        )
    return feed()


def _keep_given_reducer(monitor: Any, given: Dict[str, Any]) -> None:
    """TorchScript's constructor wraps the C++ reducer in a new object: the
    monitor keeps the one its caller holds instead (a reducer module's), so
    that a model holding both saves one reducer."""
    feed = given["reducer"]
    feed = feed if isinstance(feed, torch.ScriptObject) else getattr(feed, "script_reducer", None)
    if isinstance(feed, torch.ScriptObject) and feed == monitor.reducer():
        _C._keep_reducer_object(monitor, feed)


def _reducer_given(monitor: Any) -> Any:
    """What a monitor was given as its reducer: the torch_monitor reducer that
    owns its Reducer object (so that copies of both stay one, through
    ``deepcopy``'s memo, and a Python reducer keeps its code), else that
    object."""
    from .reducers import owner_of  # torch_monitor.reducers imports this module

    feed = monitor.reducer()
    return owner_of(feed) or feed


def _monitor_like(monitor: Any, reducer: Any, config: Any = None, callables: Any = None) -> Any:
    """A new monitor with ``monitor``'s configuration and Python callables
    (or those given), feeding ``reducer``."""
    if config is None:
        config = dict(monitor.__obj_flatten__())
    config = {k: v for k, v in config.items() if k != "has_custom_callables"}
    new = DifferenceMonitor(reducer, **config)
    callables = _C._monitor_callables(monitor) if callables is None else callables
    if any(c is not None for c in callables):
        _C._set_monitor_callables(new, *callables)
    return new


def _restore_monitor(version: int, reducer: Any, config: Any, callables: Any) -> Any:
    if version != 1:
        raise ValueError(
            f"cannot unpickle a torch_monitor monitor saved with state version {version}; "
            "this build reads version 1. Load it with the release that saved it"
        )
    return _monitor_like(None, reducer, config, callables)


# A monitor's copies and pickles carry its configuration, its Python
# callables and its reducer as given: a deep copy of a monitor and of the
# reducer module feeding it (one deepcopy, as of a module holding both)
# stays wired to one reducer copy.
_MONITOR_COPIES = {
    "__copy__": lambda self: _monitor_like(self, self.reducer()),
    "__deepcopy__": lambda self, memo: _monitor_like(self, copy.deepcopy(_reducer_given(self), memo)),
    "__reduce_ex__": lambda self, protocol: (
        _restore_monitor,
        (1, _reducer_given(self), dict(self.__obj_flatten__()), _C._monitor_callables(self)),
    ),
}

# The object every monitor keeps on its module (torch_monitor.monitors).
# Its hooks' calls are a measured hot path, installed over the derived
# ones; its Python filter_/map_/op_ are set after construction
# (_C._set_monitor_callables) and read back (_C._monitor_callables).
FACES["DifferenceMonitor"] = Spelling(
    kinds={"reducer": Kind("Any", _reducer_feed)},
    results={"reducer": (lambda reducer: _faces.wrap(Reducer, reducer), "'Reducer'")},
    install=_C._install_monitor_calls,
    after_init=_keep_given_reducer,
    methods=_MONITOR_COPIES,
    signatures={
        "__copy__": "(self) -> DifferenceMonitor",
        "__deepcopy__": "(self, memo: Dict[int, Any]) -> DifferenceMonitor",
        "__reduce_ex__": "(self, protocol: int) -> Any",
        **{
            name: "(self, value: Any, training: bool) -> None"
            for name in ("before", "after", "observe")
        },
    },
)
def _default_group_only(value: Any, where: str) -> bool:
    """sync_ranks of a capture: True merges over the default process group
    (set now). A capture makes each key's Stat when the key first comes, so
    it takes the group the program uses by default, not another."""
    if value is None or value is False:
        return False
    if value is True:
        from . import _rank_sync

        _rank_sync.resolve(True, prefix="torch_monitor.capture_pytorch_counters: ", before="starting the capture")
        return True
    raise TypeError(
        f"{where} must be a bool (True merges across the ranks of the default "
        f"process group), got {type(value).__name__}"
    )


def _exit_capture(self: Any, *exc_info: Any) -> bool:
    self.remove()
    return False


# torch_monitor.capture_pytorch_counters: a capture of c10's wait counters
# (csrc/include/torch_monitor/pytorch_counters.h). It stands for this
# process's backend, as a sink stands for an output: a copy is the same
# capture, and pickling is refused.
FACES["PytorchCounterCapture"] = Spelling(
    kinds={
        "window_size": "optional seconds",
        "sync_ranks": Kind("bool", _default_group_only),
    },
    positional=0,  # capture_pytorch_counters(*, window_steps=..., ...)
    getters=("removed",),
    methods={"__enter__": lambda self: self, "__exit__": _exit_capture},
    signatures={
        "__enter__": "(self) -> PytorchCounterCapture",
        "__exit__": "(self, *exc_info: Any) -> bool",
    },
    copies="share",
    no_pickle=(
        "it stands for this process's capture of PyTorch's counters; start "
        "another with the same arguments (TorchScript archives save its "
        "configuration)"
    ),
)

# A watch's recorder; torch_monitor.watch() attaches the hooks that feed it
# (Python's Watch holds both).
FACES["Watch"] = Spelling(kinds={"window_seconds": "seconds"})

# One face per class, under the class's name (_spellings.pyi types them).
for _name, _spelling in FACES.items():
    globals()[_name] = _faces.make_face(_name, _spelling)
del _name, _spelling
# Not exported by torch_monitor under these names (its DifferenceMonitor and
# Watch are the nn.Module and watch()'s front end that hold them): pickles
# find them here.
Reducer.__module__ = DifferenceMonitor.__module__ = Watch.__module__ = __name__


# -- ops: one Python function each, made from the op's schema -----------------

set_step = _faces.make_op_face(
    "set_step",
    Spelling(),
    """Sets the process-wide training step: an int in [0, 2**63-1], normally
    the optimizer step. Stat events then carry the step current when their
    window closes, and sinks write their points at it (TensorBoard's x-axis).
    ``set_step(None)`` forgets it, as before the first call (for tests).
    Traceable by torch.compile and torch.export (the op runs with the graph,
    in order). Costs a few microseconds, once per training step.""",
)
live_stat_names = _faces.make_op_face(
    "live_stat_names",
    Spelling(),
    """The names of the Stats alive now, sorted, for exporters and debugging:
    every Stat and IntStat in any world (Python, TorchScript, C++), those of
    WaitCounters and of capture_pytorch_counters' keys included; a name twice
    for two Stats of one name. Not traceable (known only when a graph runs).""",
)
get_step = _faces.make_op_face(
    "get_step",
    Spelling(),
    """The training step last set with ``set_step`` (in any world: Python,
    TorchScript, C++), or None. Not traceable: inside compiled or exported
    code the step is known only when the graph runs, so read it outside.""",
)
