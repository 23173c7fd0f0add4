"""torch_monitor: torch.monitor's Stat, Event and handlers, re-implemented in C++.

A drop-in for ``torch.monitor`` (``import torch_monitor as monitor``) whose
objects also work inside TorchScript and from C++ LibTorch programs. Importing
the package loads ``libtorch_monitor.so`` with ``torch.ops.load_library``,
which registers ``torch.classes.torch_monitor.*`` and
``torch.ops.torch_monitor.*``.
"""

import atexit as _atexit
import importlib as _importlib
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
    log_event,
    register_event_handler,
    unregister_event_handler,
)
from ._spellings import (  # noqa: E402  (the faces of the C++ objects and ops)
    ConsoleHandler,
    IntStat,
    JsonLinesWriter,
    MemoryHandler,
    PrometheusExporter,
    PrometheusTextFile,
    PytorchCounterCapture,
    Stat,
    TensorBoardWriter,
    WaitCounter,
    WaitCounterTracker,
    get_step,
    live_stat_names,
    set_step,
)
from . import _events, _faces, _internals  # noqa: E402,F401  (log_event(name, data), traceable)
from ._ranks import process_rank, set_process_rank  # noqa: E402  (rank-aware sinks)
from ._rank_sync import (  # noqa: E402
    flush_rank_sync,
    set_default_rank_group,
    set_rank_sync_deadline,
)
from .tensorboard_handler import TensorboardEventHandler  # noqa: E402
from . import monitors, reducers  # noqa: E402  (their __all__ below)
from .reducers import *  # noqa: E402,F401,F403
from .monitors import *  # noqa: E402,F401,F403
from ._listing import monitors_of  # noqa: E402
from .watch import NONFINITE_EVENT, WATCH_EVENT, Watch, WatchKind, watch  # noqa: E402

#: The value types an Event's data may hold.
data_value_t = _Union[str, float, int, bool]

# torch.monitor's names for the duration counter, for drop-in code.
_WaitCounter = WaitCounter
_WaitCounterTracker = WaitCounterTracker

#: Starts capturing PyTorch's own timings (c10's wait counters) as Stats:
#: ``with torch_monitor.capture_pytorch_counters(window_steps=100): ...``
#: (docs/pytorch_counters.md).
capture_pytorch_counters = PytorchCounterCapture

#: The name the design notes use for the JSON Lines sink.
JsonLinesHandler = JsonLinesWriter

# PyTorch 2's fakes and patches (torch_monitor._fake) wait for Dynamo's
# import, which costs seconds and which torch.compile and torch.export do.
_internals.after_dynamo_import(lambda dynamo: _importlib.import_module("torch_monitor._fake"))
# Dynamo could not call a method looked up before a graph break.
_internals.call_script_methods_across_graph_breaks()
# Strict torch.export would leave those fakes in the exported program,
# AOTInductor would pass nothing for our `Any` arguments, and inductor would
# run our ops out of order. Set up here, not
# with the fakes: torch.export._trace imports Dynamo half-way through its
# own import, so from Dynamo's set-up _trace is not whole yet (nor, maybe,
# inductor's codegen).
_internals.keep_real_objects_in_strict_export("torch_monitor")
_internals.pass_any_arguments_to_aoti_proxy_executor()
_internals.keep_effectful_ops_in_order()

#: Logs the open window of every live Stat now (they stay usable).
_close_all_stats = _C._close_all_stats


# The exit sequence, in C++ (csrc/python/py_exit.cpp): stop the window
# timer, close every Stat's open window (a Stat still referenced at exit is
# never destroyed, so its last window would be lost), flush rank sync and the
# file sinks, and unregister the Python handlers before the interpreter goes
# (so no library thread calls into Python after it); the background warnings
# held meanwhile are issued last. Registered as the C++ function itself: a
# Python hook's first bytecode is where a queued background warning turned
# into an error by the filters (-W error) would be raised, skipping it all.
# Registered after the submodules' own atexit hooks, so it runs before them.
_atexit.register(_C._at_exit)

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
    "PytorchCounterCapture",
    "capture_pytorch_counters",
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
    "live_stat_names",
    "set_process_rank",
    "process_rank",
    "TensorboardEventHandler",
    "STAT_EVENT",
    "library_path",
    "cmake_prefix_path",
]
# In this form (not `[...] + list`) type checkers see what is exported:
# `mypy --strict` users may then use every name (test_typing.py).
__all__ += [
    "TensorBoardWriter",
    "JsonLinesWriter",
    "JsonLinesHandler",
    "ConsoleHandler",
    "MemoryHandler",
    "PrometheusExporter",
    "PrometheusTextFile",
]
__all__ += reducers.__all__
__all__ += monitors.__all__
__all__ += ["monitors_of"]
__all__ += ["watch", "Watch", "WatchKind", "WATCH_EVENT", "NONFINITE_EVENT"]
