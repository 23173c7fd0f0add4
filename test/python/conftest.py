"""Shared fixtures for the torch.monitor compatibility suite.

Every test that takes ``impl`` runs twice: against PyTorch's own ``torch.monitor``
(the reference) and against ``torch_monitor``.  A module that cannot be imported is
skipped (set ``TORCH_MONITOR_REQUIRE=1`` to turn that skip into a failure, e.g. in CI
after the extension has been built).  See /work/shared/spec/monitor-core.md for the
behaviour being checked; rows marked FIX there are asserted per implementation.
"""

import importlib
import os
import pathlib
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
# An in-place build of the package is importable; an installed one still wins.
if str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))

REFERENCE = "torch.monitor"
OURS = "torch_monitor"


def load_module(name):
    """Import ``name`` or skip the test (fail instead with TORCH_MONITOR_REQUIRE=1)."""
    required = name == OURS and os.environ.get("TORCH_MONITOR_REQUIRE") == "1"
    try:
        mod = importlib.import_module(name)
    except Exception as exc:  # ImportError, or OSError from loading the library
        if required:
            raise
        pytest.skip(f"cannot import {name}: {exc!r}")
    if getattr(mod, "__file__", None) is None:
        # The unbuilt source folder imports as an empty namespace package.
        if required:
            pytest.fail(f"{name} is an empty namespace package (not built)")
        pytest.skip(f"{name} is not built (namespace package only)")
    return mod


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` need a CUDA device: ``-m cuda`` selects them
    (scripts/test_gpu.sh), and without a device they are skipped, saying so."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run by scripts/test_gpu.sh on a GPU machine)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """With ``TORCH_MONITOR_FAILURE_LOG=path``, each failure's name and
    traceback is appended to ``path`` as it happens: a run cut short (a GPU
    lease that ends, a CI timeout) still says why its tests failed, which
    pytest's own summary, printed at the end, would not. Under xdist only the
    controller writes (it receives every worker's reports)."""
    path = os.environ.get("TORCH_MONITOR_FAILURE_LOG")
    if not path or not report.failed or "PYTEST_XDIST_WORKER" in os.environ:
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


@pytest.fixture(params=[REFERENCE, OURS])
def impl(request):
    """The module under test: torch.monitor or torch_monitor."""
    return load_module(request.param)


@pytest.fixture
def reference(impl):
    """True when ``impl`` is PyTorch's torch.monitor (the FIX rows differ there)."""
    return impl.__name__ == REFERENCE


@pytest.fixture
def tm():
    """torch_monitor only (for its extras); skipped when it is not importable."""
    return load_module(OURS)


class Handlers:
    """Registers handlers on one module and unregisters them all at teardown.

    torch.monitor crashes at interpreter exit when a handler is still registered,
    so no test may leave one behind.
    """

    def __init__(self, mod):
        self.mod = mod
        self.handles = []

    def register(self, fn):
        handle = self.mod.register_event_handler(fn)
        self.handles.append(handle)
        return handle

    def unregister(self, handle):
        self.handles.remove(handle)
        self.mod.unregister_event_handler(handle)

    def close(self):
        while self.handles:
            self.mod.unregister_event_handler(self.handles.pop())


class Recorder:
    """A registered handler that keeps every event it receives."""

    def __init__(self, handlers):
        self.mod = handlers.mod
        self.events = []
        handlers.register(self.events.append)

    def clear(self):
        self.events.clear()

    def stat_data(self, stat_name=None):
        """The data dicts of the Stat events received, optionally of one stat."""
        out = []
        for e in self.events:
            if e.name != self.mod.STAT_EVENT:
                continue
            data = e.data
            if stat_name is None or all(k.startswith(stat_name + ".") for k in data):
                out.append(data)
        return out


@pytest.fixture
def handlers(impl):
    h = Handlers(impl)
    yield h
    h.close()


@pytest.fixture
def recorder(handlers):
    return Recorder(handlers)


@pytest.fixture
def tm_recorder(tm):
    h = Handlers(tm)
    yield Recorder(h)
    h.close()


@pytest.fixture(autouse=True)
def forget_training_step():
    """Forgets the process-wide training step after every test, so that a
    test that sets it never changes the steps another test sees. Only when
    torch_monitor is already imported: the reference-only runs never load it."""
    yield
    module = sys.modules.get(OURS)
    if module is not None and getattr(module, "set_step", None) is not None:
        module.set_step(None)
