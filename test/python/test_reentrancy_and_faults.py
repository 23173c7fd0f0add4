"""Reentrant handlers and faults (monitor-core.md, Handlers and Stat FIX rows).

Each scenario runs in its own process, so that a deadlock or a crash fails (or, for
torch.monitor, proves) something instead of hanging or killing the test run:
- deadlock: the scenario's process has not exited DEADLOCK_S seconds after it started
  and has made no CPU progress for IDLE_S seconds (it is then killed);
- crash: a negative return code (minus the signal number).

Importing torch costs about a second of CPU, so per implementation one subprocess
(``subprocess.run([sys.executable, "-c", ZYGOTE], timeout=...)``) imports the module
once and forks one child per scenario, all running in parallel; the children run the
scenario and exit through normal interpreter shutdown (where some of the crashes are).
This happens once, the first time a test of this file asks for an outcome.
"""

import concurrent.futures
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import OURS, REFERENCE, load_module

# A scenario is deadlocked when it has run for DEADLOCK_S seconds and used no CPU for
# the last IDLE_S seconds (every scenario finishes its work in well under a second, but
# many children exiting at once on a small machine can take several seconds of wall
# time: CPU progress tells slow from stuck).  HARD_LIMIT_S stops anything.
DEADLOCK_S = 2.0
IDLE_S = 1.0
HARD_LIMIT_S = 60.0
ZYGOTE_TIMEOUT_S = 180.0  # import + all scenarios; only a hang of the harness itself

PRELUDE = """\
import datetime, gc, json, sys, threading, time
import {module} as m
A = m.Aggregation
def ev(name):
    return m.Event(name, datetime.datetime.now(), {{}})
def result(**values):
    print("RESULT " + json.dumps(values), flush=True)
def recording(calls, label, error=None):
    # A handler appending `label` to `calls`, then raising `error` if given.
    def handler(e):
        calls.append(label)
        if error is not None:
            raise error
    return handler
def read_in_handler(read):
    # read(s) as seen by a handler of the events of s, a 50 ms Stat whose
    # window closes between its two adds.
    s = m.Stat("s", [A.SUM], datetime.timedelta(milliseconds=50))
    seen = []
    def handler(e):
        if e.name == m.STAT_EVENT:
            seen.append(read(s))
    H = m.register_event_handler(handler)
    s.add(1.0)
    time.sleep(0.12)
    s.add(2.0)
    m.unregister_event_handler(H)
    return seen
def raised_by(fn):
    # [type name, message] of what fn() raised, or None.
    try:
        fn()
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    return None
"""

# Reads {"module", "workdir", "limits", "scenarios": {name: source}} from stdin and
# prints {name: returncode, or None when killed as deadlocked} as JSON.
ZYGOTE = r"""
import gc, importlib, json, os, sys, time
spec = json.loads(sys.stdin.read())
deadlock_s, idle_s, hard_limit_s = spec["limits"]
importlib.import_module(spec["module"])
gc.freeze()  # keep the children's collections off the inherited (shared) objects

def cpu_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, IndexError, ValueError):
        return None

children = {}
for name, source in spec["scenarios"].items():
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, suffix in ((1, ".out"), (2, ".err")):
            path = os.path.join(spec["workdir"], name + suffix)
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        del spec, children
        exec(compile(source, name, "exec"), {"__name__": "__main__"})
        sys.exit(0)  # normal interpreter shutdown in the child
    now = time.monotonic()
    children[pid] = {"name": name, "started": now, "ticks": None, "progress": now}

codes = {}
while children:
    for pid, c in list(children.items()):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            codes[c["name"]] = os.waitstatus_to_exitcode(status)
            del children[pid]
            continue
        now = time.monotonic()
        ticks = cpu_ticks(pid)
        if ticks is None or ticks != c["ticks"]:
            c["ticks"], c["progress"] = ticks, now
        stuck = now - c["started"] > deadlock_s and now - c["progress"] > idle_s
        if stuck or now - c["started"] > hard_limit_s:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            codes[c["name"]] = None
            del children[pid]
    time.sleep(0.02)
print(json.dumps(codes))
"""


SCENARIOS = {
    # A handler logs another event.
    "log_from_handler": """
        order = []
        def handler(e):
            if e.name == "outer":
                m.log_event(ev("inner"))
            order.append(e.name)
        H = m.register_event_handler(handler)
        m.log_event(ev("outer"))
        m.unregister_event_handler(H)
        result(order=order)
    """,
    # A handler registers another handler (called from the next event on: the
    # registry is snapshotted before the handlers run, design.md).
    "register_from_handler": """
        late, added = [], []
        def handler(e):
            if not added:
                added.append(m.register_event_handler(late.append))
        H = m.register_event_handler(handler)
        m.log_event(ev("first"))
        m.log_event(ev("second"))
        for h in added + [H]:
            m.unregister_event_handler(h)
        result(late=[e.name for e in late])
    """,
    # A handler unregisters another one.
    "unregister_from_handler": """
        victim, done = [], []
        V = m.register_event_handler(victim.append)
        def handler(e):
            if not done:
                done.append(True)
                m.unregister_event_handler(V)
        H = m.register_event_handler(handler)
        m.log_event(ev("first"))
        m.log_event(ev("second"))
        m.unregister_event_handler(H)
        result(victim=[e.name for e in victim])
    """,
    # A handler reads the Stat whose window close is being logged.
    "stat_get_from_handler": """
        result(seen=read_in_handler(lambda s: {k.name: v for k, v in s.get().items()}))
    """,
    "stat_count_from_handler": """
        result(seen=read_in_handler(lambda s: s.count))
    """,
    # A handler releases the GIL (sleep) while another thread logs.
    "gil_release_in_handler": """
        finished = []
        def handler(e):
            if e.name == "slow":
                time.sleep(0.3)
            finished.append(e.name)
        H = m.register_event_handler(handler)
        t = threading.Thread(target=m.log_event, args=(ev("slow"),))
        t.start()
        time.sleep(0.1)
        m.log_event(ev("fast"))
        t.join()
        m.unregister_event_handler(H)
        result(finished=finished)
    """,
    # Handlers raise during log_event.
    "handler_exception_log_event": """
        calls = []
        H = [m.register_event_handler(f) for f in (
            recording(calls, "bad", RuntimeError("boom-first")),
            recording(calls, "good"),
            recording(calls, "bad2", ValueError("boom-second")),
        )]
        raised = raised_by(lambda: m.log_event(ev("x")))
        for h in H:
            m.unregister_event_handler(h)
        result(calls=calls, raised=raised)
    """,
    # A handler raises while a Stat closes its window (max_samples=1) inside add().
    "handler_exception_stat_add": """
        calls = []
        H = [m.register_event_handler(f) for f in (
            recording(calls, "bad", RuntimeError("boom-add")),
            recording(calls, "good"),
        )]
        s = m.Stat("s", [A.SUM], 60.0, 1)
        raised = raised_by(lambda: s.add(1.0))
        for h in H:
            m.unregister_event_handler(h)
        result(calls=calls, raised=raised, get={k.name: v for k, v in s.get().items()})
    """,
    # A handler raises while a Stat is destroyed: there is no caller to raise to.
    "exception_in_destruction": """
        calls = []
        H = [m.register_event_handler(f) for f in (
            recording(calls, "bad", RuntimeError("boom-dtor")),
            recording(calls, "good"),
        )]
        s = m.Stat("s", [A.SUM], 60.0)
        s.add(1.0)
        del s
        gc.collect()
        for h in H:
            m.unregister_event_handler(h)
        result(calls=calls)
    """,
    # Unregistering an already unregistered handle, another handler registered.
    "stale_handle": """
        calls = []
        h1 = m.register_event_handler(lambda e: calls.append(1))
        h2 = m.register_event_handler(lambda e: calls.append(2))
        m.unregister_event_handler(h1)
        m.unregister_event_handler(h1)
        m.log_event(ev("x"))
        result(calls=calls)
    """,
    # Unregistering an already unregistered handle, no handler registered.
    "stale_handle_empty": """
        h = m.register_event_handler(lambda e: None)
        m.unregister_event_handler(h)
        m.unregister_event_handler(h)
        result(ok=True)
    """,
    # A handler still registered at interpreter exit, its handle dropped.
    "handler_at_exit": """
        seen = []
        m.register_event_handler(seen.append)
        m.log_event(ev("x"))
        result(seen=len(seen))
    """,
    # A window shorter than 1 ms.
    "tiny_window": """
        try:
            s = m.Stat("s", [A.SUM], datetime.timedelta(microseconds=500))
        except ValueError as exc:
            result(error="ValueError")
            sys.exit(0)
        print("CONSTRUCTED", flush=True)
        s.add(1.0)
        result(added=True)
    """,
}


@dataclasses.dataclass
class Outcome:
    returncode: object  # int, or None when it was killed as deadlocked
    stdout: str
    stderr: str

    @property
    def deadlocked(self):
        return self.returncode is None

    @property
    def result(self):
        lines = [ln for ln in self.stdout.splitlines() if ln.startswith("RESULT ")]
        return json.loads(lines[-1][len("RESULT "):]) if lines else None

    def __str__(self):
        return f"returncode={self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr[-3000:]}"


def run_all_scenarios(module, workdir):
    """One zygote process for ``module``; returns {scenario: Outcome}."""
    workdir.mkdir()
    spec = {
        "module": module,
        "workdir": str(workdir),
        "limits": [DEADLOCK_S, IDLE_S, HARD_LIMIT_S],
        "scenarios": {
            name: PRELUDE.format(module=module) + textwrap.dedent(code) for name, code in SCENARIOS.items()
        },
    }
    # The child imports from the same places as this process (and not from its cwd).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), PYTHONWARNINGS="default")
    proc = subprocess.run(
        [sys.executable, "-c", ZYGOTE],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=ZYGOTE_TIMEOUT_S,
        cwd=workdir,
        env=env,
    )
    assert proc.returncode == 0, f"scenario runner failed:\n{proc.stdout}\n{proc.stderr}"
    codes = json.loads(proc.stdout.splitlines()[-1])
    return {
        name: Outcome(
            codes[name],
            (workdir / f"{name}.out").read_text(),
            (workdir / f"{name}.err").read_text(),
        )
        for name in SCENARIOS
    }


def _importable(name):
    try:
        load_module(name)
        return True
    except pytest.skip.Exception:
        return False


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    base = tmp_path_factory.mktemp("scenarios")
    modules = [mod for mod in (REFERENCE, OURS) if _importable(mod)]
    with concurrent.futures.ThreadPoolExecutor(len(modules) or 1) as pool:
        return {mod: pool.submit(run_all_scenarios, mod, base / mod) for mod in modules}


@pytest.fixture
def outcome(impl, outcomes):
    results = outcomes[impl.__name__].result()  # a runner failure fails only its module
    return lambda scenario: results[scenario]


def assert_ok(out, **expected):
    """Exited cleanly and printed the expected result."""
    assert out.returncode == 0, str(out)
    assert out.result == expected, str(out)


def assert_signal(out, sig):
    assert out.returncode == -sig, str(out)


# ---------------------------------------------------------------- reentrancy (FIX)


REENTRANT = {
    "log_from_handler": {"order": ["inner", "outer"]},
    "register_from_handler": {"late": ["second"]},
    "unregister_from_handler": {"victim": ["first"]},
    "stat_get_from_handler": {"seen": [{"SUM": 1.0}]},
    "gil_release_in_handler": {"finished": ["fast", "slow"]},
}


@pytest.mark.parametrize("scenario", list(REENTRANT))
def test_reentrant_handler(outcome, reference, scenario):
    out = outcome(scenario)
    if reference:
        # torch.monitor calls handlers under its global (or the Stat's) mutex.
        assert out.deadlocked, str(out)
        assert out.result is None
    else:
        assert_ok(out, **REENTRANT[scenario])


def test_stat_count_from_handler(outcome, reference):
    out = outcome("stat_count_from_handler")
    if reference:
        assert out.deadlocked, str(out)
        return
    assert out.returncode == 0, str(out)
    # 0 or 1: whether the closing sample is already counted is not specified.
    assert out.result["seen"] in ([0], [1]), str(out)


# ---------------------------------------------------------------- faults (FIX)


def test_handler_exception_in_log_event(outcome, reference):
    out = outcome("handler_exception_log_event")
    if reference:
        # The first exception stops the loop: later handlers starve.
        assert_ok(out, calls=["bad"], raised=["RuntimeError", "boom-first"])
        return
    assert out.returncode == 0, str(out)
    assert out.result["calls"] == ["bad", "good", "bad2"], str(out)
    kind, message = out.result["raised"]
    assert kind == "RuntimeError" and "boom-first" in message, str(out)


def test_handler_exception_in_stat_add(outcome, reference):
    out = outcome("handler_exception_stat_add")
    if reference:
        assert_ok(out, calls=["bad"], raised=["RuntimeError", "boom-add"], get={"SUM": 1.0})
        return
    assert out.returncode == 0, str(out)
    assert out.result["calls"] == ["bad", "good"], str(out)
    kind, message = out.result["raised"]
    assert kind == "RuntimeError" and "boom-add" in message, str(out)
    assert out.result["get"] == {"SUM": 1.0}, str(out)  # the window still closed


def test_exception_in_stat_destruction(outcome, reference):
    out = outcome("exception_in_destruction")
    if reference:
        # std::terminate from the destructor.
        assert_signal(out, signal.SIGABRT)
        assert "terminate called" in out.stderr and "boom-dtor" in out.stderr
        assert out.result is None
        return
    assert_ok(out, calls=["bad", "good"])
    assert "boom-dtor" in out.stderr  # reported as a warning


def test_stale_handle_unregister(outcome, reference):
    out = outcome("stale_handle")
    if reference:
        # The stale unregister removed the last registered handler instead.
        assert_ok(out, calls=[])
    else:
        assert_ok(out, calls=[2])


def test_stale_handle_unregister_on_empty_registry(outcome, reference):
    out = outcome("stale_handle_empty")
    if reference:
        assert_signal(out, signal.SIGSEGV)
        assert out.result is None
    else:
        assert_ok(out, ok=True)


def test_handler_registered_at_exit(outcome, reference):
    out = outcome("handler_at_exit")
    if reference:
        # torch.monitor (2.11, 2.13) crashes at exit, after the script ran
        # (1.13 hung): its handler registry's static destructor frees the
        # Python handler, taking the GIL of the finalized interpreter. Python
        # 3.11 segfaults there; 3.12 and later detect it and abort ("Fatal
        # Python error: gilstate_tss_set", a function 3.12 introduced).
        if sys.version_info >= (3, 12):
            assert_signal(out, signal.SIGABRT)
            assert "Fatal Python error" in out.stderr, str(out)
        else:
            assert_signal(out, signal.SIGSEGV)
        assert out.result == {"seen": 1}
    else:
        assert_ok(out, seen=1)


def test_window_below_one_millisecond(outcome, reference):
    out = outcome("tiny_window")
    if reference:
        # Constructed fine; the first add divides by a zero window: SIGFPE.
        assert_signal(out, signal.SIGFPE)
        assert "CONSTRUCTED" in out.stdout
        assert out.result is None
    else:
        assert_ok(out, error="ValueError")
