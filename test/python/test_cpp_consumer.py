"""The same objects in TorchScript, Python and C++ (monitor-core.md, design.md).

* A separate CMake project (test/consumer) is built against the pip-installed
  package with ``find_package(TorchMonitor)``, once per session, and:
  - runs its C++ API self-test (Stat<double>, Stat<int64_t>, EventHandler);
  - loads a model scripted and saved here, with a C++ handler registered, and
    reports the events that handler received;
  - a second executable of that project names no torch_monitor symbol at all
    (it only ``torch::jit::load``s), and must still carry libtorch_monitor as
    NEEDED: the exported target links with --no-as-needed. The project is
    linked with ``-Wl,--as-needed`` (Ubuntu's default) so that this matters.
* A saved model loads in a fresh Python process that only did
  ``torch.ops.load_library``: configuration kept, open window not.
* A Python ``torch_monitor.Stat`` scripted as a module attribute is one window.
* Pickled state starts with a version number; an unknown one fails clearly.

The C++ tests skip when cmake or a C++ compiler is missing.
"""

import datetime
import gc
import io
import json
import os
import pickletools
import shutil
import sys
import time
import zipfile

import pytest

torch = pytest.importorskip("torch")

from cpp_build import build_project, import_torch_monitor, requires_toolchain, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CONSUMER_SRC = os.path.normpath(os.path.join(HERE, "..", "consumer"))
STAT_EVENT = "torch.monitor.Stat"
CLASS_PREFIX = "__torch__.torch.classes.torch_monitor"


@pytest.fixture(scope="session")
def tmon():
    return import_torch_monitor()


# ------------------------------------------------------------ the model

# Samples fed before saving (they must not survive the save) and after loading.
PRE_SAVE_INPUTS = [0.5, 7.0]
INPUTS = [1.5, 2.5, 5.0]

LOSS_CONFIG = {
    "name": "model.loss",
    "aggregations": ["mean", "sum", "count", "max", "min"],
    "window_size_ms": 3600 * 1000,  # given as 3600.0 seconds
    "max_samples": 1000,
}
STEPS_CONFIG = {
    "name": "model.steps",
    "aggregations": ["sum", "count", "mean", "max"],  # given as ints 4, 3, 2, 5
    "window_size_ms": 7200 * 1000,  # given as the int 7200
    "max_samples": 2**63 - 1,
}


def make_model():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # Windows of an hour or more: no window closes by time during a test.
            self.stat = torch.classes.torch_monitor.Stat(
                "model.loss", ["mean", "sum", "count", "max", "min"], 3600.0, 1000
            )
            self.steps = torch.classes.torch_monitor.IntStat(
                "model.steps", [4, 3, 2, 5], 7200
            )
            self.calls = 0

        def forward(self, x: float) -> float:
            self.stat.add(x)
            self.steps.add(int(x * 10.0))
            self.calls += 1
            event = torch.classes.torch_monitor.Event("model.forward")
            event.set_float("x", x)
            event.set_int("calls", self.calls)
            event.set_bool("big", x > 2.0)
            event.set_str("tag", "consumer")
            torch.ops.torch_monitor.log_event(event)
            return x * 2.0

    return torch.jit.script(Model())


@pytest.fixture(scope="session")
def saved_model(tmon, tmp_path_factory):
    """A scripted model with an open window (2 samples) saved to a file."""
    model = make_model()
    for x in PRE_SAVE_INPUTS:
        assert model(x) == x * 2.0
    assert model.stat.count() == len(PRE_SAVE_INPUTS)
    assert model.steps.count() == len(PRE_SAVE_INPUTS)
    path = tmp_path_factory.mktemp("model") / "model.pt"
    torch.jit.save(model, str(path))
    # Close its window now, not during some later test's handler.
    del model
    gc.collect()
    return path


def json_lines(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def plain_data(event):
    """{key: value} of an event line from the consumer, with type checks left out."""
    return {k: v["value"] for k, v in event["data"].items()}


def data_types(event):
    return {k: v["type"] for k, v in event["data"].items()}


# ------------------------------------------------------------ the C++ consumer


@pytest.fixture(scope="session")
def consumer(tmon, tmp_path_factory):
    """Builds test/consumer against the installed package; returns the build dir."""
    return build_project(
        CONSUMER_SRC,
        tmp_path_factory.mktemp("consumer_build"),
        tmon,
        ("torch_monitor_consumer", "torch_monitor_script_only"),
        # As Ubuntu's toolchain does by default: drop libraries whose symbols
        # are never named, unless the target says otherwise.
        extra_configure=("-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed",),
    )


def needed_libraries(exe):
    """DT_NEEDED entries of an ELF file (readelf, else objdump)."""
    if shutil.which("readelf"):
        out = run(["readelf", "-d", exe]).stdout
        return [
            line.split("[", 1)[1].split("]", 1)[0]
            for line in out.splitlines()
            if "(NEEDED)" in line
        ]
    if shutil.which("objdump"):
        out = run(["objdump", "-p", exe]).stdout
        return [line.split()[1] for line in out.splitlines() if line.strip().startswith("NEEDED")]
    pytest.skip("needs readelf or objdump to read DT_NEEDED")


@requires_toolchain
@pytest.mark.parametrize("exe", ["torch_monitor_consumer", "torch_monitor_script_only"])
def test_consumer_needs_libtorch_monitor(consumer, tmon, exe):
    """Linked with --as-needed, even a program naming no torch_monitor symbol keeps it."""
    assert "libtorch_monitor.so" in needed_libraries(consumer / exe)
    if shutil.which("ldd"):
        ldd = run(["ldd", consumer / exe]).stdout
        line = next(
            (line for line in ldd.splitlines() if "libtorch_monitor.so" in line), ""
        )
        # Found at run time without LD_LIBRARY_PATH: the pip-installed copy.
        assert "not found" not in line
        assert os.path.realpath(tmon.library_path) in {
            os.path.realpath(p) for p in line.split() if p.startswith("/")
        }, ldd


@requires_toolchain
def test_cpp_api_self_test(consumer):
    before = time.time()
    proc = run([consumer / "torch_monitor_consumer"])
    after = time.time()
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stderr
    events = [e for e in json_lines(proc.stdout) if e["kind"] == "event"]

    hello = [e for e in events if e["name"] == "consumer.hello"]
    assert len(hello) == 1
    assert hello[0]["data"] == {
        "text": {"type": "str", "value": 'hi "there"'},
        "ratio": {"type": "double", "value": 0.25},
        "answer": {"type": "int", "value": 42},
        "flag": {"type": "bool", "value": True},
    }

    stats = [e for e in events if e["name"] == STAT_EVENT]
    assert [plain_data(e) for e in stats] == [
        {
            "consumer.loss.value": -1.0,
            "consumer.loss.mean": 1.0,
            "consumer.loss.count": 3.0,
            "consumer.loss.sum": 3.0,
            "consumer.loss.max": 2.5,
            "consumer.loss.min": -1.0,
        },
        {
            "consumer.steps.sum": 7,
            "consumer.steps.count": 3,
            "consumer.steps.mean": 2,
            "consumer.steps.max": 4,
            "consumer.steps.min": 1,
        },
        {"consumer.capped.sum": 3.0, "consumer.capped.count": 2.0},
    ]
    # Double stats carry doubles (COUNT too), integer stats int64.
    assert set(data_types(stats[0]).values()) == {"double"}
    assert set(data_types(stats[1]).values()) == {"int"}
    assert set(data_types(stats[2]).values()) == {"double"}
    for e in stats:
        assert before - 1 <= e["timestamp_us"] / 1e6 <= after + 1


# ------------------------------------------------------------ saved models

FRESH_PROCESS = r"""
import json, sys
import torch
torch.ops.load_library(sys.argv[1])
model = torch.jit.load(sys.argv[2])
out = {"python_api_imported": "torch_monitor" in sys.modules}
for attr in ("stat", "steps"):
    s = getattr(model, attr)
    out[attr] = {
        "name": s.name(),
        "aggregations": list(s.aggregations()),
        "window_size_ms": s.window_size_ms(),
        "max_samples": s.max_samples(),
        "count_after_load": s.count(),
        "get_after_load": dict(s.get()),
    }
out["outputs"] = [model(float(x)) for x in sys.argv[3:]]
out["stat_count_after"] = model.stat.count()
out["steps_count_after"] = model.steps.count()
out["calls_after"] = model.calls
print(json.dumps(out))
"""


def test_saved_model_loads_in_fresh_python_process(tmon, saved_model, tmp_path):
    script = tmp_path / "load_model.py"
    script.write_text(FRESH_PROCESS)
    proc = run(
        [sys.executable, script, tmon.library_path, saved_model, *INPUTS],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["python_api_imported"] is False
    for attr, config in (("stat", LOSS_CONFIG), ("steps", STEPS_CONFIG)):
        loaded = out[attr]
        for key, value in config.items():
            assert loaded[key] == value, (attr, key)
        # The open window (PRE_SAVE_INPUTS) was not saved.
        assert loaded["count_after_load"] == 0, attr
        assert set(loaded["get_after_load"]) == set(config["aggregations"])
        assert all(v == 0 for v in loaded["get_after_load"].values()), loaded
    assert out["outputs"] == [x * 2.0 for x in INPUTS]
    assert out["stat_count_after"] == len(INPUTS)
    assert out["steps_count_after"] == len(INPUTS)
    # A plain attribute is saved as it was.
    assert out["calls_after"] == len(PRE_SAVE_INPUTS) + len(INPUTS)


def check_model_stat_lines(lines):
    stats = {line["attr"]: line for line in lines if line["kind"] == "stat"}
    assert set(stats) == {"stat", "steps"}
    assert stats["stat"]["class"] == f"{CLASS_PREFIX}.Stat"
    assert stats["steps"]["class"] == f"{CLASS_PREFIX}.IntStat"
    for attr, config in (("stat", LOSS_CONFIG), ("steps", STEPS_CONFIG)):
        for key, value in config.items():
            assert stats[attr][key] == value, (attr, key)
        # Only the samples fed after loading.
        assert stats[attr]["count"] == len(INPUTS), attr
    results = [line for line in lines if line["kind"] == "result"]
    assert [(r["input"], r["output"]) for r in results] == [(x, x * 2.0) for x in INPUTS]


@requires_toolchain
def test_cpp_consumer_runs_saved_model(consumer, saved_model):
    before = time.time()
    proc = run([consumer / "torch_monitor_consumer", saved_model, *INPUTS])
    after = time.time()
    assert proc.returncode == 0, proc.stderr
    lines = json_lines(proc.stdout)
    check_model_stat_lines(lines)
    events = [line for line in lines if line["kind"] == "event"]

    # The stats' windows closed when the module was destroyed; the C++
    # handler got one event each, with the samples fed after loading only.
    stats = [e for e in events if e["name"] == STAT_EVENT]
    loss = [e for e in stats if all(k.startswith("model.loss.") for k in e["data"])]
    steps = [e for e in stats if all(k.startswith("model.steps.") for k in e["data"])]
    assert len(loss) == 1 and len(steps) == 1 and len(stats) == 2, stats
    assert plain_data(loss[0]) == {
        "model.loss.mean": 3.0,
        "model.loss.sum": 9.0,
        "model.loss.count": 3.0,
        "model.loss.max": 5.0,
        "model.loss.min": 1.5,
    }
    assert set(data_types(loss[0]).values()) == {"double"}
    assert plain_data(steps[0]) == {
        "model.steps.sum": 90,
        "model.steps.count": 3,
        "model.steps.mean": 30,
        "model.steps.max": 50,
    }
    assert set(data_types(steps[0]).values()) == {"int"}

    # The scripted Event, one per forward call, with typed values.
    forwards = [e for e in events if e["name"] == "model.forward"]
    assert len(forwards) == len(INPUTS)
    for i, (e, x) in enumerate(zip(forwards, INPUTS)):
        assert e["data"] == {
            "x": {"type": "double", "value": x},
            "calls": {"type": "int", "value": len(PRE_SAVE_INPUTS) + i + 1},
            "big": {"type": "bool", "value": x > 2.0},
            "tag": {"type": "str", "value": "consumer"},
        }
        assert before - 1 <= e["timestamp_us"] / 1e6 <= after + 1
    # Every forward event came before the stat events (closed at destruction).
    assert events.index(forwards[-1]) < events.index(stats[0])


@requires_toolchain
def test_script_only_consumer_runs_saved_model(consumer, saved_model):
    """No torch_monitor symbol named: the classes come from the NEEDED library."""
    proc = run([consumer / "torch_monitor_script_only", saved_model, *INPUTS])
    assert proc.returncode == 0, proc.stderr
    check_model_stat_lines(json_lines(proc.stdout))


# ------------------------------------------------------------ one object, two faces


def one_window_events(events):
    return [
        e.data
        for e in events
        if e.name == STAT_EVENT and all(k.startswith("one.window.") for k in e.data)
    ]


def test_python_stat_scripted_as_attribute_is_one_window(tmon):
    class Model(torch.nn.Module):
        def __init__(self, stat):
            super().__init__()
            self.stat = stat

        def forward(self, x: float) -> int:
            self.stat.add(x)
            return self.stat.count()

    events = []
    handle = tmon.register_event_handler(events.append)
    try:
        stat = tmon.Stat(
            "one.window", [tmon.SUM, tmon.COUNT], datetime.timedelta(hours=1)
        )
        model = torch.jit.script(Model(stat))
        stat.add(1.0)
        assert model(2.0) == 2  # scripted code sees the Python sample
        assert stat.count == 2  # Python sees the scripted sample
        stat.add(3.0)
        assert model(4.0) == 4
        assert stat.count == 4
        assert model.stat.count() == 4

        buffer = io.BytesIO()
        torch.jit.save(model, buffer)
        buffer.seek(0)
        loaded = torch.jit.load(buffer)
        assert loaded.stat.name() == "one.window"
        assert loaded.stat.count() == 0
        assert loaded(5.0) == 1
        assert stat.count == 4  # the loaded stat is a new object
        del loaded
        gc.collect()
        assert one_window_events(events) == [
            {"one.window.sum": 5.0, "one.window.count": 1.0}
        ]
        events.clear()

        del model, stat
        gc.collect()
        # One window, closed once, holding the samples of both faces.
        assert one_window_events(events) == [
            {"one.window.sum": 10.0, "one.window.count": 4.0}
        ]
    finally:
        tmon.unregister_event_handler(handle)


# ------------------------------------------------------------ versioned state


def test_python_stat_state_starts_with_version(tmon):
    stat = tmon.Stat("v.loss", [tmon.MEAN, tmon.MAX], 60.0, 10)
    state = stat.__getstate__()
    assert isinstance(state, tuple)
    # version, then the constructor's arguments by name (a time window in
    # seconds, window_steps None)
    assert state == (4, (("name", "v.loss"), ("aggregations", ["mean", "max"]),
                         ("window_size", 60.0), ("max_samples", 10), ("close_on_time", False),
                         ("window_steps", None), ("sync_ranks", False)))
    int_state = dict(tmon.IntStat("v.steps", [tmon.SUM], 2.5).__getstate__()[1])
    assert int_state["window_size"] == 2.5 and int_state["max_samples"] == 2**63 - 1
    step_state = dict(tmon.Stat("v.by_steps", [tmon.SUM], window_steps=50).__getstate__()[1])
    assert step_state["window_size"] is None and step_state["window_steps"] == 50
    # Older versions still load: version 3 (a tuple, the window in ms),
    # version 2 (no sync ranks), version 1 (no steps, no close on time).
    old = tmon._faces._restore(tmon.Stat, (3, "v.old", [4], 1001, 7, True, 0, False))
    assert (old.window_size_ms(), old.close_on_time, old.window_steps) == (1001, True, None)
    old = tmon._faces._restore(tmon.Stat, (2, "v.old", [4], 0, 7, False, 25))
    assert old.window_steps == 25 and old.sync_ranks is False
    old = tmon._faces._restore(tmon.IntStat, (1, "v.old", [4, 3], 2500, 7))
    assert old.window_size_ms() == 2500 and old.aggregations == [tmon.SUM, tmon.COUNT]


def custom_class_states(pickle_bytes):
    """{class name: [first item of each state tuple]} from a TorchScript data.pkl.

    A custom class object is pickled as GLOBAL '<module> <Class>', EMPTY_TUPLE,
    NEWOBJ, then its __getstate__ tuple (MARK, items..., TUPLE; a pair is
    item, item, TUPLE2), BUILD.
    """
    ops = list(pickletools.genops(pickle_bytes))
    found = {}
    for i, (op, arg, _) in enumerate(ops):
        if op.name == "GLOBAL" and arg.startswith(CLASS_PREFIX + " "):
            cls = arg.split(" ", 1)[1]
            names = [o.name for o, _, _ in ops[i + 1 : i + 6]]
            # GLOBAL, [BINPUT], EMPTY_TUPLE, NEWOBJ, MARK, first item
            j = i + 1
            if ops[j][0].name in ("BINPUT", "LONG_BINPUT", "MEMOIZE"):
                j += 1
            assert [o.name for o, _, _ in ops[j : j + 2]] == ["EMPTY_TUPLE", "NEWOBJ"], names
            k = j + 2
            if ops[k][0].name == "MARK":  # a tuple of more than three items
                k += 1
            found.setdefault(cls, []).append(ops[k])
    return found


def read_data_pkl(path):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return name, z.read(name)


def test_saved_archive_state_starts_with_version(tmon, tmp_path):
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stat = torch.classes.torch_monitor.Stat("h.loss", ["sum"], 60.0)
            self.steps = torch.classes.torch_monitor.IntStat("h.steps", [4], 60.0)
            self.event = torch.classes.torch_monitor.Event("h.event")

        def forward(self, x: float) -> float:
            self.stat.add(x)
            return x

    path = tmp_path / "holder.pt"
    torch.jit.save(torch.jit.script(Holder()), str(path))
    _, data = read_data_pkl(path)
    states = custom_class_states(data)
    assert set(states) == {"Stat", "IntStat", "Event"}
    versions = {"Stat": 4, "IntStat": 4, "Event": 1}
    for cls, firsts in states.items():
        assert len(firsts) == 1, cls
        op, arg, _ = firsts[0]
        assert op.name.startswith("BININT") and arg == versions[cls], (cls, op.name, arg)
    loaded = torch.jit.load(str(path))
    assert loaded.event.name() == "h.event"
    assert loaded.steps.name() == "h.steps"


def test_unknown_state_version_fails_in_setstate(tmon):
    @torch.jit.script
    def restore(version: int) -> str:
        s = torch.classes.torch_monitor.Stat("placeholder", ["sum"], 1.0)
        s.__setstate__((version, "restored", [4, 3], 5000, 7))
        return s.name() + "/" + str(s.window_size_ms()) + "/" + str(s.max_samples())

    assert restore(1) == "restored/5000/7"  # version 1 had five fields
    with pytest.raises(RuntimeError, match=r"state of version 2 has 5 fields, not 7"):
        restore(2)

    @torch.jit.script
    def restore_v2(version: int) -> str:
        s = torch.classes.torch_monitor.Stat("placeholder", ["sum"], 1.0)
        s.__setstate__((version, "restored", [4, 3], 0, 7, False, 25))
        return s.name() + "/" + str(s.window_steps()) + "/" + str(s.max_samples())

    assert restore_v2(2) == "restored/25/7"
    with pytest.raises(RuntimeError, match=r"state of version 3 has 7 fields, not 8"):
        restore_v2(3)

    @torch.jit.script
    def restore_v3(version: int) -> str:
        s = torch.classes.torch_monitor.Stat("placeholder", ["sum"], 1.0)
        s.__setstate__((version, "restored", [4, 3], 0, 7, False, 25, False))
        return s.name() + "/" + str(s.window_steps()) + "/" + str(s.sync_ranks())

    assert restore_v3(3) == "restored/25/False"
    with pytest.raises(RuntimeError, match=r"saved state is not \(version, configuration\)"):
        restore_v3(4)

    @torch.jit.script
    def restore_int(version: int) -> str:
        s = torch.classes.torch_monitor.IntStat("placeholder", ["sum"], 1.0)
        s.__setstate__((version, "restored", [4], 5000, 7))
        return s.name()

    assert restore_int(1) == "restored"
    with pytest.raises(RuntimeError, match=r"state version 99; this build reads versions 1, 2, 3, 4"):
        restore_int(99)


def rewrite_archive(src, dst, version):
    """Copies a saved model, setting the Stat state's version to ``version``."""
    name, data = read_data_pkl(src)
    (op, arg, pos), = custom_class_states(data)["Stat"]
    assert op.name == "BININT1" and arg == 4
    patched = data[: pos + 1] + bytes([version]) + data[pos + 2 :]
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, patched if info.filename == name else zin.read(info))


@pytest.fixture(scope="session")
def bad_version_model(saved_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("bad_model") / "version5.pt"
    rewrite_archive(saved_model, path, 5)
    return path


def test_unknown_state_version_fails_on_load(tmon, saved_model, bad_version_model, tmp_path):
    # Control: the same rewrite with the version kept loads and runs.
    same = tmp_path / "version4.pt"
    rewrite_archive(saved_model, same, 4)
    model = torch.jit.load(str(same))
    assert model.stat.name() == "model.loss"
    assert model(1.0) == 2.0
    del model
    gc.collect()

    with pytest.raises(RuntimeError, match=r"Stat: it was saved with state version 5; this build reads versions 1, 2, 3, 4"):
        torch.jit.load(str(bad_version_model))


@requires_toolchain
def test_cpp_consumer_rejects_unknown_state_version(consumer, bad_version_model):
    proc = run([consumer / "torch_monitor_script_only", bad_version_model, 1.0])
    assert proc.returncode == 2
    assert "Stat: it was saved with state version 5; this build reads versions 1, 2, 3, 4" in proc.stderr
    assert not [line for line in json_lines(proc.stdout) if line["kind"] == "result"]


# ------------------------------------------------------------ a relocated package


class MovedPackage:
    """The installed C++ package (lib/, include/) copied to another folder."""

    def __init__(self, root):
        self.root = root
        self.cmake_prefix_path = str(root / "lib" / "cmake")
        self.library_path = str(root / "lib" / "libtorch_monitor.so")


@pytest.fixture(scope="session")
def moved_consumer(tmon, tmp_path_factory):
    """test/consumer built against a copy of the package in another folder."""
    installed = os.path.dirname(tmon.library_path)  # .../torch_monitor/lib
    moved = MovedPackage(tmp_path_factory.mktemp("elsewhere") / "prefix")
    shutil.copytree(installed, moved.root / "lib")
    shutil.copytree(os.path.join(installed, "..", "include"), moved.root / "include")
    build = build_project(
        CONSUMER_SRC, tmp_path_factory.mktemp("moved_build"), moved,
        ("torch_monitor_consumer",),
    )
    return moved, build


def test_installed_cmake_package_names_no_build_machine_path(tmon):
    """Torch is found where it is installed (find_dependency), not recorded."""
    import torch

    torch_lib = os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib"))
    package = os.path.join(tmon.cmake_prefix_path, "TorchMonitor")
    texts = {
        name: open(os.path.join(package, name)).read()
        for name in os.listdir(package)
        if name.endswith(".cmake")
    }
    assert "TorchMonitorTargets.cmake" in texts
    for name, text in texts.items():
        assert torch_lib not in text and "libc10" not in text, name
        assert os.path.dirname(tmon.__file__) not in text, name


@requires_toolchain
def test_consumer_builds_against_a_moved_package(moved_consumer, tmon):
    moved, build = moved_consumer
    exe = build / "torch_monitor_consumer"
    proc = run([exe])
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stderr
    if shutil.which("ldd"):  # the moved copy is the one it runs with
        ldd = run(["ldd", exe]).stdout
        line = next(l for l in ldd.splitlines() if "libtorch_monitor.so" in l)
        assert os.path.realpath(moved.library_path) in line or str(moved.root) in line, ldd


@requires_toolchain
def test_cpp_version_macros_match_the_distribution(consumer, tmon):
    proc = run([consumer / "torch_monitor_consumer"])
    assert proc.returncode == 0, proc.stderr
    (version,) = [l for l in json_lines(proc.stdout) if l["kind"] == "version"]
    assert version["string"] == tmon.__version__
    assert ".".join(map(str, version["parts"])) == tmon.__version__
