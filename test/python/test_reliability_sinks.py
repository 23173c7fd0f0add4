"""Reliability of the native sinks (the SINK rows of the reliability contract).

No fault of a destination may stop, kill or block training: a pipe whose
reader left (SIGPIPE), a FIFO without a reader or with a stalled one, fork()
while other threads log, process exit with a stalled reader; and arguments
are checked (append is a bool, paths are UTF-8 without NUL, a directory is
not a JSON Lines file). Everything that could crash or hang runs in a child
process with a time limit, so a regression fails one test, not the suite.
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import load_module
from isolated import run_isolated


@pytest.fixture
def tm():
    return load_module("torch_monitor")


# ------------------------------------------------------------ SIGPIPE

# Logs events slowly into `SINK`, with SIGPIPE at its default disposition (as
# in every C++ program; Python ignores it unless told otherwise), while the
# parent reads one line of its stdout and then closes the pipe.
PIPE_WRITER = """
import signal, sys, time, warnings
warnings.simplefilter("always")
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
import torch_monitor as tm
sink = SINK
sink.register()
for i in range(300):
    tm.log_event(tm.Event("step", __import__("datetime").datetime.now(), {"i": i}))
    if FLUSH:
        sink.flush()
    time.sleep(0.005)
print(f"alive dropped={sink.dropped} problems={len(sink.problems)}", file=sys.stderr)
"""


def run_with_closed_pipe(sink, flush, timeout=60):
    code = PIPE_WRITER.replace("SINK", sink).replace("FLUSH", str(flush))
    child = subprocess.Popen(
        [sys.executable, "-P", "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONFAULTHANDLER="1"),
    )
    try:
        first = child.stdout.readline()  # like `| head -1`
        child.stdout.close()
        _, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"hang: the writer did not finish within {timeout} s")
    return child.returncode, first, err.decode(errors="replace")


@pytest.mark.parametrize(
    "sink, flush",
    [
        ('tm.JsonLinesWriter("/dev/stdout", flush_interval=0.01)', False),
        ('tm.JsonLinesWriter("/dev/stdout", flush_interval=3600)', True),
        ('tm.ConsoleHandler("stdout")', False),
    ],
    ids=["jsonl-flusher-thread", "jsonl-flush-call", "console"],
)
def test_closed_pipe_is_one_warning_not_sigpipe(tm, sink, flush):
    code, first, err = run_with_closed_pipe(sink, flush)
    assert code == 0, f"exit status {code} (-13 is SIGPIPE)\n{err[-3000:]}"
    assert first, "the reader got no line"
    assert "alive dropped=" in err, err[-3000:]
    dropped = int(err.split("alive dropped=")[1].split()[0])
    assert dropped > 0
    # One warning, saying what happened and what follows.
    assert "problems=1" in err, err[-3000:]
    warned = [l for l in err.splitlines() if "went away" in l]
    assert len(warned) == 1, err[-3000:]
    assert "further" in warned[0] and "dropped" in warned[0]


def test_a_console_on_a_pipe_that_does_not_block_writes_whole_lines(tm):
    """Some launchers hand a program a stdout pipe in O_NONBLOCK mode. With a
    slow reader the pipe fills: a line that did not fit was written in part,
    then the write failed (EAGAIN), and the next output was glued to the
    torn line. Now a line goes whole or not at all (counted dropped). The
    child's stdout is a pipe that nobody reads until the lines are logged."""
    out = run_isolated(
        """
        import fcntl, os
        import torch_monitor as tm
        report = os.fdopen(os.dup(1), "w")
        read_end, write_end = os.pipe()
        os.dup2(write_end, 1)
        fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_NONBLOCK)
        console = tm.ConsoleHandler("stdout")
        console.register()
        for i in range(50):
            tm.log_event("e", {"i": i, "pad": "x" * 10000})
        console.close()
        os.write(1, b"NEXT\\n")
        os.close(1)
        os.close(write_end)
        lines = os.fdopen(read_end, "rb").read().split(b"\\n")
        whole = all(line.endswith(b'x"') for line in lines[:-2])
        print(len(lines) - 2, console.dropped, whole, lines[-2], file=report)
        """
    )
    kept, dropped, whole, last = out.stdout.split()
    assert int(dropped) > 0 and int(kept) + int(dropped) == 50, out.stdout
    assert whole == "True" and last == "b'NEXT'", out.stdout


# ------------------------------------------------------------ FIFOs


def test_fifo_without_reader_warns_then_opens_when_a_reader_comes(tm, tmp_path):
    fifo = str(tmp_path / "events.fifo")
    os.mkfifo(fifo)
    run_isolated(
        f"""
        import datetime, json, threading, time, warnings
        import torch_monitor as tm
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            sink = tm.JsonLinesWriter({fifo!r}, flush_interval=3600)  # no hang
        messages = [str(w.message) for w in caught]
        assert len(messages) == 1, messages
        assert "no process has it open for reading" in messages[0], messages
        sink.register()
        for i in range(3):  # kept in memory until the FIFO opens
            tm.log_event(tm.Event("e", datetime.datetime.now(), {{"i": i}}))
        lines = []
        def read():
            with open({fifo!r}) as f:
                lines.extend(f)
        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.time() + 20
        with warnings.catch_warnings(record=True) as again:
            while len(lines) < 3 and time.time() < deadline:
                sink.flush()  # retries the open; reported once only
                time.sleep(0.05)
            sink.close()
        assert not again, [str(w.message) for w in again]
        reader.join(20)
        assert not reader.is_alive()
        assert [json.loads(l)["data"]["i"] for l in lines] == [0, 1, 2], lines
        """,
        timeout=60,
    )


def test_fifo_with_a_reader_gets_every_line(tm, tmp_path):
    fifo = str(tmp_path / "events.fifo")
    os.mkfifo(fifo)
    run_isolated(
        f"""
        import datetime, json, os, threading
        import torch_monitor as tm
        # A reader first (non-blocking open: no writer yet), then the writer.
        fd = os.open({fifo!r}, os.O_RDONLY | os.O_NONBLOCK)
        sink = tm.JsonLinesWriter({fifo!r}, flush_interval=0.01)
        os.set_blocking(fd, True)
        lines = []
        def read():
            with os.fdopen(fd) as f:
                lines.extend(f)
        reader = threading.Thread(target=read)
        reader.start()
        with sink:
            for i in range(20000):  # several pipe buffers' worth
                tm.log_event(tm.Event("e", datetime.datetime.now(), {{"i": i}}))
        reader.join(20)
        assert not reader.is_alive()
        assert sink.problems == [], sink.problems
        assert sink.dropped == 0
        assert [json.loads(l)["data"]["i"] for l in lines] == list(range(20000))
        """,
        timeout=60,
    )


# A reader that opens the FIFO and never reads: the pipe fills up (64 KiB).
STALLED_READER = """
import datetime, os, time, warnings
warnings.simplefilter("always")
import torch_monitor as tm
reader = os.open(FIFO, os.O_RDONLY | os.O_NONBLOCK)  # kept open, never read
sink = tm.JsonLinesWriter(FIFO, flush_interval=0.01, max_buffer_bytes=256 << 10)
sink.register()
for i in range(20000):  # about 2 MB of lines
    tm.log_event(tm.Event("e", datetime.datetime.now(), {"i": i, "pad": "x" * 40}))
    if i % 1000 == 0:
        time.sleep(0.01)
"""


def test_stalled_fifo_reader_costs_dropped_data_not_a_hang(tm, tmp_path):
    fifo = str(tmp_path / "events.fifo")
    os.mkfifo(fifo)
    out = run_isolated(
        STALLED_READER.replace("FIFO", repr(fifo))
        + textwrap.dedent(
            """
            start = time.monotonic()
            sink.flush()  # never waits for the reader
            flushed = time.monotonic() - start
            with warnings.catch_warnings(record=True) as caught:
                start = time.monotonic()
                sink.close()  # waits a bounded time for the reader
                closed = time.monotonic() - start
            print(f"flush={flushed:.3f} close={closed:.3f} dropped={sink.dropped}")
            for p in sink.problems:
                print("problem:", p)
            """
        ),
        timeout=60,
    )
    stats = dict(kv.split("=") for kv in out.stdout.splitlines()[0].split())
    assert float(stats["flush"]) < 0.5
    assert float(stats["close"]) < 5.0
    assert int(stats["dropped"]) > 0
    problems = [l for l in out.stdout.splitlines() if l.startswith("problem:")]
    assert sum("in-memory buffer is full" in p for p in problems) == 1, problems
    assert any("did not take them" in p for p in problems), problems


def test_exit_with_a_stalled_fifo_reader_is_bounded(tm, tmp_path):
    # The writer stays registered (owned by the registry): the at-exit flush
    # meets the full pipe and must give up within its bound.
    fifo = str(tmp_path / "events.fifo")
    os.mkfifo(fifo)
    start = time.monotonic()
    out = run_isolated(STALLED_READER.replace("FIFO", repr(fifo)), timeout=60)
    assert time.monotonic() - start < 30, out.stderr[-2000:]
    assert "could not be written before close" in out.stderr, out.stderr[-2000:]


def test_a_directory_is_not_a_json_lines_path(tm, tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        tm.JsonLinesWriter(tmp_path)


def test_character_devices_still_work(tm):
    import datetime

    with tm.JsonLinesWriter("/dev/null", flush_interval=3600) as sink:
        for i in range(100):
            tm.log_event(tm.Event("e", datetime.datetime.now(), {"i": i}))
        sink.flush()
    assert sink.problems == [] and sink.dropped == 0
    # /dev/full refuses every write: the loss at close names no reader (it
    # said "the reader did not take them within 1 s").
    with pytest.warns(RuntimeWarning, match="No space left"):
        with tm.JsonLinesWriter("/dev/full", flush_interval=3600) as full:
            tm.log_event(tm.Event("e", datetime.datetime.now(), {"i": 1}))
    assert full.dropped == 1
    lost = [p for p in full.problems if "lost" in p]
    assert len(lost) == 1 and "reader" not in lost[0], full.problems


def test_a_program_with_its_stdout_closed_keeps_its_files_whole(tmp_path):
    """With descriptor 1 closed (`prog >&-`, a daemon) the first file opened
    would be given number 1, and a console sink writing to "stdout" wrote
    into the TensorBoard event file (which then read back empty) and into
    the JSON Lines file, losing nothing it counted. The files' descriptors
    stay above the standard streams; the console counts its lines lost."""
    out = run_isolated(
        f"""
        import json, os
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        import torch_monitor as tm
        report = os.fdopen(os.dup(1), "w")
        os.close(1)
        logdir, path = {str(tmp_path / "tb")!r}, {str(tmp_path / "events.jsonl")!r}
        console = tm.ConsoleHandler("stdout")
        tb = tm.TensorBoardWriter(logdir, event_names=None)
        jsonl = tm.JsonLinesWriter(path)
        text = tm.PrometheusTextFile({str(tmp_path / "m.prom")!r})
        for sink in (console, tb, jsonl, text):
            sink.register()
        for i in range(3):
            tm.log_event("e", {{"loss.mean": float(i)}})
        for sink in (tb, jsonl, text, console):
            sink.close()
        acc = EventAccumulator(logdir)
        acc.Reload()
        lines = [json.loads(line)["name"] for line in open(path)]
        print([s.value for s in acc.Scalars("loss.mean")], lines, console.dropped, file=report)
        """,
        check=False,
    )
    assert out.stdout.strip().splitlines()[-1] == "[0.0, 1.0, 2.0] ['e', 'e', 'e'] 3", out.describe()


# ------------------------------------------------------------ fork

# Threads log through every sink kind while the main thread forks; each child
# logs one event, reads the memory handler and leaves with os._exit. A child
# that deadlocks on a lock a parent thread held is killed by its alarm. The
# threads log from TorchScript, which runs without the GIL (as a scripted
# model served from a thread pool does): threads logging from Python hold
# the GIL, which os.fork() holds too, so they could never be inside a sink.
FORK_WHILE_LOGGING = """
import datetime, json, os, signal, sys, threading, time, warnings
warnings.simplefilter("ignore")  # fork() with threads: DeprecationWarning
import torch
import torch_monitor as tm

burst = torch.jit.CompilationUnit(\'\'\'
def burst(k: int, first: int, count: int) -> int:
    for n in range(first, first + count):
        event = torch.classes.torch_monitor.Event("parent")
        event.set_int("k", k)
        event.set_int("n", n)
        torch.ops.torch_monitor.log_event(event)
    return count
\'\'\').burst

report = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the console's lines go nowhere
memory = tm.MemoryHandler(100)
console = tm.ConsoleHandler("stdout")
jsonl = tm.JsonLinesWriter(JSONL, flush_interval=0.001)
tb = tm.TensorBoardWriter(LOGDIR, flush_interval=0.001, event_names=None)
for sink in (memory, console, jsonl, tb):
    sink.register()

stop = threading.Event()
logged = [0] * 3
# The threads' path runs here first (TorchScript profiles and optimises
# burst on its first calls; the first event through each sink): a child
# forked while a thread made the process's first pass through it could find
# one of torch's function-local statics half built.
for _ in range(3):
    logged[0] += burst(0, logged[0], 1)
def log(k):
    while not stop.is_set():
        logged[k] += burst(k, logged[k], 200)
threads = [threading.Thread(target=log, args=(k,)) for k in range(3)]
for t in threads:
    t.start()

hung = []
for attempt in range(FORKS):
    time.sleep(0.002)
    pid = os.fork()
    if pid == 0:
        signal.alarm(5)  # a deadlocked child dies of SIGALRM
        tm.log_event(tm.Event("child", datetime.datetime.now(), {"pid": os.getpid()}))
        names = [e.name for e in memory.events()]
        ok = names[-1] == "child" and len(memory) <= 100 and console.dropped == 0
        jsonl.flush(); tb.flush(); jsonl.close(); tb.close()  # inert here
        os._exit(0 if ok else 3)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = -1
            break
        time.sleep(0.001)
    if status != 0:
        hung.append((attempt, status))
        if len(hung) == 3:
            break  # enough evidence
stop.set()
for t in threads:
    t.join()
for sink in (memory, console, jsonl, tb):
    sink.close()
lines = [json.loads(l) for l in open(JSONL)]
print(json.dumps({"hung": hung, "logged": sum(logged), "lines": len(lines),
                  "dropped": jsonl.dropped,
                  "names": sorted({l["name"] for l in lines}),
                  "unique": len({(l["data"]["k"], l["data"]["n"]) for l in lines})}),
      file=report, flush=True)
"""


def test_fork_while_threads_log_never_deadlocks_the_child(tm, tmp_path):
    code = (
        FORK_WHILE_LOGGING.replace("JSONL", repr(str(tmp_path / "e.jsonl")))
        .replace("LOGDIR", repr(str(tmp_path / "tb")))
        .replace("FORKS", "50")
    )
    out = run_isolated(code, timeout=240)
    import json

    result = json.loads(out.stdout.splitlines()[-1])
    # status 14 << 0 (SIGALRM) or -1 (killed): a child deadlocked.
    assert result["hung"] == [], result["hung"]
    # The parent's records, each once: children wrote neither theirs nor
    # the parent's buffered ones.
    assert result["names"] == ["parent"]
    assert result["lines"] == result["unique"]
    assert result["lines"] + result["dropped"] == result["logged"]


# ------------------------------------------------------------ arguments


@pytest.mark.parametrize("value", ["no", "", 0, 1, None, 1.0])
def test_append_takes_only_a_bool(tm, tmp_path, value):
    with pytest.raises(TypeError, match="argument 'append' must be a bool"):
        tm.JsonLinesWriter(tmp_path / "e.jsonl", append=value)
    assert not (tmp_path / "e.jsonl").exists()


def test_append_is_a_bool_in_torchscript(tm, tmp_path):
    import torch

    path = str(tmp_path / "e.jsonl")
    cls = torch.classes.torch_monitor.JsonLinesWriter
    with pytest.raises(Exception, match="append"):
        cls(path, 1.0, 1 << 20, [], "no")
    with pytest.raises(Exception, match="bool"):

        @torch.jit.script
        def make(p: str):
            return torch.classes.torch_monitor.JsonLinesWriter(p, 1.0, 1 << 20, [], "no")

    assert not os.path.exists(path)
    cls(path, 1.0, 1 << 20, [], False).close()


@pytest.mark.parametrize(
    "writer, path, message",
    [
        ("JsonLinesWriter", "a\0b.jsonl", "argument 'path' contains a NUL character"),
        ("JsonLinesWriter", b"a\0b.jsonl", "argument 'path' contains a NUL byte"),
        ("JsonLinesWriter", b"\xffbad.jsonl", "argument 'path' is not valid UTF-8"),
        ("JsonLinesWriter", "\udcffbad.jsonl", "argument 'path' is not valid UTF-8"),
        ("TensorBoardWriter", "runs\0x", "argument 'log_dir' contains a NUL character"),
        ("TensorBoardWriter", b"runs\xff", "argument 'log_dir' is not valid UTF-8"),
    ],
)
def test_writer_path_must_be_utf8_without_nul(tm, tmp_path, writer, path, message):
    if isinstance(path, bytes):
        path = os.fsencode(str(tmp_path)) + b"/" + path
    else:
        path = str(tmp_path) + "/" + path
    with pytest.raises(ValueError, match=message):
        getattr(tm, writer)(path)
    assert os.listdir(tmp_path) == []


def test_torchscript_paths_are_checked_by_the_constructors(tm, tmp_path):
    import torch

    classes = torch.classes.torch_monitor
    # The one text check of every constructor (issue 25) names the argument.
    with pytest.raises(ValueError, match="JsonLinesWriter\\(\\) argument 'path' contains a NUL byte"):
        classes.JsonLinesWriter(str(tmp_path / "a\0b"), 1.0, 1 << 20, [], True)
    with pytest.raises(ValueError, match="TensorBoardWriter\\(\\) argument 'log_dir' contains a NUL byte"):
        classes.TensorBoardWriter(str(tmp_path / "a\0b"), 1.0, 1 << 20, [], "")
    with pytest.raises(ValueError, match="is a directory"):
        classes.JsonLinesWriter(str(tmp_path), 1.0, 1 << 20, [], True)
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------ round two (issue 17)


def test_exporter_does_not_spin_when_the_process_is_out_of_descriptors(tm):
    # accept4 failed with EMFILE, the listening socket stayed readable and
    # poll() returned at once: 4.9 s of CPU in 5 s, the waiting client
    # unserved until descriptors were freed. Now the server leaves the
    # listening socket alone for a while, warns once, and serves the client
    # as soon as a descriptor is free again.
    out = run_isolated(
        """
        import os, resource, socket, time, warnings
        import torch_monitor as tm
        warnings.simplefilter("always")
        exporter = tm.PrometheusExporter()
        client = socket.socket()  # made before the descriptors run out
        client.settimeout(10)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        filler = []
        try:
            while True:
                filler.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        client.connect(("127.0.0.1", exporter.port))  # queued: no fd to accept it
        client.sendall(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        cpu = time.process_time()
        time.sleep(2.0)
        cpu = time.process_time() - cpu
        for fd in filler:
            os.close(fd)
        response = b""
        while b"\\r\\n\\r\\n" not in response:
            chunk = client.recv(4096)
            if not chunk:
                break
            response += chunk
        print("cpu", round(cpu, 3))
        print("status", response.split(b"\\r\\n")[0].decode())
        print("problems", exporter.problems)
        """,
        timeout=60,
    )
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert float(lines["cpu"]) < 0.5, out.describe()  # was ~2.0: a spinning core
    assert lines["status"] == "HTTP/1.1 200 OK", out.describe()
    assert "cannot accept connections: Too many open files" in lines["problems"], out.describe()


def test_a_huge_request_head_gets_its_431(tm):
    # A 1 MB header used to get a connection reset (the server closed with
    # unread bytes) instead of the documented 431.
    import socket

    exporter = tm.PrometheusExporter()
    try:
        for size in (20_000, 1_000_000):
            with socket.create_connection(("127.0.0.1", exporter.port), timeout=10) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * size + b"\r\n\r\n")
                response = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    response += chunk
            assert response.startswith(b"HTTP/1.1 431 "), (size, response[:200])
        # Garbage is still answered too, and a good scrape follows.
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=10) as s:
            s.sendall(bytes(range(256)) * 64)
            assert s.recv(100).startswith(b"HTTP/1.1 400 ")
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5) as r:
            assert r.status == 200
    finally:
        exporter.close()


def test_count_total_is_a_counter_whatever_the_counts_logged(tm):
    # _count_total added raw event values through undefined int conversions:
    # three counts of 2**62 gave -4.6e18, a NaN count gave INT64_MIN, and a
    # negative count made the counter go down.
    import datetime

    from prometheus_client import parser

    sink = tm.PrometheusExporter()

    def total():
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        for family in parser.text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "torch_monitor_c_count_total":
                    return sample.value
        raise AssertionError(text)

    def log(count):
        tm.log_event(tm.Event("torch.monitor.Stat", datetime.datetime.now(), {"c.count": count}))

    sink.register()
    try:
        for _ in range(3):
            log(2**62)
        assert total() == 3 * 2.0**62
        log(float("nan"))
        assert total() == 3 * 2.0**62
        log(-5)
        log(-1e300)
        assert total() == 3 * 2.0**62
        log(float("inf"))
        assert total() == 3 * 2.0**62
        log(2.5)
        assert total() == 3 * 2.0**62 + 2.5
    finally:
        sink.close()


def test_histogram_of_a_large_cpu_tensor_needs_no_copy_of_it():
    # add_histogram on the CPU converted the whole input to float64
    # (reshape(-1).to(double)): a 381 MB float32 tensor raised the peak RSS
    # by 767 MB, and an expanded tensor was materialised. Now it is bucketed
    # in chunks of 2**20 elements; the result is unchanged.
    out = run_isolated(
        """
        import resource
        import numpy as np
        import torch
        import torch_monitor as tm
        from torch_monitor import _C
        from torch.utils.tensorboard.summary import histogram
        torch.manual_seed(0)
        big = torch.randn(25_000_000)  # 100 MB of float32
        expanded = torch.ones(1).expand(50_000_000)  # 4 bytes, 50 M elements
        # Warm up (libraries, thread pools) on a small tensor first.
        tm.TensorBoardWriter(__import__("tempfile").mkdtemp(), flush_interval=3600).close()
        def peak_mb():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        w = tm.TensorBoardWriter(__import__("tempfile").mkdtemp(), flush_interval=3600)
        w.add_histogram("warm", torch.randn(3_000_000), 0)
        before = peak_mb()
        w.add_histogram("big", big, 1)
        w.add_histogram("expanded", expanded, 2)
        grown = peak_mb() - before
        print("grown", round(grown))
        w.close()
        """,
        timeout=300,
    )
    grown = float(out.stdout.split()[1])
    assert grown < 60, out.describe()  # was > 300 MB (a float64 copy and more)


def test_prometheus_text_file_refuses_a_directory(tm, tmp_path):
    # JsonLinesWriter refused a directory as its path; PrometheusTextFile
    # accepted one (and failed to rename over it at every window).
    with pytest.raises(ValueError, match="is a directory"):
        tm.PrometheusTextFile(tmp_path)
    import torch

    with pytest.raises(ValueError, match="is a directory"):
        torch.classes.torch_monitor.PrometheusTextFile(str(tmp_path), {})
