"""The Prometheus sinks (PrometheusExporter, PrometheusTextFile) from Python
and TorchScript.

Oracles: prometheus_client's own parser reads every text we produce, and a
real Prometheus server (Debian's ``prometheus`` binary) scrapes the exporter
and answers queries about what it stored.
"""

import datetime
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest

from isolated import run_isolated

UTC = datetime.timezone.utc
STAT_EVENT = "torch.monitor.Stat"


def parse(text):
    """{(sample name, frozen labels): value}, read by prometheus_client."""
    parser = pytest.importorskip("prometheus_client.parser")
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def scrape(port, path="/metrics"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def log_window(tm, data):
    tm.log_event(tm.Event(STAT_EVENT, datetime.datetime.now(UTC), data))


def test_exporter_serves_windows_parsed_by_prometheus_client(tm):
    exporter = tm.PrometheusExporter(labels={"job": 'tr"ain\\x', "run": "7"})
    assert isinstance(exporter, tm.PrometheusExporter)
    assert exporter.port > 0 and exporter.host == "127.0.0.1" and exporter.serving
    handle = tm.register_event_handler(exporter)
    try:
        stat = tm.Stat("loss/train", [tm.Aggregation.MEAN, tm.Aggregation.COUNT], 3600.0)
        for v in (1.0, 2.0, 3.0):
            stat.add(v)
        tm._close_all_stats()
        log_window(tm, {"weird name\n.max": float("inf"), "ignored": "text"})
        status, ctype, text = scrape(exporter.port)
    finally:
        tm.unregister_event_handler(handle)
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    assert text == exporter.render()
    samples = parse(text)
    base = (("job", 'tr"ain\\x'), ("run", "7"))
    assert samples[("torch_monitor_loss_train", tuple(sorted(base + (("aggregation", "mean"),))))] == 2.0
    assert samples[("torch_monitor_loss_train", tuple(sorted(base + (("aggregation", "count"),))))] == 3.0
    assert samples[("torch_monitor_loss_train_count_total", base)] == 3.0
    assert samples[("torch_monitor_weird_name_", tuple(sorted(base + (("aggregation", "max"),))))] == float("inf")
    with pytest.raises(urllib.error.HTTPError) as e:
        scrape(exporter.port, "/other")
    assert e.value.code == 404
    exporter.close()
    assert exporter.closed and not exporter.serving
    del stat


def test_keys_without_an_aggregation_are_values_of_their_own(tm):
    """A capture's "<key>.active" and dynamic counters, and a merge's
    "<stat>.ranks", end in no aggregation: each is a family with one value."""
    exporter = tm.PrometheusExporter()
    handle = tm.register_event_handler(exporter)
    try:
        log_window(tm, {"job.queue_depth": 7, "compile.active": 1, "loss.ranks": 4, "loss.mean": 1.5})
        samples = parse(exporter.render())
    finally:
        tm.unregister_event_handler(handle)
        exporter.close()
    value = (("aggregation", "value"),)
    assert samples[("torch_monitor_job_queue_depth", value)] == 7.0
    assert samples[("torch_monitor_compile_active", value)] == 1.0
    assert samples[("torch_monitor_loss_ranks", value)] == 4.0
    assert samples[("torch_monitor_loss", (("aggregation", "mean"),))] == 1.5


def test_count_total_accumulates_and_a_scrape_never_sees_add(tm):
    exporter = tm.PrometheusExporter()
    with exporter:  # registered for the block
        log_window(tm, {"x.count": 2, "x.mean": 0.5})
        log_window(tm, {"x.count": 5, "x.mean": 1.5})
        samples = parse(scrape(exporter.port)[2])
    assert samples[("torch_monitor_x_count_total", ())] == 7
    assert samples[("torch_monitor_x", (("aggregation", "mean"),))] == 1.5


def test_bad_arguments(tm):
    with pytest.raises(ValueError, match="aggregation"):
        tm.PrometheusExporter(labels={"aggregation": "x"})
    with pytest.raises(ValueError, match="reserved"):
        tm.PrometheusTextFile("/tmp/x.prom", labels={"__name__": "x"})
    with pytest.raises(ValueError, match="port"):
        tm.PrometheusExporter(port=70000)
    taken = tm.PrometheusExporter()
    with pytest.raises(RuntimeError, match="cannot listen"):
        tm.PrometheusExporter(port=taken.port)
    taken.close()


def test_rank_label_under_torch_distributed():
    # `labels` stays what the user gave (what a saved sink keeps); the rank
    # of the process that serves is added to every sample.
    run_isolated(
        """
        import os, urllib.request, torch.distributed as dist, torch_monitor as tm
        dist.init_process_group("gloo", rank=0, world_size=1,
                                init_method="tcp://127.0.0.1:0")
        e = tm.PrometheusExporter(labels={"job": "j"})
        f = tm.PrometheusTextFile("/tmp/tm_rank_%d.prom" % os.getpid())
        mine = tm.PrometheusExporter(labels={"rank": "9"})
        assert e.labels == {"job": "j"} and f.labels == {} and mine.labels == {"rank": "9"}
        for sink in (e, f, mine):
            sink.register()
        s = tm.Stat("loss", [tm.Aggregation.MEAN], window_steps=1)
        s.add(1.0); tm.set_step(1); s.add(2.0)
        def served(port):
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
                return r.read().decode()
        assert 'torch_monitor_loss{job="j",rank="0",aggregation="mean"} 1' in served(e.port), served(e.port)
        assert 'torch_monitor_loss{rank="0",aggregation="mean"} 1' in open(f.path).read()
        assert 'torch_monitor_loss{rank="9",aggregation="mean"} 1' in served(mine.port)
        e.close(); f.close(); mine.close(); os.unlink(f.path)
        dist.destroy_process_group()
        """,
        timeout=60,
    )


def test_torchscript_face_and_pickle(tm, tmp_path):
    import torch

    class M(torch.nn.Module):
        def __init__(self, path: str):
            super().__init__()
            self.exporter = torch.classes.torch_monitor.PrometheusExporter(0, "127.0.0.1", {"job": "s"})
            self.file = torch.classes.torch_monitor.PrometheusTextFile(path, {"job": "s"})

        def forward(self) -> int:
            self.exporter.register()
            self.file.register()
            return self.exporter.port()

    m = torch.jit.script(M(str(tmp_path / "m.prom")))
    port = m()
    assert port > 0
    log_window(tm, {"y.mean": 4.0})
    assert parse(scrape(port)[2])[("torch_monitor_y", (("aggregation", "mean"), ("job", "s")))] == 4.0
    assert parse((tmp_path / "m.prom").read_text())[("torch_monitor_y", (("aggregation", "mean"), ("job", "s")))] == 4.0
    # Saved and loaded: the configuration travels, a new server starts.
    loaded = torch.jit.load(_saved(torch, m, tmp_path))
    assert loaded.exporter.port() not in (0, port) and loaded.exporter.labels() == {"job": "s"}
    assert loaded.file.path() == str(tmp_path / "m.prom")
    for sink in (m.exporter, m.file, loaded.exporter, loaded.file):
        sink.close()


def _saved(torch, module, tmp_path):
    path = str(tmp_path / "m.pt")
    torch.jit.save(module, path)
    return path


def test_text_file_is_replaced_atomically(tm, tmp_path):
    path = tmp_path / "node" / "train.prom"
    path.parent.mkdir()
    out = tm.PrometheusTextFile(path, labels={"job": "j"})
    assert out.path == str(path) and path.read_text() == ""
    stop = threading.Event()
    seen = []
    bad = []

    def reader():
        while not stop.is_set():
            text = path.read_text()
            try:
                samples = parse(text)
            except Exception as e:  # a partial file would not parse
                bad.append((text, e))
                continue
            # A whole file is the text of some number of stats: it ends
            # with a line, and the last stat it names has its sample.
            if text and not text.endswith("\n"):
                bad.append(text)
            seen.append(len(samples))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        with out:
            for k in range(50):  # 50 stats, then windows of one of them
                log_window(tm, {f"s{k}.mean": 0.0})
            for i in range(200):
                log_window(tm, {"s0.mean": float(i)})
    finally:
        stop.set()
        thread.join(10)
    assert not bad, bad[:1]
    assert seen, "the reader never saw a written file"
    final = parse(path.read_text())
    assert final[("torch_monitor_s0", (("aggregation", "mean"), ("job", "j")))] == 199.0
    assert [p.name for p in path.parent.iterdir()] == ["train.prom"]  # no temp left


def test_text_file_is_never_renamed_over_a_device_pipe_or_link(tm, tmp_path):
    """Each window renames a new file over the path: over /dev/stdout (a link
    to a pipe or a terminal) that replaced the device link itself with a
    file. A path that is no regular file is refused; through a link, the
    file it names is replaced and the link stays."""
    import os

    fifo = tmp_path / "metrics.fifo"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/null"):
        with pytest.raises(ValueError, match="is not a regular file"):
            tm.PrometheusTextFile(str(path))
    assert not os.path.isfile("/dev/null")
    real = tmp_path / "real.prom"
    real.write_text("old")
    link = tmp_path / "link.prom"
    link.symlink_to(real)
    sink = tm.PrometheusTextFile(str(link))
    sink.close()
    assert link.is_symlink() and real.read_text() == ""  # the empty exposition
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.prom", "metrics.fifo", "real.prom"]
    # A dangling link too (its file not made yet): the link was replaced.
    (tmp_path / "sub").mkdir()
    dangling = tmp_path / "dangling.prom"
    dangling.symlink_to("sub/later.prom")
    tm.PrometheusTextFile(str(dangling)).close()
    assert dangling.is_symlink() and (tmp_path / "sub" / "later.prom").read_text() == ""
    # /dev/stdout with stdout redirected to a file names that file, through
    # the descriptor: replacing it sent the program's output to a deleted
    # file. Any path through an open descriptor is refused.
    log = tmp_path / "stdout.log"
    with open(log, "w") as out:
        inode = os.fstat(out.fileno()).st_ino
        for path in (f"/proc/self/fd/{out.fileno()}", f"/dev/fd/{out.fileno()}"):
            with pytest.raises(ValueError, match="through an open file descriptor"):
                tm.PrometheusTextFile(path)
    assert log.stat().st_ino == inode


def test_text_file_in_a_missing_directory_warns(tm, tmp_path):
    with pytest.warns(RuntimeWarning, match="cannot create"):
        out = tm.PrometheusTextFile(tmp_path / "missing" / "x.prom")
    assert out.problems and "cannot create" in out.problems[0]
    out.close()


def test_hostile_clients_do_not_block_a_scrape():
    run_isolated(
        """
        import socket, time, urllib.request, torch_monitor as tm
        e = tm.PrometheusExporter()
        idle = []
        for _ in range(40):  # more than the connection slots, all silent
            s = socket.create_connection(("127.0.0.1", e.port)); s.send(b"GET /m"); idle.append(s)
        g = socket.create_connection(("127.0.0.1", e.port)); g.send(bytes(range(256)) * 4)
        t = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{e.port}/metrics", timeout=5) as r:
            assert r.status == 200
        assert time.monotonic() - t < 1.0, time.monotonic() - t
        assert g.recv(100).startswith(b"HTTP/1.1 400")
        e.close()  # with clients still connected
        for s in idle: s.close()
        """,
        timeout=60,
    )


def test_fork_child_does_not_serve():
    run_isolated(
        """
        import os, urllib.request, warnings, datetime, torch_monitor as tm
        e = tm.PrometheusExporter(); e.register()
        pid = os.fork()
        if pid == 0:
            ok = not e.serving
            with warnings.catch_warnings(record=True):
                tm.log_event(tm.Event("torch.monitor.Stat", datetime.datetime.now(datetime.timezone.utc), {"c.mean": 1.0}))
            # Named by the port bound: with port 0 every exporter was ":0".
            ok = ok and any(p.startswith(f"PrometheusExporter(127.0.0.1:{e.port}): not serving in this forked child")
                            for p in e.problems)
            e.close()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert status == 0, status
        with urllib.request.urlopen(f"http://127.0.0.1:{e.port}/metrics", timeout=5) as r:
            assert r.status == 200  # the parent still serves
        assert e.serving
        """,
        timeout=60,
    )


def test_exit_with_a_serving_exporter_is_clean():
    out = run_isolated(
        """
        import socket, torch_monitor as tm
        e = tm.PrometheusExporter(); e.register()
        s = socket.create_connection(("127.0.0.1", e.port))  # left connected
        print("port", e.port)
        """,
        timeout=30,
    )
    assert "port" in out.stdout


# ------------------------------------------------------ a real Prometheus


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_prometheus_scrapes_the_exporter(tm, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus; scripts/install_deps.sh does)")
    exporter = tm.PrometheusExporter(labels={"job_name": "tm"})
    handle = tm.register_event_handler(exporter)
    stat = tm.Stat("train.loss", [tm.Aggregation.MEAN, tm.Aggregation.COUNT], 3600.0)
    for v in (0.5, 1.5, 2.5, 3.5):
        stat.add(v)
    tm._close_all_stats()
    web = _free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: torch_monitor\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{exporter.port}']\n"
    )
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "prometheus.log", "wb"),
    )
    try:
        query = urllib.parse.quote('torch_monitor_train_loss{aggregation="mean"}')
        deadline = time.monotonic() + 60
        result = None
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/query?query={query}", timeout=5) as r:
                    body = json.load(r)
                if body["data"]["result"]:
                    result = body["data"]["result"]
                    break
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        assert result, "Prometheus never stored a scrape: " + (tmp_path / "prometheus.log").read_text()[-2000:]
        assert len(result) == 1
        assert result[0]["metric"]["job"] == "torch_monitor"
        assert result[0]["metric"]["job_name"] == "tm"
        assert float(result[0]["value"][1]) == 2.0
        count = urllib.parse.quote("torch_monitor_train_loss_count_total")
        with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/query?query={count}", timeout=5) as r:
            assert float(json.load(r)["data"]["result"][0]["value"][1]) == 4.0
        with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/targets", timeout=5) as r:
            targets = json.load(r)["data"]["activeTargets"]
        assert targets[0]["health"] == "up", targets
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        tm.unregister_event_handler(handle)
        exporter.close()
        del stat
