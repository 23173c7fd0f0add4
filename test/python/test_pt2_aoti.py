"""Exported programs leave the process: torch.export.save/load and AOTInductor.

* ``torch.export.save`` of a non-strict exported program holding a Stat (its
  forward adds a float and a tensor) or with a DifferenceMonitor attached,
  and ``torch.export.load`` in a fresh process after ``import torch_monitor``:
  the loaded program feeds its own Stat (events reach a handler) and its own
  monitor (a history).
* ``torch._inductor.aoti_compile_and_package`` of the same programs, loaded
  in a fresh process with ``aoti_load_package`` and in a C++ program
  (test/cpp/aoti_consumer) with ``torch::inductor::AOTIModelPackageLoader``:
  the Stat events reach a Python handler and a C++ handler, and its side
  effects run in program order. Torch 2.11
  cannot load such a package (see ``PROXY_EXECUTOR_TAKES_ANY``); there the
  tests check that it fails for that reason.

Saving, compiling and loading run in child processes (they could crash; an
AOTInductor package whose tensor arguments went missing did, see
``_internals.pass_any_arguments_to_aoti_proxy_executor``).
"""

import json
import os
import re

import pytest

torch = pytest.importorskip("torch")

from cpp_build import build_project, import_torch_monitor, requires_toolchain, run  # noqa: E402
from isolated import run_isolated  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
AOTI_CONSUMER_SRC = os.path.normpath(os.path.join(HERE, "..", "cpp", "aoti_consumer"))
COMPILE_TIMEOUT_S = 600

# The two modules, defined in every child process that exports them.
MODELS = """
from datetime import timedelta
import torch
import torch_monitor as tm

class StatModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stat = tm.Stat("loss", [tm.SUM, tm.COUNT], timedelta(hours=1))

    def forward(self, x):
        self.stat.add(1.0)
        self.stat.add(x.sum())
        return x + 1

class Counter(torch.nn.Module):
    # Its buffer grows by x at every call: the monitor sees a difference.
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(3))

    def forward(self, x):
        self.state.add_(x)
        return self.state * 2

class OutOfReadyOrder(torch.nn.Module):
    # Its two samples come ready in the other order: the first waits for a
    # matmul, the second only for a sum of the input.
    def __init__(self):
        super().__init__()
        self.stat = tm.Stat("order", [tm.VALUE, tm.COUNT], timedelta(hours=1))

    def forward(self, x, w):
        h = x @ w
        self.stat.add(h[0, 0])
        self.stat.add(x.sum())
        return h

# A monitor's hooks hold it weakly: without a reference it is gone (and so
# is its part of the graph) before export.
monitors = []

def exported(which):
    if which == "stat":
        return torch.export.export(StatModel(), (torch.ones(2),))
    if which == "order":
        return torch.export.export(OutOfReadyOrder(), (torch.ones(4, 4), torch.ones(4, 4)))
    model = Counter()
    monitors.append(
        tm.DifferenceMonitor(tm.PassthroughReducer(1.0, 8.0), "state", model)
    )
    return torch.export.export(model, (torch.ones(3),))
"""

# Runs a loaded program (``run(x)``) on the fresh process's side: Stat events
# for inputs 2 and 3 are sum = (1 + 2*2) + (1 + 3*2) = 12, count = 4.
STAT_INPUTS = (2.0, 3.0)
STAT_EVENT = {"loss.sum": 12.0, "loss.count": 4.0}


# Each call adds ones to the buffer: the reducer's 8 slots (duration 8, step
# 1) hold three differences of ones, newest first, then zeros.
MONITOR_HISTORY = f"8 {[1.0] * 9 + [0.0] * 15}"


@pytest.fixture(scope="module")
def tmon():
    return import_torch_monitor()


def save(tmp_path, which, how):
    path = tmp_path / f"{which}_{how}.pt2"
    if how == "export":
        action = f"torch.export.save(exported({which!r}), {str(path)!r})"
    else:
        action = (
            f"torch._inductor.aoti_compile_and_package(exported({which!r}), "
            f"package_path={str(path)!r})"
        )
    run_isolated(MODELS + action, timeout=COMPILE_TIMEOUT_S)
    assert path.is_file()
    return path


@pytest.fixture(scope="module")
def packages(tmon, tmp_path_factory):
    """{(which, how): path} of saved programs, made once for the module."""
    made = {}

    def get(which, how):
        if (which, how) not in made:
            made[which, how] = save(tmp_path_factory.mktemp(which), which, how)
        return made[which, how]

    return get


def stat_events_in_fresh_process(load):
    """Loads with ``load`` (source giving ``run``) and returns the child's
    Stat event data after closing every window."""
    out = run_isolated(
        f"""
        import json, torch, torch_monitor as tm
        seen = []
        tm.register_event_handler(lambda e: seen.append((e.name, dict(e.data))))
        {load}
        for v in {STAT_INPUTS!r}:
            run(torch.full((2,), v))
        tm._close_all_stats()
        print(json.dumps(seen))
        """,
        timeout=COMPILE_TIMEOUT_S,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def monitor_history_in_fresh_process(load):
    out = run_isolated(
        f"""
        import torch, torch_monitor as tm
        {load}
        for _ in range(3):
            run(torch.ones(3))
        history = monitor.dump()
        print(len(history), history.flatten().tolist())
        """,
        timeout=COMPILE_TIMEOUT_S,
    )
    return out.stdout.strip().splitlines()[-1]


EXPORT_LOAD = "ep = torch.export.load({path!r}); run = ep.module()"
AOTI_LOAD = "run = torch._inductor.aoti_load_package({path!r})"

# Torch 2.11's AOTInductor proxy executor (C++, OSSProxyExecutor) takes no
# argument typed Any, and Stat.add(value) and DifferenceMonitor.before(value,
# training) take Any: loading such a package fails with this error. Torch
# 2.13's executor dispatches an Any argument on its serialized type. Nothing
# Python can read tells the two apart, so the version does: 2.13 is the
# first torch checked to have it (2.12 was not checked).
PROXY_EXECUTOR_TAKES_ANY = torch.torch_version.TorchVersion(torch.__version__) >= (2, 13)
NO_ANY_IN_PROXY_EXECUTOR = r"Unsupported input type as_\w+ for extern kernel call_torchbind"


def assert_load_fails_for_want_of_any(load):
    out = run_isolated(
        "import torch, torch_monitor\n" + load, timeout=COMPILE_TIMEOUT_S, check=False
    )
    assert out.returncode != 0 and re.search(NO_ANY_IN_PROXY_EXECUTOR, out.stderr), (
        f"expected torch {torch.__version__}'s AOTInductor to refuse the package "
        "for want of Any arguments (if it loads it now, PROXY_EXECUTOR_TAKES_ANY "
        "is wrong for it)\n" + out.describe()
    )


def test_export_save_load_stat(packages):
    path = str(packages("stat", "export"))
    events = stat_events_in_fresh_process(EXPORT_LOAD.format(path=path))
    assert events == [["torch.monitor.Stat", STAT_EVENT]]


def test_export_save_load_difference_monitor(packages):
    path = str(packages("monitor", "export"))
    load = EXPORT_LOAD.format(path=path) + "; (monitor,) = ep.constants.values()"
    assert monitor_history_in_fresh_process(load) == MONITOR_HISTORY


def test_aoti_package_in_python_stat(packages):
    path = str(packages("stat", "aoti"))
    if not PROXY_EXECUTOR_TAKES_ANY:
        assert_load_fails_for_want_of_any(AOTI_LOAD.format(path=path))
        return
    events = stat_events_in_fresh_process(AOTI_LOAD.format(path=path))
    assert events == [["torch.monitor.Stat", STAT_EVENT]]


def test_aoti_package_in_python_difference_monitor(packages):
    path = str(packages("monitor", "aoti"))
    load = (
        AOTI_LOAD.format(path=path)
        + "; (monitor,) = run.loader.get_custom_objs().values()"
    )
    if not PROXY_EXECUTOR_TAKES_ANY:
        assert_load_fails_for_want_of_any(load)
        return
    assert monitor_history_in_fresh_process(load) == MONITOR_HISTORY


def test_aoti_package_runs_side_effects_in_program_order(packages):
    """AOTInductor lowers through the same scheduler as torch.compile, which
    ran effectful ops as their inputs came ready (the second add first, so
    VALUE was the matmul's 4.0) until _internals.keep_effectful_ops_in_order
    (see test_pt2.py's tests of it)."""
    path = str(packages("order", "aoti"))
    if not PROXY_EXECUTOR_TAKES_ANY:
        assert_load_fails_for_want_of_any(AOTI_LOAD.format(path=path))
        return
    out = run_isolated(
        f"""
        import json, torch, torch_monitor as tm
        seen = []
        tm.register_event_handler(lambda e: seen.append(dict(e.data)))
        {AOTI_LOAD.format(path=path)}
        run(torch.ones(4, 4), torch.ones(4, 4))
        tm._close_all_stats()
        print(json.dumps(seen))
        """,
        timeout=COMPILE_TIMEOUT_S,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [{"order.value": 16.0, "order.count": 2.0}]


@requires_toolchain
def test_aoti_package_in_cpp_reaches_cpp_handler(tmon, packages, tmp_path):
    build = build_project(AOTI_CONSUMER_SRC, tmp_path / "build", tmon, ("aoti_consumer",))
    package = packages("stat", "aoti")
    proc = run([build / "aoti_consumer", package, *STAT_INPUTS])
    if not PROXY_EXECUTOR_TAKES_ANY:
        assert proc.returncode != 0 and re.search(NO_ANY_IN_PROXY_EXECUTOR, proc.stderr), (
            proc.stdout + proc.stderr
        )
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line for line in lines if line.startswith("output")] == ["output 3", "output 4"]
    events = [line.split()[1:] for line in lines if line.startswith("event")]
    assert len(events) == 1, lines
    name, *fields = events[0]
    assert name == "torch.monitor.Stat"
    assert {k: float(v) for k, v in (f.split("=") for f in fields)} == STAT_EVENT


def test_aoti_codegen_patch_still_applies(tmon):
    """Fails loudly when a torch upgrade moves what
    ``pass_any_arguments_to_aoti_proxy_executor`` patches."""
    from torch._higher_order_ops.torchbind import CallTorchBind  # noqa: F401
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    patched = CppWrapperCpu.generate_extern_kernel_args_decl_if_needed
    assert getattr(patched, "_torch_monitor", False), (
        "torch_monitor's fix of AOTInductor's Any arguments is not installed on "
        "CppWrapperCpu.generate_extern_kernel_args_decl_if_needed"
    )
