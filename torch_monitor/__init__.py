"""torch_monitor: torch.monitor's Stat, Event and handlers, re-implemented in C++.

A drop-in for ``torch.monitor`` (``import torch_monitor as monitor``) whose
objects also work inside TorchScript and from C++ LibTorch programs. Importing
the package loads ``libtorch_monitor.so`` with ``torch.ops.load_library``,
which registers ``torch.classes.torch_monitor.*`` and
``torch.ops.torch_monitor.*``.
"""

import atexit as _atexit
import os as _os
from typing import Union as _Union

import torch as _torch

_HERE = _os.path.dirname(_os.path.abspath(__file__))

#: Path of the core library (for ``torch.ops.load_library`` in other
#: processes, or to link C++ programs against).
library_path = _os.path.join(_HERE, "lib", "libtorch_monitor.so")
#: Prefix for CMake's ``find_package(TorchMonitor)`` (like
#: ``torch.utils.cmake_prefix_path``).
cmake_prefix_path = _os.path.join(_HERE, "lib", "cmake")

with open(_os.path.join(_HERE, "VERSION")) as _f:
    #: The distribution's version (one source: torch_monitor/VERSION).
    __version__ = _f.read().strip()

if not _os.path.exists(library_path):
    raise ImportError(
        f"torch_monitor at {_HERE} has no compiled library ({library_path} is "
        "missing): this is the source tree, not a built package. Build and "
        "install it with `bash scripts/build.sh` (or `pip install "
        "--no-build-isolation .`), then import it from outside the source "
        "folder, or run Python with -P so the source folder is not on sys.path."
    )
_torch.ops.load_library(library_path)

from . import _C  # noqa: E402  (needs the library loaded first)
from ._C import (  # noqa: E402
    COUNT,
    MAX,
    MEAN,
    MIN,
    STAT_EVENT,
    SUM,
    VALUE,
    Aggregation,
    Event,
    EventHandlerHandle,
    IntStat,
    Stat,
    WaitCounter,
    WaitCounterTracker,
    log_event,
    register_event_handler,
    unregister_event_handler,
)
from . import _fake  # noqa: E402,F401  (fake classes for torch.compile/export)
from . import _events  # noqa: E402,F401  (log_event(name, data), traceable)
from ._steps import get_step, set_step  # noqa: E402  (the training step)
from ._ranks import process_rank, set_process_rank  # noqa: E402  (rank-aware sinks)
from ._rank_sync import (  # noqa: E402
    flush_rank_sync,
    set_default_rank_group,
    set_rank_sync_deadline,
)
from .tensorboard_handler import TensorboardEventHandler  # noqa: E402
from . import monitors, reducers, sinks  # noqa: E402  (their __all__ below)
from .reducers import *  # noqa: E402,F401,F403
from .monitors import *  # noqa: E402,F401,F403
from .sinks import *  # noqa: E402,F401,F403
from ._listing import monitors_of  # noqa: E402
from .watch import NONFINITE_EVENT, WATCH_EVENT, Watch, watch  # noqa: E402

#: The value types an Event's data may hold.
data_value_t = _Union[str, float, int, bool]

# torch.monitor's names for the duration counter, for drop-in code.
_WaitCounter = WaitCounter
_WaitCounterTracker = WaitCounterTracker

# Compiled and exported graphs call methods of the Python faces (ScriptObject
# subclasses) through their TorchScript methods.
_fake.make_traceable(_C)

#: Logs the open window of every live Stat now (they stay usable).
_close_all_stats = _C._close_all_stats


def _at_exit():
    # First the last windows: a Stat still referenced at exit (by a module
    # global, a handler handle, a scripted module) is never destroyed, so its
    # open window would be lost; closing it here reaches Python handlers and
    # sinks alike (sinks flush later, at process exit). Then the Python
    # handlers go, before the interpreter does: a Stat destroyed later (a C++
    # static, a TorchScript module freed at exit) must not call into a
    # finalised interpreter. Before all that, the window timer's thread
    # stops (after the handlers it runs return), so no handler runs on it
    # while the interpreter finalises; its open windows are closed here too.
    # Synced Stats' last windows are merged (bounded by the rank sync
    # deadline) while the Python handlers still exist.
    _C._stop_window_timer()
    _C._close_all_stats()
    _C._flush_rank_sync()
    _C._unregister_python_handlers()
    # Background threads' warnings queued for Python are issued now; later
    # ones go to stderr (csrc/python/py_background_warnings.cpp).
    _C._stop_background_warnings()


# Registered after the submodules' own atexit hooks, so it runs before them.
_atexit.register(_at_exit)

__all__ = [
    "Aggregation",
    "VALUE",
    "MEAN",
    "COUNT",
    "SUM",
    "MAX",
    "MIN",
    "Stat",
    "IntStat",
    "WaitCounter",
    "WaitCounterTracker",
    "Event",
    "EventHandlerHandle",
    "data_value_t",
    "log_event",
    "register_event_handler",
    "unregister_event_handler",
    "set_step",
    "set_rank_sync_deadline",
    "flush_rank_sync",
    "set_default_rank_group",
    "get_step",
    "set_process_rank",
    "process_rank",
    "TensorboardEventHandler",
    "STAT_EVENT",
    "library_path",
    "cmake_prefix_path",
]
# In this form (not `[...] + list`) type checkers see what is exported:
# `mypy --strict` users may then use every name (test_typing.py).
__all__ += reducers.__all__
__all__ += monitors.__all__
__all__ += sinks.__all__
__all__ += ["monitors_of"]
__all__ += ["watch", "Watch", "WATCH_EVENT", "NONFINITE_EVENT"]
