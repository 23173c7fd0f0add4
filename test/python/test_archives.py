"""Archives written by an earlier torch_monitor still load (issue 25: one
versioned state per object, and old states keep loading).

The files in data/archives were written at commit 3c7f56d (see the README
there); the values checked here are the ones they were written with.
"""

import pathlib
import pickle

import pytest
import torch

tm = pytest.importorskip("torch_monitor")

ARCHIVES = pathlib.Path(__file__).parent / "data" / "archives"


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    # The sinks of objects_*.pt were saved with relative paths.
    monkeypatch.chdir(tmp_path)
    return tmp_path


def config(obj):
    return dict(obj.__obj_flatten__())


def test_objects_saved_by_torch_jit_save_load_with_their_settings(scratch):
    m = torch.jit.load(str(ARCHIVES / "objects_3c7f56d.pt"))
    assert config(m.stat) == {
        "name": "archived.loss", "aggregations": ["mean", "max"], "window_size_ms": 30000,
        "window_steps": 0, "max_samples": 100, "close_on_time": True, "sync_ranks": False,
    }
    assert config(m.steps)["window_steps"] == 7 and config(m.steps)["aggregations"] == ["sum"]
    assert config(m.ints)["aggregations"] == ["count", "max"] and config(m.ints)["window_steps"] == 3
    assert config(m.wait) == {"key": "archived.wait", "window_size_ms": 12000, "close_on_time": True}
    tb = config(m.tb)
    assert (tb["log_dir"], tb["flush_interval"], tb["max_buffer_bytes"], tb["event_names"], tb["step_key"]) == (
        "archived_tb", 2.5, 1 << 20, ["torch.monitor.Stat"], "archived.step"
    )
    jsonl = config(m.jsonl)
    assert (jsonl["path"], jsonl["flush_interval"], jsonl["max_buffer_bytes"], jsonl["event_names"]) == (
        "archived.jsonl", 3.5, 1 << 19, ["a", "b"]
    )
    # Saved before the sinks' state held `ranks`: they load as each rank's
    # own files, the default (docs/sinks.md).
    assert tb["ranks"] == jsonl["ranks"] == "separate"
    assert config(m.console) == {"stream": "stdout", "event_names": ["c"]}
    assert config(m.memory) == {"capacity": 5, "event_names": ["d"]}
    assert config(m.prom) == {"path": "archived.prom", "labels": {"job": "archive"}}
    for sink in (m.tb, m.jsonl):
        sink.close()


def test_a_monitored_model_saved_by_torch_jit_save_keeps_its_history():
    model = torch.jit.load(str(ARCHIVES / "monitored_3c7f56d.pt"))
    monitors = tm.monitors_of(model)
    kinds = sorted(m.kind() for m in monitors.values())
    assert kinds == ["DifferenceMonitor", "OutputMonitor"]
    difference = next(m for m in monitors.values() if m.kind() == "DifferenceMonitor")
    # EMA (alpha 0.5) of the buffer's changes 1, 2, 3, newest first.
    torch.testing.assert_close(difference.dump(), torch.tensor([[2.25] * 2, [1.5] * 2, [1.0] * 2]))
    expected = torch.load(str(ARCHIVES / "monitored_3c7f56d_expected.pt"))
    output = next(m for m in monitors.values() if m.kind() == "OutputMonitor")
    torch.testing.assert_close(output.dump(), expected["out"])
    # It goes on recording: the next change is 4, so the EMA is 3.125.
    model(torch.full((1, 3), 4.0))
    torch.testing.assert_close(difference.peek(), torch.full((2,), 3.125))


def test_python_pickles_load():
    with open(ARCHIVES / "pickles_3c7f56d.pkl", "rb") as f:
        saved = pickle.load(f)
    stat = saved["stat"]
    assert isinstance(stat, tm.Stat)
    assert (stat.name, stat.window_steps, stat.max_samples) == ("archived.pickled", 5, 9)
    assert stat.aggregations == [tm.MEAN, tm.COUNT]
    reducer = saved["reducer"]
    assert isinstance(reducer, tm.EMAReducer) and (reducer.dt, reducer.duration, reducer.alpha) == (1.0, 3.0, 0.5)
    torch.testing.assert_close(reducer.dump(), torch.tensor([[1.25] * 2, [0.5] * 2, [0.0] * 2]))
    monitor = saved["monitor"]
    assert isinstance(monitor, tm.DifferenceMonitor)
    assert (monitor.attr, monitor.trainexec, monitor.evalexec, monitor.keep_graph) == ("weight", True, False, True)
    assert isinstance(monitor.reducer, tm.CAReducer) and monitor.reducer.duration == 2.0
    torch.testing.assert_close(monitor.dump(), saved["monitor_dump"])


def test_torch_save_loads():
    saved = torch.load(str(ARCHIVES / "torch_save_3c7f56d.pt"), weights_only=False)
    torch.testing.assert_close(saved["reducer"].dump(), torch.tensor([[1.25] * 2, [0.5] * 2, [0.0] * 2]))
    assert saved["monitor"].attr == "weight" and not saved["monitor"].evalexec
