"""The native sinks (TensorBoardWriter, JsonLinesWriter, ConsoleHandler,
MemoryHandler) from Python, from TorchScript and from a process that only
loads the library and a saved scripted model.

Every TensorBoard file is read back with TensorBoard's own reader
(EventAccumulator / EventMultiplexer): that reader is the oracle.
"""

import datetime
import errno
import json
import math
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from tensorboard.backend.event_processing import event_multiplexer  # noqa: E402

from conftest import load_module  # noqa: E402

UTC = datetime.timezone.utc
STAT_EVENT = "torch.monitor.Stat"


@pytest.fixture
def tm():
    return load_module("torch_monitor")


@pytest.fixture
def registered(tm):
    """Registers handlers for one test and always unregisters them."""
    handles = []

    def register(handler):
        handles.append(tm.register_event_handler(handler))
        return handles[-1]

    yield register
    for handle in handles:
        tm.unregister_event_handler(handle)


def f32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def read_scalars(logdir):
    """{tag: [(step, value, wall_time), ...]} as TensorBoard reads them."""
    acc = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    return {
        tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }


def event_files(logdir):
    return sorted(p for p in os.listdir(logdir) if "tfevents" in p)


def stat_event(tm, micros, data):
    stamp = datetime.datetime.fromtimestamp(micros / 1e6, tz=UTC)
    return tm.Event(STAT_EVENT, stamp, data)


def run_python(code, cwd, timeout=120):
    """Runs code in a fresh interpreter (not importing the source folder)."""
    return subprocess.run(
        [sys.executable, "-P", "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------ TensorBoard


def test_python_events_read_back_by_tensorboard(tm, registered, tmp_path):
    logdir = tmp_path / "run"
    writer = tm.TensorBoardWriter(logdir, flush_interval=3600)
    registered(writer)
    base = 1_714_566_896_000_000
    expected = {"loss.mean": [], "loss.count": [], "ok": []}
    for i in range(50):
        micros = base + i * 1_000_001
        value = 0.1 * i - 2.0
        tm.log_event(
            stat_event(
                tm,
                micros,
                {"loss.mean": value, "loss.count": i * 3, "ok": i % 2 == 0, "note": "skipped"},
            )
        )
        wall = micros / 1e6
        expected["loss.mean"].append((i, f32(value), wall))
        expected["loss.count"].append((i, float(i * 3), wall))
        expected["ok"].append((i, 1.0 if i % 2 == 0 else 0.0, wall))
    tm.log_event(tm.Event("other", datetime.datetime.now(UTC), {"loss.mean": 1.0}))
    writer.close()

    files = event_files(logdir)
    assert len(files) == 1
    name = files[0].split(".")
    assert name[:3] == ["events", "out", "tfevents"]
    assert len(name[3]) == 10 and name[3].isdigit()
    assert name[-2] == str(os.getpid())
    assert writer.file_path == str(logdir / files[0])

    scalars = read_scalars(logdir)
    assert set(scalars) == set(expected)  # "note" (a string) is skipped
    for tag, points in expected.items():
        got = scalars[tag]
        assert [p[0] for p in got] == [p[0] for p in points], tag
        assert [p[1] for p in got] == pytest.approx([p[1] for p in points], abs=0), tag
        assert [p[2] for p in got] == pytest.approx([p[2] for p in points], abs=1e-6), tag


def test_stat_windows_become_curves_with_steps(tm, registered, tmp_path):
    from torch_monitor.testing import fake_clock

    logdir = tmp_path / "run"
    with tm.TensorBoardWriter(logdir, flush_interval=3600) as writer:
        assert writer.registered
        with fake_clock(0) as clock:
            stat = tm.Stat("loss", [tm.Aggregation.MEAN, tm.Aggregation.MAX], 1.0)
            for window in range(10):
                stat.add(float(window))
                stat.add(float(window) + 2.0)
                clock.advance_ms(1000)
            stat.add(0.0)  # closes the tenth window
    assert writer.closed and not writer.registered
    scalars = read_scalars(logdir)
    assert [p[0] for p in scalars["loss.mean"]] == list(range(10))
    assert [p[1] for p in scalars["loss.mean"]] == [w + 1.0 for w in range(10)]
    assert [p[1] for p in scalars["loss.max"]] == [w + 2.0 for w in range(10)]
    for _, _, wall in scalars["loss.mean"]:
        assert abs(wall - time.time()) < 3600


def test_event_multiplexer_sees_every_run(tm, tmp_path):
    for run in ("a", "b"):
        with tm.TensorBoardWriter(tmp_path / run, event_names=None) as writer:
            for step in range(5):
                writer.add_scalar(f"{run}/x", step * 1.5, step, walltime=1000.0 + step)
    mux = event_multiplexer.EventMultiplexer(size_guidance={event_accumulator.SCALARS: 0})
    mux.AddRunsFromDirectory(str(tmp_path))
    mux.Reload()
    assert set(mux.Runs()) == {"a", "b"}
    for run in ("a", "b"):
        points = mux.Scalars(run, f"{run}/x")
        assert [(p.step, p.value, p.wall_time) for p in points] == [
            (s, s * 1.5, 1000.0 + s) for s in range(5)
        ]


def test_step_key_event_names_and_64_bit_steps(tm, registered, tmp_path):
    writer = tm.TensorBoardWriter(
        tmp_path, flush_interval=3600, event_names="train", step_key="step"
    )
    registered(writer)
    stamp = datetime.datetime(2024, 5, 1, tzinfo=UTC)
    big = 2**40 + 7
    tm.log_event(tm.Event("train", stamp, {"step": big, "acc": 0.5}))
    tm.log_event(tm.Event("train", stamp, {"step": 3, "acc": 0.75}))
    tm.log_event(tm.Event(STAT_EVENT, stamp, {"acc": 9.0}))  # not "train"
    writer.close()
    scalars = read_scalars(tmp_path)
    assert set(scalars) == {"acc"}
    assert [(s, v) for s, v, _ in scalars["acc"]] == [(big, 0.5), (3, 0.75)]
    assert scalars["acc"][0][2] == stamp.timestamp()


def test_scripted_model_writes_tensorboard(tm, tmp_path):
    import torch

    class Model(torch.nn.Module):
        def __init__(self, logdir: str):
            super().__init__()
            self.writer = torch.classes.torch_monitor.TensorBoardWriter(logdir, 3600.0)
            self.memory = torch.classes.torch_monitor.MemoryHandler(100)

        def forward(self, step: int) -> int:
            self.writer.register()  # idempotent: safe on every call
            self.memory.register()
            e = torch.classes.torch_monitor.Event("torch.monitor.Stat")
            e.set_float("scripted.loss", 1.0 / (step + 1))
            e.set_int("scripted.step", step)
            e.set_timestamp_us(1_700_000_000_000_000 + step)
            torch.ops.torch_monitor.log_event(e)
            self.writer.add_scalar("scripted.direct", 2.0 * step, 100 + step, None)
            return len(self.memory.events())

    model = torch.jit.script(Model(str(tmp_path / "scripted")))
    try:
        for step in range(20):
            assert model(step) == step + 1
    finally:
        model.writer.close()
        model.memory.close()
    scalars = read_scalars(tmp_path / "scripted")
    assert [(s, v) for s, v, _ in scalars["scripted.loss"]] == [
        (i, f32(1.0 / (i + 1))) for i in range(20)
    ]
    assert [w for _, _, w in scalars["scripted.loss"]] == pytest.approx(
        [1_700_000_000 + i / 1e6 for i in range(20)], abs=1e-6
    )
    assert [(s, v) for s, v, _ in scalars["scripted.direct"]] == [
        (100 + i, 2.0 * i) for i in range(20)
    ]


def test_loaded_model_in_a_process_without_the_python_package(tm, tmp_path):
    """What a C++ program does: load the library, torch.jit.load, run."""
    import torch

    class Model(torch.nn.Module):
        def __init__(self, logdir: str):
            super().__init__()
            self.writer = torch.classes.torch_monitor.TensorBoardWriter(logdir, 3600.0)
            self.stat = tm.Stat("loaded", [tm.Aggregation.SUM], 0.001)

        def forward(self, x: float) -> float:
            self.writer.register()
            self.stat.add(x)
            return x

    logdir = tmp_path / "loaded"
    model = torch.jit.script(Model(str(logdir)))
    model.writer.close()  # the model is saved with the configuration only
    shutil.rmtree(logdir)
    model.save(str(tmp_path / "model.pt"))
    result = run_python(
        f"""
        import time, torch
        torch.ops.load_library({tm.library_path!r})
        model = torch.jit.load({str(tmp_path / "model.pt")!r})
        for i in range(30):
            model(float(i))
            time.sleep(0.004)
        # no close(): the writer is registered, and exit must flush it
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    scalars = read_scalars(logdir)
    points = scalars["loaded.sum"]
    assert len(points) >= 2
    assert [p[0] for p in points] == list(range(len(points)))
    assert sum(p[1] for p in points) <= sum(range(30))


def test_exit_flushes_a_registered_writer(tm, tmp_path):
    result = run_python(
        f"""
        import torch_monitor as tm
        w = tm.TensorBoardWriter({str(tmp_path)!r}, flush_interval=3600)
        tm.register_event_handler(w)
        for i in range(1000):
            w.add_scalar("x", float(i), i)
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    points = read_scalars(tmp_path)["x"]
    assert [(s, v) for s, v, _ in points] == [(i, float(i)) for i in range(1000)]


def test_sigkill_keeps_every_complete_record(tm, tmp_path):
    logdir = tmp_path / "killed"
    child = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-c",
            textwrap.dedent(
                f"""
                import sys, torch_monitor as tm
                w = tm.TensorBoardWriter({str(logdir)!r}, flush_interval=0.01,
                                         event_names=None)
                i = 0
                while True:
                    w.add_scalar("x", float(i), i, walltime=1e9 + i)
                    i += 1
                    if i == 20000:
                        w.flush()  # these are certainly on disk
                        print("flushed", flush=True)
                """
            ),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "flushed"
        time.sleep(0.3)  # several background flushes, likely one in flight
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert child.returncode == -signal.SIGKILL

    [name] = event_files(logdir)
    size = os.path.getsize(logdir / name)
    # Count the complete records ourselves: TensorBoard must read them all.
    with open(logdir / name, "rb") as f:
        data = f.read()
    complete, offset = 0, 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        if offset + 12 + length + 4 > len(data):
            break
        complete += 1
        offset += 12 + length + 4
    points = read_scalars(logdir)["x"]
    assert len(points) >= 20000
    assert len(points) == complete - 1  # all but the file_version record
    assert [(s, v) for s, v, _ in points] == [(i, float(i)) for i in range(len(points))]
    assert offset <= size


# ------------------------------------------------------------ JSON Lines


def random_text(rng):
    alphabet = ['"', "\\", "\n", "\r", "\t", "\x01", "\x1f", "\x7f", "é", "€", "😀", "a", " ", "/", "\u2028"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))


def random_bytes(rng):
    pieces = [b'"', b"\\", b"\n", b"\x00", b"\xff", b"\x80", b"\xc0\xaf", b"\xe2\x82", b"\xed\xa0\x80",
              b"\xf0\x9f\x98", b"\xf4\x90\x80\x80", "é".encode(), "😀".encode(), b"a", b"\x7f"]
    return b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 10)))


def test_jsonl_fuzz_every_line_parses_and_round_trips(tm, registered, tmp_path):
    rng = random.Random(1234)
    path = tmp_path / "logs" / "events.jsonl"
    writer = tm.JsonLinesWriter(path, flush_interval=3600)
    registered(writer)
    expected = []
    for i in range(300):
        if i % 2 == 0:  # valid Python text, logged from Python
            name = random_text(rng)
            data = {}
            for _ in range(rng.randrange(0, 5)):
                kind = rng.randrange(4)
                value = [
                    random_text(rng),
                    rng.choice([0.5, -2.0, 1e300, 5e-324, float("nan"), float("inf"), -float("inf"), rng.random()]),
                    rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randrange(-1000, 1000)]),
                    rng.random() < 0.5,
                ][kind]
                data[random_text(rng)] = value
            stamp = datetime.datetime.fromtimestamp(rng.randrange(0, 2**31) + rng.randrange(10**6) / 1e6, tz=UTC)
            tm.log_event(tm.Event(name, stamp, data))
            expected.append((name, data, stamp))
        else:  # raw bytes from C++: invalid UTF-8, encoded lone surrogates
            name = random_bytes(rng)
            data = {}
            for _ in range(rng.randrange(0, 4)):
                key = random_bytes(rng)
                decoded = {k.decode("utf-8", "replace") for k in data}
                if key.decode("utf-8", "replace") not in decoded:  # no JSON duplicates
                    data[key] = random_bytes(rng)
            tm._C._sinks_log_raw_event(name, data)
            expected.append(
                (
                    name.decode("utf-8", "replace"),
                    {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in data.items()},
                    None,
                )
            )
    writer.close()

    with open(path, "rb") as f:
        raw_lines = f.read().split(b"\n")
    assert raw_lines[-1] == b""
    lines = raw_lines[:-1]
    assert len(lines) == len(expected)
    def reject(token):
        raise ValueError(f"not strict JSON: bare {token}")

    for line, (name, data, stamp) in zip(lines, expected):
        # Strict UTF-8, and strict JSON: no bare NaN/Infinity tokens.
        obj = json.loads(line.decode("utf-8"), parse_constant=reject)
        assert set(obj) == {"name", "timestamp", "epoch_seconds", "data"}
        assert obj["name"] == name
        assert len(obj["data"]) == len(data)  # keys differ only if they collide
        for key, value in data.items():
            got = obj["data"][key]
            if isinstance(value, bool):
                assert got is value
            elif isinstance(value, int):
                assert type(got) is int and got == value
            elif isinstance(value, float):
                if math.isnan(value):
                    assert got == "NaN"
                elif math.isinf(value):
                    assert got == ("Infinity" if value > 0 else "-Infinity")
                else:
                    assert type(got) is float and got == value
                assert float(got) == value or math.isnan(value)
            else:
                assert got == value
        if stamp is not None:
            assert obj["epoch_seconds"] == pytest.approx(stamp.timestamp(), abs=1e-6)
            parsed = datetime.datetime.strptime(obj["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
            assert parsed.replace(tzinfo=UTC) == stamp


def test_jsonl_append_and_truncate(tm, tmp_path):
    path = tmp_path / "e.jsonl"
    for _ in range(2):
        with tm.JsonLinesWriter(path):
            tm.log_event(tm.Event("x", datetime.datetime.now(UTC), {"a": 1}))
    assert len(path.read_text().splitlines()) == 2
    with tm.JsonLinesHandler(path, append=False):
        tm.log_event(tm.Event("y", datetime.datetime.now(UTC), {}))
    [line] = path.read_text().splitlines()
    assert json.loads(line)["name"] == "y"


def test_jsonl_appended_to_an_open_line_starts_a_line_of_its_own(tm, tmp_path):
    # Another program (or a killed one) left the file's last line without
    # its newline: the first record was glued to it and lost to readers.
    path = tmp_path / "e.jsonl"
    path.write_text('{"from": "another tool"}\n{"cut": ')
    with tm.JsonLinesWriter(path):
        tm.log_event(tm.Event("x", datetime.datetime.now(UTC), {"a": 1}))
    lines = path.read_text().split("\n")
    assert lines[:2] == ['{"from": "another tool"}', '{"cut": '] and lines[-1] == ""
    assert json.loads(lines[2])["name"] == "x" and len(lines) == 4
    with tm.JsonLinesWriter(path):  # ends with a newline now: nothing added
        tm.log_event(tm.Event("y", datetime.datetime.now(UTC), {}))
    assert [json.loads(line)["name"] for line in path.read_text().splitlines()[2:]] == ["x", "y"]


# ------------------------------------------------------------ console, memory


def test_console_handler_prints_one_line_per_event(tm, capfd):
    with tm.ConsoleHandler("stdout", event_names=["shown"]):
        stamp = datetime.datetime(2024, 5, 1, 12, 34, 56, 123456, tzinfo=UTC)
        tm.log_event(tm.Event("shown", stamp, {"b": 2, "a": 0.5, "s": "two\nlines", "ok": True}))
        tm.log_event(tm.Event("hidden", stamp, {}))
    out, _ = capfd.readouterr()
    assert out == '2024-05-01T12:34:56.123456Z shown a=0.5 b=2 ok=true s="two\\nlines"\n'


def test_console_handler_default_is_stderr(tm, capfd):
    handler = tm.ConsoleHandler()
    assert handler.stream == "stderr"
    with handler:
        tm.log_event(tm.Event("to.stderr", datetime.datetime.now(UTC), {}))
    out, err = capfd.readouterr()
    assert "to.stderr" in err and "to.stderr" not in out


def test_memory_handler(tm):
    memory = tm.MemoryHandler(3, event_names=("a", "b"))
    assert memory.capacity == 3 and len(memory) == 0
    with memory:
        for i in range(5):
            tm.log_event(tm.Event("a", datetime.datetime.now(UTC), {"i": i}))
        tm.log_event(tm.Event("c", datetime.datetime.now(UTC), {"i": 99}))
        events = memory.events()
        assert [e.data["i"] for e in events] == [2, 3, 4]
        assert all(isinstance(e, tm.Event) for e in events)
        assert memory.dropped == 2
        memory.clear()
        assert len(memory) == 0
        tm.log_event(tm.Event("b", datetime.datetime.now(UTC), {"flag": True}))
        assert memory.events()[0].data == {"flag": True}
    tm.log_event(tm.Event("a", datetime.datetime.now(UTC), {}))
    assert len(memory) == 1  # closed by `with`: nothing more arrives


# ------------------------------------------------------------ registration


def test_register_accepts_native_sinks_and_torch_classes(tm):
    import torch

    memory = tm.MemoryHandler()
    handle = tm.register_event_handler(memory)
    assert isinstance(handle, tm.EventHandlerHandle)
    scripted = torch.classes.torch_monitor.MemoryHandler(10)
    scripted_handle = tm.register_event_handler(scripted)
    try:
        # Python handlers are all unregistered at interpreter exit; native
        # ones must stay so that the at-exit flush still sees their events.
        tm._C._unregister_python_handlers()
        tm.log_event(tm.Event("x", datetime.datetime.now(UTC), {}))
        assert len(memory) == 1
        assert scripted.size() == 1
    finally:
        tm.unregister_event_handler(handle)
        tm.unregister_event_handler(scripted_handle)
    tm.log_event(tm.Event("x", datetime.datetime.now(UTC), {}))
    assert len(memory) == 1 and scripted.size() == 1

    tm.register_event_handler(memory)
    tm.unregister_event_handler(memory)  # the sink itself works as a handle
    tm.log_event(tm.Event("x", datetime.datetime.now(UTC), {}))
    assert len(memory) == 1
    with pytest.raises(TypeError):
        tm.unregister_event_handler("not a handle")


def test_register_is_idempotent_and_close_unregisters(tm):
    memory = tm.MemoryHandler()
    memory.register()
    memory.register()
    tm.log_event(tm.Event("x", datetime.datetime.now(UTC), {}))
    assert len(memory) == 1
    memory.unregister()
    assert not memory.registered
    memory.register()
    memory.close()
    tm.log_event(tm.Event("x", datetime.datetime.now(UTC), {}))
    assert len(memory) == 1
    with pytest.raises(ValueError, match="closed"):
        memory.register()
    # So does register_event_handler (its events would vanish uncounted).
    with pytest.raises(ValueError, match=r"MemoryHandler\(capacity=\d+\) is closed; make a new sink"):
        tm.register_event_handler(memory)


def test_bad_arguments(tm, tmp_path):
    with pytest.raises(ValueError, match="empty"):
        tm.TensorBoardWriter("")
    with pytest.raises(ValueError, match="flush_interval"):
        tm.TensorBoardWriter(tmp_path, flush_interval=0)
    with pytest.raises(TypeError, match="flush_interval"):
        tm.TensorBoardWriter(tmp_path, flush_interval="1s")
    with pytest.raises(ValueError, match="max_buffer_bytes"):
        tm.JsonLinesWriter(tmp_path / "x.jsonl", max_buffer_bytes=0)
    with pytest.raises(ValueError, match="names a directory"):
        tm.JsonLinesWriter(str(tmp_path) + "/")
    with pytest.raises(ValueError, match="stdout"):
        tm.ConsoleHandler("stdin")
    with pytest.raises(ValueError, match="capacity"):
        tm.MemoryHandler(0)
    with pytest.raises(TypeError, match="event_names"):
        tm.MemoryHandler(event_names=[1])
    w = tm.TensorBoardWriter(tmp_path, flush_interval=datetime.timedelta(milliseconds=250))
    assert w.flush_interval == 0.25
    w.close()


# ------------------------------------------------------------ faults


class Counter:
    """A Python handler that must see every event, whatever the sinks do."""

    def __init__(self):
        self.count = 0

    def __call__(self, event):
        self.count += 1


def test_unwritable_directory_warns_once_and_training_goes_on(tm, registered, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match="cannot create the directory") as caught:
        writer = tm.TensorBoardWriter(blocker / "logs", flush_interval=3600)
    assert len(caught) == 1
    counter = Counter()
    registered(writer)
    registered(counter)
    stat = tm.Stat("loss", [tm.Aggregation.MEAN], 0.001)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise here
        for i in range(200):
            stat.add(float(i))
            tm.log_event(tm.Event("x", datetime.datetime.now(UTC), {"i": i}))
        writer.flush()
    assert counter.count >= 200
    assert len(writer.problems) == 1 and str(blocker) in writer.problems[0]
    assert writer.file_path == ""
    # Fixed: the buffered events are written on the next flush.
    blocker.unlink()
    writer.add_scalar("after", 1.0, 0)
    writer.flush()
    assert read_scalars(blocker / "logs")["after"][0][:2] == (0, 1.0)
    writer.close()


def test_vanished_directory(tm, registered, tmp_path):
    logdir = tmp_path / "run"
    writer = tm.TensorBoardWriter(logdir, flush_interval=3600)
    counter = Counter()
    registered(writer)
    registered(counter)
    base = 1_700_000_000_000_000
    for i in range(10):
        tm.log_event(stat_event(tm, base + i, {"x": float(i)}))
    writer.flush()
    shutil.rmtree(logdir)
    for i in range(10, 20):
        tm.log_event(stat_event(tm, base + i, {"x": float(i)}))
    with pytest.warns(RuntimeWarning, match="removed while writing"):
        writer.flush()
    writer.close()
    assert counter.count == 20
    points = read_scalars(logdir)["x"]
    assert [(s, v) for s, v, _ in points] == [(i, float(i)) for i in range(10, 20)]


def test_injected_write_failure(tm, registered, tmp_path):
    writer = tm.TensorBoardWriter(tmp_path, flush_interval=3600)
    counter = Counter()
    registered(writer)
    registered(counter)
    tm._C._sinks_set_write_error(errno.ENOSPC)
    try:
        with pytest.warns(RuntimeWarning, match="No space left on device") as caught:
            for i in range(100):
                tm.log_event(stat_event(tm, 1_700_000_000_000_000 + i, {"x": float(i)}))
                writer.flush()
        assert len(caught) == 1
    finally:
        tm._C._sinks_set_write_error(0)
    writer.close()
    assert counter.count == 100
    assert [p[1] for p in read_scalars(tmp_path)["x"]] == [float(i) for i in range(100)]


def test_dev_full_jsonl(tm, registered):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    writer = tm.JsonLinesWriter("/dev/full", flush_interval=3600)
    counter = Counter()
    registered(writer)
    registered(counter)
    with pytest.warns(RuntimeWarning, match="No space left on device"):
        for i in range(20):
            tm.log_event(tm.Event("x", datetime.datetime.now(UTC), {"i": i}))
            writer.flush()
    assert counter.count == 20
    with pytest.warns(RuntimeWarning):
        writer.close()  # what could not be written is reported lost


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only), for a real full disk."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)],
        capture_output=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {result.stderr!r}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_full_disk_then_space_again(tm, registered, tiny_tmpfs):
    logdir = tiny_tmpfs / "run"
    writer = tm.TensorBoardWriter(logdir, flush_interval=3600)
    counter = Counter()
    registered(writer)
    registered(counter)
    n = 4000  # ~50 bytes each: about three times the disk
    with pytest.warns(RuntimeWarning, match="No space left on device") as caught:
        for i in range(n):
            tm.log_event(stat_event(tm, 1_700_000_000_000_000 + i, {"x": float(i)}))
            if i % 500 == 0:
                writer.flush()
        writer.flush()
    assert len(caught) == 1
    assert counter.count == n
    # The file ends at the last whole record (a torn one is cut off again).
    assert 0 < len(read_scalars(logdir)["x"]) < n
    subprocess.run(["mount", "-o", "remount,size=1m", str(tiny_tmpfs)], check=True)
    writer.close()
    assert writer.dropped == 0
    points = read_scalars(logdir)["x"]
    assert [(s, v) for s, v, _ in points] == [(i, float(i)) for i in range(n)]


def test_full_buffer_drops_and_counts(tm, registered, tmp_path):
    writer = tm.TensorBoardWriter(tmp_path, flush_interval=3600, max_buffer_bytes=4096)
    registered(writer)
    tm._C._sinks_set_write_error(errno.EIO)
    try:
        # The warnings come from the logging thread or the flusher thread
        # (as C++ warnings on stderr); `problems` lists them all.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(1000):
                writer.add_scalar("x", float(i), i)
            writer.flush()
    finally:
        tm._C._sinks_set_write_error(0)
    problems = "\n".join(writer.problems)
    assert "buffer is full" in problems and "Input/output error" in problems
    assert len(writer.problems) == 2
    assert writer.dropped > 0
    with pytest.warns(RuntimeWarning, match="dropped in total"):
        writer.close()
    assert len(read_scalars(tmp_path)["x"]) + writer.dropped == 1000


def test_concurrent_logging_threads(tm, registered, tmp_path):
    writer = tm.TensorBoardWriter(tmp_path, flush_interval=0.01, event_names=None)
    registered(writer)

    def work(t):
        for i in range(2000):
            writer.add_scalar(f"t{t}", float(i), i, walltime=1e9 + i)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()
    scalars = read_scalars(tmp_path)
    for t in range(4):
        assert [(s, v) for s, v, _ in scalars[f"t{t}"]] == [(i, float(i)) for i in range(2000)]
