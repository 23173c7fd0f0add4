"""``set_step`` / ``get_step``: the process-wide training step from Python.

Both call the ops ``torch.ops.torch_monitor.set_step`` / ``get_step`` (the
C++ ``setStep`` / ``getStep``), so one definition serves eager code,
``torch.compile`` (the op is traced into the graph, no graph break) and
``torch.export`` (strict or not: the op is recorded and runs with the
program). ``set_step`` is an ordered side effect there (see ``_fake``).
The op call costs a few microseconds, once per training step.
"""

from typing import Optional

import torch

__all__ = ["set_step", "get_step"]

_set_step = torch.ops.torch_monitor.set_step.default
_get_step = torch.ops.torch_monitor.get_step.default


def set_step(step: Optional[int]) -> None:
    """Sets the process-wide training step: an int >= 0, normally the
    optimizer step. Stat events then carry the step current when their
    window closes, and sinks write their points at it (TensorBoard's x-axis).
    ``set_step(None)`` forgets it, as before the first call (for tests).
    Raises ValueError for a negative step. Traceable by torch.compile and
    torch.export."""
    _set_step(step)


def get_step() -> Optional[int]:
    """The training step last set with ``set_step`` (in any world: Python,
    TorchScript, C++), or None. Not traceable: inside compiled or exported
    code the step is known only when the graph runs, so read it outside."""
    return _get_step()
