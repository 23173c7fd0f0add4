"""Helpers for deterministic tests of code that uses torch_monitor stats."""

import contextlib
from typing import Iterator

from . import _C


class FakeClock:
    """The monotonic clock every torch_monitor Stat reads while it is active.

    Not thread-safe itself: drive it from one thread (stats may be fed from
    any number).
    """

    def __init__(self, start_ms: int) -> None:
        self._ms = int(start_ms)
        _C._set_fake_monotonic_ms(self._ms)

    @property
    def ms(self) -> int:
        return self._ms

    def set_ms(self, ms: int) -> None:
        self._ms = int(ms)
        _C._set_fake_monotonic_ms(self._ms)

    def advance_ms(self, ms: int) -> None:
        self.set_ms(self._ms + int(ms))


@contextlib.contextmanager
def fake_clock(start_ms: int = 1_000_000) -> Iterator[FakeClock]:
    """Replaces the monotonic clock of all stats by a hand-driven one.

    Windows are aligned to multiples of the window size on this clock, so
    ``fake_clock(0)`` with a 100 ms window puts ``set_ms(0..99)`` in one
    window. The real clock returns on exit.
    """
    clock = FakeClock(start_ms)
    try:
        yield clock
    finally:
        _C._set_fake_monotonic_ms(None)


@contextlib.contextmanager
def cpu_tensors_take_device_path() -> Iterator[None]:
    """Makes ``Stat.add`` treat CPU tensors as it treats CUDA ones.

    A tensor on an accelerator is summarised on its device and read once per
    window; a CPU tensor is normally read at once. Inside this context CPU
    tensors take the accelerator path too, so tests on a machine without an
    accelerator check its results. Process-wide.
    """
    _C._set_cpu_tensors_take_device_path(True)
    try:
        yield
    finally:
        _C._set_cpu_tensors_take_device_path(False)
