"""Warnings raised on the library's own threads reach Python's `warnings`.

The window timer's thread and the sinks' writer threads have no Python caller;
their warnings are queued and issued on the main thread
(csrc/python/py_background_warnings.cpp), so filters, ``-W error`` and
``catch_warnings`` apply, and nothing goes to stderr behind Python's back.
Each case runs in its own process (threads, exit, fork), with a time limit.
"""

import pytest

from isolated import run_isolated

# Waits on the main thread (running bytecode, where queued warnings are
# issued) until a warning containing NEEDLE was caught, for at most 20 s.
WAIT_FOR = """
import time, warnings
def wait_for(needle):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            hits = [w for w in caught if needle in str(w.message)]
            if hits:
                return hits
            time.sleep(0.01)
    raise SystemExit(f"no warning with {needle!r}; caught {[str(w.message) for w in caught]}")
"""

# A Python handler that fails on the window timer's thread: the timer warns.
TIMER_WARNING = """
import datetime
import torch_monitor as tm
def failing(event):
    raise RuntimeError("handler broke")
handle = tm.register_event_handler(failing)
stat = tm.Stat("timed", [tm.SUM], datetime.timedelta(milliseconds=20), close_on_time=True)
stat.add(1.0)
"""

# A writer whose file cannot take the data (/dev/full): its writer thread warns.
SINK_WARNING = """
import torch_monitor as tm
sink = tm.JsonLinesWriter("/dev/full", flush_interval=0.01)
sink.register()
tm.log_event(tm.Event("e", __import__("datetime").datetime.now(), {"x": 1}))
"""

CASES = {
    "window-timer": (TIMER_WARNING, "window timer"),
    "sink-writer-thread": (SINK_WARNING, "/dev/full"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_background_warning_is_a_python_warning(case):
    setup, needle = CASES[case]
    out = run_isolated(
        WAIT_FOR + setup + f"""
hits = wait_for({needle!r})
print("category:", hits[0].category.__name__)
print("message:", hits[0].message)
"""
    )
    assert "category: RuntimeWarning" in out.stdout, out.describe()
    # Issued through Python only: c10's default handler did not print it (a
    # later one, raised after torch_monitor's exit hook, may go to stderr).
    message = out.stdout.split("message: ", 1)[1].splitlines()[0]
    assert message not in out.stderr, out.describe()


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_filter_raises_on_the_main_thread(case):
    setup, needle = CASES[case]
    out = run_isolated(
        "import warnings, time\n"
        "warnings.simplefilter('error', RuntimeWarning)\n" + setup + """
deadline = time.monotonic() + 20
try:
    while time.monotonic() < deadline:
        time.sleep(0.01)
    print("no exception")
except RuntimeWarning as e:
    print("raised:", e)
"""
    )
    assert "raised:" in out.stdout and needle in out.stdout, out.describe()


def test_no_hang_at_exit_with_warnings_pending():
    """Warnings keep coming while the interpreter exits: no hang, no crash;
    the late ones go to stderr."""
    out = run_isolated(TIMER_WARNING + "import time; time.sleep(0.2)\n", timeout=60)
    assert out.returncode == 0, out.describe()


def test_forked_child_gets_its_own_warnings():
    """A child forked while the timer warns still routes its own warnings."""
    out = run_isolated(
        WAIT_FOR + TIMER_WARNING + """
import os
wait_for("window timer")
pid = os.fork()
if pid == 0:
    stat2 = tm.Stat("timed.child", [tm.SUM], datetime.timedelta(milliseconds=20), close_on_time=True)
    stat2.add(1.0)
    try:
        wait_for("window timer")
        os._exit(0)
    except SystemExit:
        os._exit(3)
_, status = os.waitpid(pid, 0)
print("child status", os.waitstatus_to_exitcode(status))
""",
        timeout=60,
    )
    assert "child status 0" in out.stdout, out.describe()
