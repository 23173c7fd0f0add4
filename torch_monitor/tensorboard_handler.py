"""TensorBoard sink for monitor events (pure Python).

This module deliberately imports nothing from the compiled part of
``torch_monitor`` (nor TensorBoard itself): the handler only needs an object with
an ``add_scalar`` method, normally a ``torch.utils.tensorboard.SummaryWriter``.
"""

from __future__ import annotations

import numbers
import operator
import threading
import warnings
from typing import Any, Callable, Dict, Iterable, Optional, Set

__all__ = ["TensorboardEventHandler"]

# Name of the events a Stat logs when a window closes. Same string as
# ``torch.monitor.STAT_EVENT``; repeated here so this module has no import-time
# dependency on the C++ extension.
_STAT_EVENT = "torch.monitor.Stat"
_WATCH_EVENT = "torch_monitor.Watch"


class TensorboardEventHandler:
    """Event handler that writes monitor events to a TensorBoard ``SummaryWriter``.

    A drop-in replacement for ``torch.monitor.TensorboardEventHandler``::

        from torch.utils.tensorboard import SummaryWriter
        import torch_monitor as monitor

        writer = SummaryWriter("runs/exp1")
        monitor.register_event_handler(monitor.TensorboardEventHandler(writer))

    In a distributed job the writer's directory is the user's: give each rank
    its own (``SummaryWriter(f"runs/exp1/rank{dist.get_rank()}")``, one
    TensorBoard run per rank) or make it on rank 0 only; several ranks
    writing one directory show every step once per rank. The native
    ``torch_monitor.TensorBoardWriter`` does this by itself (docs/sinks.md,
    "Rank-aware sinks").

    For every accepted event (by default those named ``"torch.monitor.Stat"``,
    which ``Stat`` logs when a window closes, and ``"torch_monitor.Watch"``,
    which ``watch()`` logs) each entry of ``event.data`` becomes
    one scalar point: the key is the tag (e.g. ``"loss.mean"``), the event's
    timestamp is the wall time. Events with any other name are ignored unless
    listed in ``event_names``.

    Steps (differs from ``torch.monitor``, which passes no step, so that every
    point of every curve lands on step 0):

    * ``step=None`` (default): an event's own ``step`` when it has one (a
      ``Stat``'s event carries the training step current when its window
      closed, once the loop calls ``torch_monitor.set_step``); otherwise each
      tag has its own counter: the first point written to a tag without a
      step is step 0, the next step 1, and so on. A value that is skipped (see
      below) does not consume a step.
    * ``step=callable``: a function taking no arguments and returning the step as
      an ``int`` (anything accepted by ``operator.index``, e.g. a NumPy integer),
      typically your training loop's global step: ``step=lambda: trainer.step``.
      It is called once per event, and every point of that event gets this step
      (in place of the event's own step).
      If it raises or returns a non-integer, the exception propagates to whoever
      logged the event: a broken step source is a configuration error that should
      be seen at the first event, not hidden.

    Values:

    * ``int`` and ``float`` (and any other real number, e.g. NumPy scalars) are
      written as scalars; NaN and infinities are written as they are, since a NaN
      loss is exactly what one wants to see.
    * ``bool`` is written as ``1.0`` / ``0.0``. ``torch.monitor`` turns booleans in
      event data into these floats before any handler sees them, so this keeps
      the curves a ``torch.monitor`` user already gets (``torch_monitor`` keeps
      bools as bools in the event itself).
    * ``str`` values are skipped silently (``SummaryWriter.add_scalar`` would
      raise on them); strings are legitimate event data, just not plottable.
    * Anything else that cannot be converted with ``float()``, and any value for
      which the writer itself raises, is skipped with a ``RuntimeWarning`` (once
      per tag); the remaining keys of the event are still written. One bad value
      never raises into the training loop.

    Args:
        writer: a ``torch.utils.tensorboard.SummaryWriter`` or any object with a
            compatible ``add_scalar(tag, value, global_step=, walltime=)``; one
            whose ``add_scalar`` takes no ``global_step`` (torch.monitor's
            handler never passes it) gets ``add_scalar(tag, value, walltime=)``.
        step: ``None`` for the event's step, else per-tag counters; or a
            zero-argument callable returning the step (keyword-only).
        event_names: names of the events to write (keyword-only); default
            ``"torch.monitor.Stat"`` and ``"torch_monitor.Watch"``. Data keys are used as tags unchanged for
            every accepted event, so events sharing a key share a curve.

    Thread safety: one handler may be called from several threads at once; the
    per-tag counters and the writes of one event are guarded by a lock, so steps
    are never duplicated or lost and each tag's points reach the writer in step
    order.
    """

    def __init__(
        self,
        writer: Any,
        *,
        step: Optional[Callable[[], int]] = None,
        event_names: Iterable[str] = (_STAT_EVENT, _WATCH_EVENT),
    ) -> None:
        if step is not None and not callable(step):
            raise TypeError(
                "TensorboardEventHandler: step must be None (per-tag counters) or a "
                f"callable taking no arguments that returns an int, got {type(step).__name__}"
            )
        if isinstance(event_names, str):
            # A bare string would otherwise be taken as a set of characters.
            event_names = (event_names,)
        self._writer = writer
        self._step_fn = step
        self._event_names = frozenset(event_names)
        self._counters: Dict[str, int] = {}
        self._warned_tags: Set[str] = set()
        self._takes_step = True  # until the writer says it takes no global_step
        # Reentrant so that a writer which itself logs a monitor event (handled
        # again by this handler on the same thread) cannot deadlock.
        self._lock = threading.RLock()

    def __call__(self, event: Any) -> None:
        if event.name not in self._event_names:
            return
        walltime = event.timestamp.timestamp()
        data = event.data
        explicit_step = None
        if self._step_fn is not None:
            raw = self._step_fn()
            try:
                explicit_step = operator.index(raw)
            except TypeError:
                raise TypeError(
                    "TensorboardEventHandler: the step callable must return an int, "
                    f"got {type(raw).__name__}"
                ) from None
        else:
            # torch.monitor's events have no step attribute.
            explicit_step = getattr(event, "step", None)

        with self._lock:
            for tag, raw_value in data.items():
                value = self._to_float(tag, raw_value)
                if value is None:
                    continue
                step = explicit_step if explicit_step is not None else self._counters.get(tag, 0)
                try:
                    self._add_scalar(tag, value, step, walltime)
                except Exception as exc:  # one bad point must not stop training
                    self._warn_once(tag, f"writer.add_scalar failed ({type(exc).__name__}: {exc})")
                    continue
                if explicit_step is None:
                    self._counters[tag] = step + 1

    def _add_scalar(self, tag: str, value: float, step: int, walltime: float) -> None:
        if self._takes_step:
            try:
                self._writer.add_scalar(tag, value, global_step=step, walltime=walltime)
                return
            except TypeError as exc:
                # A writer of torch.monitor's call, add_scalar(tag, value,
                # walltime=): its points, without a step, as torch.monitor's.
                if "global_step" not in str(exc):
                    raise
                self._takes_step = False
        self._writer.add_scalar(tag, value, walltime=walltime)

    def _to_float(self, tag: str, value: Any) -> Optional[float]:
        """The scalar to write for ``value``, or None to skip it."""
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        if isinstance(value, (str, bytes)):
            return None
        if isinstance(value, numbers.Real):
            try:
                return float(value)
            except (OverflowError, ValueError) as exc:  # e.g. an int beyond float range
                self._warn_once(tag, f"value {value!r} is not representable as a float ({exc})")
                return None
        try:
            # Things like a one-element tensor; never reached with real Event data.
            return float(value)
        except Exception:
            self._warn_once(tag, f"value of type {type(value).__name__} is not numeric")
            return None

    def _warn_once(self, tag: str, reason: str) -> None:
        # Called with self._lock held.
        if tag in self._warned_tags:
            return
        self._warned_tags.add(tag)
        warnings.warn(
            f"TensorboardEventHandler: skipped a point of tag {tag!r}: {reason}; "
            "further problems with this tag are skipped silently",
            RuntimeWarning,
            stacklevel=3,
        )
