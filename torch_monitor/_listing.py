"""``monitors_of``: the monitors a model holds, found without guessing the
generated attribute names (``_torch_monitor_difference_<n>``)."""

from typing import Any, Dict

import torch
from torch import nn

from . import _C, _faces, _internals, _spellings

__all__ = ["monitors_of"]


def monitors_of(module: nn.Module) -> Dict[str, Any]:
    """Every torch_monitor monitor held by ``module`` or its submodules, by
    the dotted path of the attribute holding it.

    Works on eager modules, on scripted ones and on models loaded with
    ``torch.jit.load``. The values are the monitors' objects, the faces of
    ``torch.classes.torch_monitor.DifferenceMonitor`` that the modules hold
    (``peek()``, ``dump()``, ``view()``, ``reducer()``, ...); ``kind()`` says
    which monitor each is ("DifferenceMonitor", "InputMonitor",
    "OutputMonitor", "StateMonitor", "MultiStateMonitor", or "Monitor" for
    one written in Python). In C++ the same list is
    ``torch_monitor::script::monitorsOf(module)``.
    """
    if isinstance(module, torch.jit.ScriptModule):
        return {
            path: _faces.wrap(_spellings.DifferenceMonitor, monitor)
            for path, _, monitor in _C._monitors_of(_internals.script_module_object(module))
        }
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"monitors_of takes a torch.nn.Module or a ScriptModule, got "
            f"{type(module).__name__}"
        )
    found = {}
    for prefix, submodule in module.named_modules():
        for name, value in vars(submodule).items():
            if isinstance(value, torch.ScriptObject) and _C._monitor_kind(value):
                found[f"{prefix}.{name}" if prefix else name] = value
    return found
