"""Warnings met where no Python caller converts them reach Python's `warnings`.

The window timer's thread, the sinks' writer threads and a sink handling an
event inside log_event have no Python caller that converts c10 warnings;
their warnings are queued and issued on the main thread
(csrc/python/py_background_warnings.cpp), so filters, ``-W error`` and
``catch_warnings`` apply, and nothing goes to stderr behind Python's back.
Each case runs in its own process (threads, exit, fork), with a time limit.
"""

import json
import textwrap

import pytest

from isolated import run_isolated, run_script

# Records every warning from here on, then waits on the main thread (running
# bytecode, where queued warnings are issued) until one containing NEEDLE was
# caught, for at most 20 s.
WAIT_FOR = """
import time, warnings
recording = warnings.catch_warnings(record=True)
caught = recording.__enter__()
warnings.simplefilter("always")
def wait_for(needle):
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

# Sinks that meet trouble while they handle an event, on the thread that
# logged it (here the main thread, inside log_event): no Python caller
# converts c10 warnings there either. stdout is put back at once, so the
# test's own lines reach it.
CONSOLE_WARNING = """
import datetime, os
import torch_monitor as tm
saved = os.dup(1)
os.dup2(BROKEN_STDOUT, 1)
sink = tm.ConsoleHandler("stdout")
sink.register()
try:
    tm.log_event(tm.Event("e", datetime.datetime.now(), {"x": 1}))
finally:
    os.dup2(saved, 1)
"""
CONSOLE_READER_GONE = CONSOLE_WARNING.replace(
    "BROKEN_STDOUT", "(lambda r, w: (os.close(r), w)[1])(*os.pipe())")
CONSOLE_DISK_FULL = CONSOLE_WARNING.replace("BROKEN_STDOUT", 'os.open("/dev/full", os.O_WRONLY)')

# A writer whose FIFO reader never reads: its buffer fills while log_event
# appends.
BUFFER_FULL_WARNING = """
import datetime, os, tempfile
import torch_monitor as tm
fifo = os.path.join(tempfile.mkdtemp(), "events.fifo")
os.mkfifo(fifo)
reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open, never read
sink = tm.JsonLinesWriter(fifo, flush_interval=0.01, max_buffer_bytes=64 << 10)
sink.register()
for i in range(20000):
    tm.log_event(tm.Event("e", datetime.datetime.now(), {"i": i, "pad": "x" * 40}))
"""

CASES = {
    "window-timer": (TIMER_WARNING, "window timer"),
    "sink-writer-thread": (SINK_WARNING, "/dev/full"),
    "console-reader-gone": (CONSOLE_READER_GONE, "went away"),
    "console-disk-full": (CONSOLE_DISK_FULL, "cannot write to stdout"),
    "sink-buffer-full": (BUFFER_FULL_WARNING, "buffer is full"),
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
    # The setup is inside the try: a warning of the main thread's own call
    # is raised at its next bytecode, which may still be in the setup.
    out = run_isolated(
        "import warnings, time\n"
        "warnings.simplefilter('error', RuntimeWarning)\n"
        "try:\n" + textwrap.indent(setup, "    ") + """
    deadline = time.monotonic() + 20
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
    caught.clear()  # the parent's warnings came with the fork
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


# ---------------------------------------------------------------------------
# The exit sequence runs whatever the warning filters say (issue 17, item 1)

# Thousands of close_on_time Stats whose handler fails on the window timer's
# thread: background warnings are queued the whole time, and still are when
# the interpreter exits. A JSON Lines writer must get every Stat's windows.
EXIT_UNDER_ERROR_FILTER = """
import json, sys, threading, time
import torch_monitor as tm
count, log = int(sys.argv[1]), sys.argv[2]
def handler(event):
    if isinstance(threading.current_thread(), threading._DummyThread):
        raise RuntimeError("boom")
tm.register_event_handler(handler)
writer = tm.JsonLinesWriter(log, flush_interval=3600)
writer.register()
stats = [tm.Stat(f"s{i}", ["count"], 0.001, close_on_time=True) for i in range(count)]
try:
    for r in range(5):
        for s in stats:
            s.add(1.0)
        time.sleep(0.05)
except RuntimeWarning:
    pass  # -W error: a queued warning raised here, as documented
"""


@pytest.mark.parametrize("how", ["-W error", "simplefilter"])
def test_warnings_as_errors_cannot_skip_the_exit_sequence(tmp_path, how):
    # Before: the first queued warning was raised at the first line of the
    # Python exit hook, none of its steps ran, and the window timer called
    # the handler during interpreter finalisation: SIGABRT, an empty file.
    script = tmp_path / "exit_under_error_filter.py"
    source = EXIT_UNDER_ERROR_FILTER
    env = {"PYTHONWARNINGS": "error"}
    if how == "simplefilter":
        source = "import warnings\nwarnings.simplefilter('error')\n" + source
        env = {}
    script.write_text(source)
    log = tmp_path / "events.jsonl"
    out = run_script(script, 3000, log, env=env, timeout=120, check=False)
    # The warnings are still raised (exit status 1 when one hit the script,
    # "Exception ignored in atexit callback" when it came at exit), but the
    # process was not killed and nothing ran into a finalised interpreter.
    assert out.returncode in (0, 1), out.describe()
    assert "Fatal Python error" not in out.stderr, out.describe()
    # Every Stat's last window was closed and written at exit.
    seen = set()
    for line in log.read_text().splitlines():
        seen.update(key.split(".")[0] for key in json.loads(line)["data"])
    assert seen == {f"s{i}" for i in range(3000)}, (len(seen), out.describe())


def test_exit_sequence_unregisters_python_handlers_for_good():
    # After the sequence no thread of the library calls into Python: a
    # handler found registered before is not called, the window timer is
    # stopped, later background warnings go to stderr.
    out = run_isolated(
        """
import atexit, datetime, threading, time
import torch_monitor as tm
calls = []
tm.register_event_handler(lambda e: calls.append(threading.current_thread().name))
stat = tm.Stat("last", [tm.COUNT], datetime.timedelta(hours=1))
stat.add(1.0)
atexit._run_exitfuncs()  # what exit runs
assert calls == ["MainThread"], calls  # the last window, closed by the sequence
timed = tm.Stat("timed", [tm.COUNT], 0.01, close_on_time=True)
timed.add(1.0)
time.sleep(0.3)  # the timer no longer runs: nothing closes the window
tm.log_event(tm.Event("after", datetime.datetime.now(), {}))
assert calls == ["MainThread"], calls
print("ok")
"""
    )
    assert out.stdout.strip() == "ok", out.describe()


# ---------------------------------------------------------------------------
# The queue is bounded (issue 17, item 4)


def test_warnings_queued_for_a_blocked_main_thread_are_bounded():
    # The main thread waits in C (join()) while scripted code (no GIL)
    # feeds 300 Stats whose windows close every millisecond on the timer's
    # thread, and a handler fails there on each: hundreds of thousands of
    # warnings used to pile up. At most 1000 wait, then one says how many
    # more were dropped.
    out = run_isolated(
        """
import threading, time, warnings
from typing import List
import torch
import torch_monitor as tm

def failing(event):
    if isinstance(threading.current_thread(), threading._DummyThread):
        raise RuntimeError("sink down")  # on the timer's thread only
tm.register_event_handler(failing)
stats = [tm.Stat(f"f{i}", ["count"], 0.001, close_on_time=True) for i in range(300)]

@torch.jit.script
def pump(stats: List[torch.classes.torch_monitor.Stat], rounds: int) -> int:
    for _ in range(rounds):
        for s in stats:
            s.add(1.0)
    return rounds

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rounds, blocked = 1, 0.0
    # Until the main thread was blocked in join() (no bytecode) for 1 s.
    while blocked < 1.0:
        thread = threading.Thread(target=pump, args=(stats, rounds))
        started = time.monotonic()
        thread.start()
        thread.join()
        blocked = time.monotonic() - started
        rounds *= 2
    for _ in range(50):
        time.sleep(0.01)  # bytecode: the queued warnings are issued
    messages = [str(w.message) for w in caught]
failed = [m for m in messages if "sink down" in m]
dropped = [m for m in messages if "were dropped" in m]
print("failed", len(failed), "dropped", len(dropped))  # dropped: deliveries that dropped
print(dropped[0] if dropped else "")
"""
        ,
        timeout=120,
    )
    dropped = int(out.stdout.split()[3])
    assert dropped >= 1, out.describe()
    assert "1000 were already waiting for the main thread" in out.stdout, out.describe()


# ---------------------------------------------------------------------------
# Every route a sink warns by ends in a RuntimeWarning (issue 17, item 16)


def test_sink_warnings_are_runtime_warnings_on_every_route(tmp_path):
    # Constructors (the caller's thread), the flusher thread, and a sink's
    # handle() on whichever thread closes a window: PrometheusTextFile's
    # write failures during Stat.add went to stderr, bypassing `warnings`.
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where a directory is expected
    gone = tmp_path / "gone"
    gone.mkdir()
    out = run_isolated(
        f"""
import shutil, time, warnings
import torch_monitor as tm
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tm.TensorBoardWriter({str(blocked / "tb")!r}, flush_interval=3600).close()
    tm.JsonLinesWriter({str(blocked / "x.jsonl")!r}, flush_interval=3600).close()
    tm.PrometheusTextFile({str(blocked / "x.prom")!r}).close()
print("constructors:", sorted({{w.category.__name__ for w in caught}}), len(caught))
text_file = tm.PrometheusTextFile({str(gone / "x.prom")!r})
text_file.register()
shutil.rmtree({str(gone)!r})
stat = tm.Stat("closes", [tm.COUNT], window_steps=1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tm.set_step(0); stat.add(1.0); tm.set_step(1); stat.add(1.0)  # handle() writes: fails
    for _ in range(100):
        time.sleep(0.01)  # bytecode: where queued warnings are issued
print("handle:", [w.category.__name__ for w in caught if "retried at the next window" in str(w.message)])
"""
    )
    assert "constructors: ['RuntimeWarning'] 3" in out.stdout, out.describe()
    assert "handle: ['RuntimeWarning']" in out.stdout, out.describe()
    assert "retried at the next window" not in out.stderr, out.describe()
