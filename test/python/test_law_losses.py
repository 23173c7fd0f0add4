"""The law of losses (issue 25), for every sink: each event a sink could not
write is counted in its ``dropped`` (in the sink's unit: events, or
TensorBoard points), and a file a sink writes never ends in a partial record
(a torn record is cut back to the last whole one).

The sinks are enumerated from the registry, the faces in
``torch_monitor._spellings.FACES`` whose spelling has ``copies == "share"``
and a ``dropped`` property: a new sink is covered by being registered, and its case here fails until it
has a probe in ``CASES``.

A full disk is made portable with a file size limit: the child process sets
``RLIMIT_FSIZE`` to N bytes and ignores ``SIGXFSZ``, so every write past N
bytes stops part-way and then fails with ``EFBIG``, as on a disk that fills
up. Where a sink can write to ``/dev/full`` (``ENOSPC`` on every write), that
is checked too. Each such case runs in a child process with a time limit
(``run_isolated``); the child reports ``dropped`` on stderr and the parent
reads the file back (TensorBoard's own ``EventFileLoader`` for event files).
"""

import datetime
import json
import os
import re
import struct
import textwrap

import pytest

from conftest import load_module
from isolated import run_isolated

EVENTS = 330
UTC = datetime.timezone.utc
STAT_EVENT = "torch.monitor.Stat"
FULL = "/dev/full"


@pytest.fixture
def tm():
    return load_module("torch_monitor")


def registered_sinks():
    """The sink classes of the registry (empty when the package is not built;
    ``test_every_registered_sink_has_a_probe`` then fails or skips)."""
    try:
        from torch_monitor import _spellings
    except Exception:
        return []
    # A sink stands for an output (a copy is the same object) and counts
    # what it drops; a capture of PyTorch's counters is shared too, but
    # writes nothing.
    return sorted(
        name for name, spelling in _spellings.FACES.items()
        if spelling.copies == "share" and "dropped" in spelling.getters
    )


# What every child runs first: a file size limit, and one way to log.
PRELUDE = """
import datetime, json, os, resource, signal, sys
import torch_monitor as tm

def limit_file_size(n):
    # Writes past n bytes stop part-way, then fail with EFBIG (a full disk).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))

def log(i, data):
    stamp = datetime.datetime.fromtimestamp(1714566896 + i, tz=datetime.timezone.utc)
    tm.log_event(tm.Event("torch.monitor.Stat", stamp, data))

def report(sink, **extra):
    result = dict(dropped=sink.dropped, problems=list(sink.problems), **extra)
    sys.stderr.write("RESULT " + json.dumps(result) + "\\n")
"""


def run_child(body, timeout=120):
    """Runs PRELUDE + body in a child; returns (its RESULT dict or None, stderr)."""
    outcome = run_isolated(PRELUDE + textwrap.dedent(body), timeout=timeout)
    for line in outcome.stderr.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :]), outcome.stderr
    return None, outcome.stderr


# ------------------------------------------------------------ readers


def json_lines(path):
    """The `b` of every line, each line whole and parsed."""
    text = open(path, "rb").read().decode()
    whole = text == "" or text.endswith("\n")
    assert whole, f"{path} ends in a partial line: {text[-80:]!r}"
    return [json.loads(line)["data"]["b"] for line in text.splitlines()]


def console_lines(path):
    text = open(path, "rb").read().decode()
    whole = text == "" or text.endswith("\n")
    assert whole, f"{path} ends in a partial line: {text[-80:]!r}"
    out = []
    for line in text.splitlines():
        match = re.fullmatch(r"\S+Z torch\.monitor\.Stat a=\S+ b=(\d+)", line)
        assert match, f"not a whole console line: {line!r}"
        out.append(int(match.group(1)))
    return out


def tfrecord_sizes(data):
    """Walks the TFRecord framing; fails unless the data ends at a record end."""
    pos, sizes = 0, []
    while pos < len(data):
        assert pos + 12 <= len(data), f"a torn record header at offset {pos} of {len(data)}"
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 12 + length + 4
        assert end <= len(data), f"a torn record at offset {pos}: {end - len(data)} bytes missing"
        sizes.append(length)
        pos = end
    return sizes


def tensorboard_points(logdir):
    """The scalar points of every event file under logdir, read by
    TensorBoard's own loader, each file checked to end at a record end."""
    from tensorboard.backend.event_processing import event_file_loader

    points = []
    files = [os.path.join(d, f) for d, _, fs in os.walk(logdir) for f in fs if "tfevents" in f]
    assert files, f"no event file in {logdir}"
    for path in files:
        records = tfrecord_sizes(open(path, "rb").read())
        events = list(event_file_loader.EventFileLoader(path).Load())
        assert len(events) == len(records), (path, len(events), len(records))
        for event in events:
            for value in event.summary.value:
                points.append((value.tag, event.step))
    return points


# ------------------------------------------------------------ probes
#
# Each probe logs EVENTS events into one sink under one fault and checks
#   what the output holds + dropped == what was logged (in the sink's unit),
# that the fault was met (some of each, where the fault lets anything through)
# and that the output ends at a record boundary.


def tensorboard_file_size_limit(tm, tmp_path):
    # dropped counts points (records): two per event here.
    logdir = tmp_path / "tb"
    result, err = run_child(
        f"""
        w = tm.TensorBoardWriter({str(logdir)!r}, flush_interval=3600)
        tm.register_event_handler(w)
        limit_file_size(10_001)  # the header is written: about 250 points fit
        for i in range({EVENTS}):
            log(i, {{"a": float(i), "b": i}})
            if i % 10 == 9:
                w.flush()
        w.close()
        report(w)
        """
    )
    assert result is not None, err
    points = tensorboard_points(logdir)
    assert len(points) + result["dropped"] == 2 * EVENTS, (len(points), result)
    assert 0 < len(points) < 2 * EVENTS, (len(points), result)
    # The first points, each once (an event's values in either order).
    steps = {tag: sorted(step for t, step in points if t == tag) for tag in ("a", "b")}
    for tag, seen in steps.items():
        assert seen == list(range(len(seen))), tag
    assert abs(len(steps["a"]) - len(steps["b"])) <= 1 and len(points) == len(steps["a"]) + len(steps["b"])


def json_lines_file_size_limit(tm, tmp_path):
    path = tmp_path / "e.jsonl"
    result, err = run_child(
        f"""
        w = tm.JsonLinesWriter({str(path)!r}, flush_interval=3600)
        tm.register_event_handler(w)
        limit_file_size(10_001)  # about 75 lines fit
        for i in range({EVENTS}):
            log(i, {{"a": float(i), "b": i}})
            if i % 10 == 9:
                w.flush()
        w.close()
        report(w)
        """
    )
    assert result is not None, err
    lines = json_lines(path)
    assert len(lines) + result["dropped"] == EVENTS, (len(lines), result)
    assert 0 < len(lines) < EVENTS, (len(lines), result)
    assert lines == list(range(len(lines)))


def json_lines_file_size_limit_at_exit(tm, tmp_path):
    # Never closed: the exit stage closes it and reports the total.
    path = tmp_path / "e.jsonl"
    result, err = run_child(
        f"""
        w = tm.JsonLinesWriter({str(path)!r}, flush_interval=3600)
        tm.register_event_handler(w)
        limit_file_size(10_001)
        for i in range({EVENTS}):
            log(i, {{"a": float(i), "b": i}})
            if i % 10 == 9:
                w.flush()
        report(w)  # before exit: what the last flush could not write waits
        """
    )
    assert result is not None, err
    lines = json_lines(path)
    totals = re.findall(r"(\d+) record\(s\) were dropped in total", err)
    assert totals, f"no total of dropped records reported at exit:\n{err[-3000:]}"
    assert len(lines) + int(totals[-1]) == EVENTS, (len(lines), totals, err[-3000:])
    assert lines == list(range(len(lines)))


def json_lines_dev_full(tm, tmp_path):
    result, err = run_child(
        f"""
        w = tm.JsonLinesWriter({FULL!r}, flush_interval=3600)
        tm.register_event_handler(w)
        for i in range({EVENTS}):
            log(i, {{"a": float(i), "b": i}})
            if i % 10 == 9:
                w.flush()
        w.close()
        report(w)
        """
    )
    assert result is not None, err
    assert result["dropped"] == EVENTS, result


def console_file_size_limit(tm, tmp_path):
    # stdout redirected to a file, as `prog > out.log` does.
    path = tmp_path / "out.log"
    result, err = run_child(
        f"""
        fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        c = tm.ConsoleHandler("stdout")
        tm.register_event_handler(c)
        limit_file_size(10_001)
        for i in range({EVENTS}):
            log(i, {{"a": float(i), "b": i}})
        c.close()
        report(c)
        """
    )
    assert result is not None, err
    lines = console_lines(path)
    assert len(lines) + result["dropped"] == EVENTS, (len(lines), result)
    assert 0 < len(lines) < EVENTS, (len(lines), result)
    assert lines == list(range(len(lines)))


def console_dev_full(tm, tmp_path):
    result, err = run_child(
        f"""
        fd = os.open({FULL!r}, os.O_WRONLY)
        os.dup2(fd, 1)
        c = tm.ConsoleHandler("stdout")
        tm.register_event_handler(c)
        for i in range({EVENTS}):
            log(i, {{"a": float(i), "b": i}})
        c.close()
        report(c)
        """
    )
    assert result is not None, err
    assert result["dropped"] == EVENTS, result


def prometheus_text_file_size_limit(tm, tmp_path):
    # Every window rewrites the whole exposition; each event names a new
    # Stat, so the text grows until it no longer fits. The file is always a
    # whole exposition: the Stats of the events that were written.
    path = tmp_path / "node" / "train.prom"
    path.parent.mkdir()
    result, err = run_child(
        f"""
        p = tm.PrometheusTextFile({str(path)!r})
        tm.register_event_handler(p)
        limit_file_size(10_001)  # about 60 Stats fit
        for i in range({EVENTS}):
            log(i, {{f"s{{i:03d}}.mean": float(i)}})
        p.close()
        report(p)
        """
    )
    assert result is not None, err
    text = path.read_text()
    whole = text.endswith("\n")
    assert whole, f"a partial exposition: {text[-80:]!r}"
    stats = set()
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r"torch_monitor_s(\d{3})\{[^}]*\} \S+", line)
        assert match, f"not a whole sample line: {line!r}"
        stats.add(int(match.group(1)))
    assert stats == set(range(len(stats))), sorted(stats)
    assert len(stats) + result["dropped"] == EVENTS, (len(stats), result)
    assert 0 < len(stats) < EVENTS, (len(stats), result)
    assert [p.name for p in path.parent.iterdir()] == ["train.prom"]  # no temporary file left


def memory_overwrite(tm, tmp_path):
    # No file: it loses events only by overwriting the oldest.
    memory = tm.MemoryHandler(100)
    handle = tm.register_event_handler(memory)
    try:
        for i in range(EVENTS):
            tm.log_event(tm.Event(STAT_EVENT, datetime.datetime.now(UTC), {"b": i}))
    finally:
        tm.unregister_event_handler(handle)
        memory.close()
    kept = [e.data["b"] for e in memory.events()]
    assert len(kept) + memory.dropped == EVENTS
    assert kept == list(range(EVENTS - len(kept), EVENTS))


def prometheus_exporter_keeps_every_window(tm, tmp_path):
    # No file and no queue: an event replaces its Stats' windows in the
    # snapshot a scrape renders, so nothing can fail to be written and
    # dropped stays 0; every window's Stat is in the exposition.
    exporter = tm.PrometheusExporter()
    handle = tm.register_event_handler(exporter)
    try:
        for i in range(EVENTS):
            tm.log_event(tm.Event(STAT_EVENT, datetime.datetime.now(UTC), {f"s{i:03d}.mean": float(i)}))
        text = exporter.render()
    finally:
        tm.unregister_event_handler(handle)
        exporter.close()
    stats = set(re.findall(r"^torch_monitor_s(\d{3})\{", text, flags=re.M))
    assert len(stats) == EVENTS and exporter.dropped == 0


# Every sink of the registry, with the faults it can meet.
CASES = {
    "TensorBoardWriter": [
        # /dev/full does not apply: it always creates a new regular file
        # (O_EXCL) in its log directory.
        tensorboard_file_size_limit,
    ],
    "JsonLinesWriter": [
        json_lines_file_size_limit,
        json_lines_file_size_limit_at_exit,
        json_lines_dev_full,
    ],
    "ConsoleHandler": [console_file_size_limit, console_dev_full],
    "MemoryHandler": [memory_overwrite],
    "PrometheusExporter": [prometheus_exporter_keeps_every_window],
    "PrometheusTextFile": [
        # /dev/full does not apply: it writes a temporary file beside its
        # path and renames it over the path.
        prometheus_text_file_size_limit,
    ],
}


def no_probe(tm, tmp_path):
    pytest.fail("a registered sink without a probe: add its cases to CASES in test_law_losses.py")


@pytest.mark.parametrize(
    "sink,case",
    [(sink, case) for sink in registered_sinks() for case in CASES.get(sink, [no_probe])],
    ids=lambda value: value if isinstance(value, str) else value.__name__,
)
def test_every_sink_counts_what_it_could_not_write(tm, tmp_path, sink, case):
    case(tm, tmp_path)


def test_every_registered_sink_has_a_probe(tm):
    from torch_monitor import _spellings

    sinks = registered_sinks()
    assert sinks and not set(sinks) - set(CASES), set(sinks) - set(CASES)
    # The registry's sinks are exactly the faces that have `dropped`.
    with_dropped = sorted(name for name, face in tm._faces.FACE_CLASSES.items() if hasattr(face, "dropped"))
    assert with_dropped == sinks
