"""Native event sinks: TensorBoard event files, JSON Lines, console, memory, Prometheus.

Each class here is a C++ event handler from ``libtorch_monitor``: a
``torch.ScriptObject`` that is the very ``torch.classes.torch_monitor``
object TorchScript code gets, so modules holding one script, compile and
export (docs/pt2.md). ``register_event_handler``
registers them directly, so events reach them without touching Python or
the GIL::

    import torch_monitor as monitor

    with monitor.TensorBoardWriter("runs/exp1"):      # registered for the block
        ...                                            # Stat windows become curves

    tb = monitor.TensorBoardWriter("runs/exp2")
    handle = monitor.register_event_handler(tb)        # or tb.register()
    ...
    monitor.unregister_event_handler(handle)
    tb.close()

Every sink has ``register()`` / ``unregister()`` (idempotent self-registration,
also done by ``with``), ``flush()``, ``close()`` (unregisters what
``register()`` did, flushes, and ignores later events), ``closed``,
``dropped`` (events or values lost) and ``problems`` (the distinct problems
warned about). Registering a sink both with ``register()``/``with`` and with
``register_event_handler`` makes it receive every event twice.

A sink never raises into the code that logs: an unwritable directory, a full
disk or a removed directory is warned about once (a ``RuntimeWarning`` when
found by the constructor, ``flush()`` or ``close()``; a C++ warning on stderr
when found by the background thread) and retried. Pipes and FIFOs never
block, hang exit or raise ``SIGPIPE``; every sink survives ``fork()``. See
docs/sinks.md ("Pipes, FIFOs, fork and exit").
"""

from __future__ import annotations

import datetime
import os
from typing import Dict, Iterable, List, Mapping, Optional, Union

from . import _C
from ._checks import strict_bool
from ._ranks import sync_process_rank

__all__ = [
    "TensorBoardWriter",
    "JsonLinesWriter",
    "JsonLinesHandler",
    "ConsoleHandler",
    "MemoryHandler",
    "PrometheusExporter",
    "PrometheusTextFile",
]

_STAT_EVENT = "torch.monitor.Stat"
_WATCH_EVENT = "torch_monitor.Watch"
_DEFAULT_BUFFER = 32 << 20

Seconds = Union[float, int, datetime.timedelta]
EventNames = Optional[Union[str, Iterable[str]]]


def _seconds(value: Seconds, what: str = "flush_interval") -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{what} must be a number of seconds or a datetime.timedelta, "
            f"got {type(value).__name__}"
        )
    return float(value)


def _path(value: Union[str, bytes, os.PathLike], what: str) -> str:
    """A path as UTF-8 text without NUL; ``what`` names the argument."""
    path = os.fspath(value)
    if isinstance(path, bytes):
        try:
            path = path.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{what} is not valid UTF-8 (byte {e.start}: {e.reason}); "
                "pass the path as UTF-8 text"
            ) from None
    if "\0" in path:
        raise ValueError(
            f"{what} contains a NUL byte (at index {path.index(chr(0))}); "
            "a file name cannot hold one: remove it"
        )
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} is not valid UTF-8 (index {e.start}: {e.reason}, as from "
            "bytes decoded with errors='surrogateescape'); pass the path as "
            "UTF-8 text"
        ) from None
    return path


def _ranks(value: str) -> str:
    if not isinstance(value, str):
        raise TypeError(
            f'ranks must be "separate" or "zero", got {type(value).__name__}'
        )
    return value  # the core checks the word


def _names(value: EventNames) -> List[str]:
    """None: every event. A bare string is one name, not a set of letters."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    names = list(value)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(
                f"event_names must hold str, got {type(name).__name__}"
            )
    return names


class TensorBoardWriter(_C._TensorBoardWriter):
    """Writes events as TensorBoard scalars, natively (no protobuf, no TensorFlow).

    Creates ``log_dir`` and an ``events.out.tfevents.<time>.<host>.<pid>.<n>``
    file in it. For each accepted event (by default the ``"torch.monitor.Stat"``
    events a ``Stat`` logs when its window closes, and the
    ``"torch_monitor.Watch"`` events of ``watch()``) every numeric value becomes a
    scalar: the data key is the tag, the event's timestamp the wall time, and the
    step a per-tag counter 0, 1, 2, ... (or the event's ``step_key`` value).
    ints and floats are written as float32 (TensorBoard's ``simple_value``),
    bools as 1.0/0.0; strings are skipped.

    Logging only encodes into memory (about 0.1 µs per scalar); a background
    thread writes whole records every ``flush_interval`` seconds, on ``flush()``
    and ``close()``, when the object is destroyed, and at process exit. If the
    disk cannot keep up, at most ``max_buffer_bytes`` are held and newer
    scalars are dropped (counted in ``dropped``, warned once).

    Args:
        log_dir: the run's directory, e.g. ``"runs/exp1"`` (str or path-like).
        flush_interval: seconds (or a ``timedelta``) between background writes.
        max_buffer_bytes: bound on buffered bytes.
        event_names: the event names written; ``None`` for every event.
        step_key: if set, an event's int value under this key is the step of
            all its other values (and is not written itself).
        ranks: in a distributed job (``torch.distributed`` initialised, or
            ``set_process_rank``), ``"separate"`` (default) writes to
            ``<log_dir>/rank<r>``, one TensorBoard run per rank; ``"zero"``
            writes on rank 0 only, to ``log_dir`` (other ranks write nothing).
            Outside one, ``log_dir`` as given. ``run_dir`` is where this
            process writes.

    Points land at the event's step (a Stat's event carries the training step
    set with ``torch_monitor.set_step``), else at a per-tag counter 0, 1, 2.

    Also ``add_scalar(tag, scalar_value, global_step=None, walltime=None)``
    like ``SummaryWriter`` (``global_step`` None means the training step when
    one is set, else the tag's next counter value; ``walltime`` None means
    now); ``add_histogram(tag, values, global_step=None, walltime=None)``, the
    histogram of a tensor's values with ``SummaryWriter.add_histogram``'s
    default buckets (bucketed on the tensor's device; ``values`` None writes
    nothing, so ``monitor.peek()`` can be passed as is; ``global_step`` as for
    ``add_scalar``; see docs/sinks.md "Histograms"); and the read-only
    ``log_dir``, ``file_path``, ``flush_interval``, ``event_names``.
    """

    def __init__(
        self,
        log_dir: Union[str, os.PathLike],
        *,
        flush_interval: Seconds = 1.0,
        max_buffer_bytes: int = _DEFAULT_BUFFER,
        event_names: EventNames = (_STAT_EVENT, _WATCH_EVENT),
        step_key: Optional[str] = None,
        ranks: str = "separate",
    ) -> None:
        sync_process_rank()  # the folder is chosen now
        super().__init__(
            _path(log_dir, "log_dir"),
            _seconds(flush_interval),
            int(max_buffer_bytes),
            _names(event_names),
            step_key or "",
            _ranks(ranks),
        )


class JsonLinesWriter(_C._JsonLinesWriter):
    """Appends one JSON object per event and line to ``path`` (JSON Lines).

    ``{"name": ..., "timestamp": "2024-05-01T12:34:56.123456Z",
    "epoch_seconds": 1714566896.123456, "data": {...}}`` with the data's types
    kept: ints as JSON integers, floats as JSON numbers that read back as float
    (``2.0``, not ``2``; NaN and infinities as the strings ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``, which ``float()`` reads), bools as
    ``true``/``false``, strings as strings. Names, keys and strings are escaped
    and invalid UTF-8 (possible from C++) becomes U+FFFD, so every line is valid
    JSON: ``[json.loads(line) for line in open(path)]``.

    Buffered and written in the background exactly like ``TensorBoardWriter``.

    ``path`` may also be a FIFO or ``/dev/stdout``: opening and writing never
    block (a FIFO without a reader is warned about and opened once one comes;
    a stalled reader costs dropped events, and ``close()`` waits at most 1 s),
    and a reader that goes away (``prog | head``) is one warning, after which
    events are dropped, never a ``SIGPIPE``.

    Args:
        path: the file (its directory is created); UTF-8 text (``str``,
            path-like or UTF-8 ``bytes``) without NUL bytes, not a directory
            (else ``ValueError``).
        flush_interval: seconds (or a ``timedelta``) between background writes.
        max_buffer_bytes: bound on buffered bytes.
        event_names: the event names written; ``None`` (default) for every event.
        append: ``True`` keeps what the file holds (default), ``False`` starts
            it anew; anything else is a ``TypeError``.
        ranks: in a distributed job, ``"separate"`` (default) writes to
            ``<dir>/rank<r>/<name>`` for ``path`` ``<dir>/<name>`` (a FIFO or
            device is shared as is); ``"zero"`` writes on rank 0 only, to
            ``path``. Lines then carry ``"rank"`` and ``"world_size"``.
            ``file_path`` is the file this process writes.
    """

    def __init__(
        self,
        path: Union[str, os.PathLike],
        *,
        flush_interval: Seconds = 1.0,
        max_buffer_bytes: int = _DEFAULT_BUFFER,
        event_names: EventNames = None,
        append: bool = True,
        ranks: str = "separate",
    ) -> None:
        sync_process_rank()  # the file is chosen now
        super().__init__(
            _path(path, "path"),
            _seconds(flush_interval),
            int(max_buffer_bytes),
            _names(event_names),
            strict_bool(append, "append"),
            _ranks(ranks),
        )


#: The name the design notes use for the JSON Lines sink.
JsonLinesHandler = JsonLinesWriter


class ConsoleHandler(_C._ConsoleHandler):
    """Prints one human-readable line per event to ``"stderr"`` (default) or ``"stdout"``.

    ``2024-05-01T12:34:56.123456Z torch.monitor.Stat loss.count=10 loss.mean=0.25``
    (UTC time, event name, data sorted by key). Each line is written straight
    to the file descriptor, so it is not mixed with other lines but can
    overtake text still sitting in ``sys.stdout``'s buffer. A closed pipe is
    one warning (later lines are dropped and counted), never a ``SIGPIPE``.

    Args:
        stream: ``"stderr"`` or ``"stdout"``.
        event_names: the event names printed; ``None`` (default) for every event.
    """

    def __init__(self, stream: str = "stderr", *, event_names: EventNames = None) -> None:
        super().__init__(stream, _names(event_names))


class MemoryHandler(_C._MemoryHandler):
    """Keeps the last ``capacity`` events in memory, for tests and notebooks.

    ``events()`` returns them oldest first (as ``torch_monitor.Event``),
    ``clear()`` forgets them, ``len(handler)`` counts them; ``dropped`` counts
    the events overwritten because the ring was full::

        with monitor.MemoryHandler() as memory:
            train_one_epoch()
        losses = [e.data["loss.mean"] for e in memory.events()]

    Args:
        capacity: how many events are kept.
        event_names: the event names kept; ``None`` (default) for every event.
    """

    def __init__(self, capacity: int = 10000, *, event_names: EventNames = None) -> None:
        super().__init__(int(capacity), _names(event_names))


def _prometheus_labels(labels: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """The constant labels; the core adds ``rank`` in a distributed job."""
    sync_process_rank()  # the rank label is chosen now
    return {str(k): str(v) for k, v in (labels or {}).items()}


class PrometheusExporter(_C._PrometheusExporter):
    """Serves every Stat's last closed window at ``GET /metrics`` for Prometheus.

    Text exposition format 0.0.4: per Stat a gauge family
    ``torch_monitor_<name>`` (the name with characters outside
    ``[a-zA-Z0-9_:]`` replaced by ``_``) with one sample per aggregation
    (label ``aggregation="mean"``, ...), and for a Stat with COUNT a counter
    ``torch_monitor_<name>_count_total`` summing the counts of all windows.
    A scrape reads a snapshot that each window close updates: it never
    touches ``Stat.add``. The server is one C++ thread with bounded
    connections and timeouts (docs/sinks.md, "Prometheus").

    Args:
        port: the TCP port; 0 (default) picks a free one, see ``port``.
        host: the address to listen on; ``"127.0.0.1"`` (default) keeps it
            local, ``"0.0.0.0"`` opens it to the network.
        labels: constant labels on every sample (job, run id). When
            torch.distributed is initialised, ``rank`` is added (unless
            given).
    """

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        labels: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(int(port), str(host), _prometheus_labels(labels))


class PrometheusTextFile(_C._PrometheusTextFile):
    """Writes what ``PrometheusExporter`` serves to a ``.prom`` file.

    For node_exporter's textfile collector: at every Stat window close the
    text is written to a temporary file beside ``path`` and renamed over it,
    so a reader sees a whole file, old or new. ``labels`` as for
    ``PrometheusExporter`` (``rank`` added under torch.distributed).
    """

    def __init__(
        self,
        path: Union[str, os.PathLike],
        labels: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(_path(path, "path"), _prometheus_labels(labels))
