"""Helpers for deterministic tests of code that uses torch_monitor stats."""

import contextlib
from typing import TYPE_CHECKING, Iterator, Sequence

from . import _C

if TYPE_CHECKING:
    from .watch import WatchKind


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


#: ATen ops that make a view: no device work.
VIEW_OPS = frozenset({
    "aten::reshape", "aten::view", "aten::narrow", "aten::select", "aten::slice",
    "aten::as_strided", "aten::unsqueeze", "aten::expand", "aten::alias", "aten::detach",
})


def watch_device_work(layers: int, what: Sequence["WatchKind"], device: str = "cpu") -> int:
    """The device work ``watch(model, optimizer, what=what)`` adds to one
    training step of ``layers`` x Linear(16, 16) (SGD with momentum),
    ``set_step`` included, on the
    path accelerator tensors take: on a CUDA device the kernels and copies
    the profiler sees; on the CPU, with that path forced, the outermost ATen
    ops that are not views (each a launch on a GPU). The test of watch's
    batching and ``benchmarks/python/bench_watch.py`` count with it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ._spellings import set_step
    from .watch import watch

    cuda = device != "cpu"

    def synchronize() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def count(watched: bool) -> int:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(layers)]).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        x = torch.randn(8, 16, device=device)
        forced = contextlib.nullcontext() if cuda else cpu_tensors_take_device_path()
        with forced:
            w = watch(model, optimizer, what=what, window_steps=1000) if watched else None
            for step in range(3):  # the last is counted
                synchronize()
                with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
                    set_step(step)  # the non-finite check's copy of the counts
                    optimizer.zero_grad()
                    model(x).square().mean().backward()
                    optimizer.step()
                    synchronize()
            if w is not None:
                w.remove()
        set_step(None)
        if cuda:
            return sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events())
        return sum(
            e.name.startswith("aten::") and e.name not in VIEW_OPS
            and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
            for e in prof.events()
        )

    return count(True) - count(False)
