"""TensorBoardWriter.add_scalar and add_histogram with a tensor on a device:
the call never waits for the device. The value is copied (a histogram's
summary computed) on the device at the call and read when the writer writes,
every such point of a write in one read.

On a machine without a GPU the CPU tensors take that path through
torch_monitor.testing.cpu_tensors_take_device_path(); the tests marked cuda
check it on a real device (scripts/test_gpu.sh). Files are read back with
TensorBoard's own reader, the oracle.
"""

import time
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensorboard")
from conftest import load_module  # noqa: E402
from test_histograms import assert_same, read_histograms, theirs  # noqa: E402
from test_sinks import f32, read_scalars  # noqa: E402

# Deferred points after which the writer is asked to write at once
# (TensorBoardWriter::Impl::kFlushDeferredAt).
FLUSH_DEFERRED_AT = 1024


@pytest.fixture
def tm():
    module = load_module("torch_monitor")
    import torch_monitor.testing  # noqa: F401

    return module


@pytest.fixture
def device_path(tm):
    with tm.testing.cpu_tensors_take_device_path():
        yield torch.device("cpu")


def writer_of(tm, path):
    return tm.TensorBoardWriter(str(path), flush_interval=3600.0)


def test_scalar_is_the_value_at_the_call_read_at_the_write(tm, device_path, tmp_path):
    writer = writer_of(tm, tmp_path)
    loss = torch.tensor(0.25, requires_grad=True) * 1.0
    try:
        writer.add_scalar("loss", loss, 3)
        with torch.no_grad():
            loss.add_(1.0)  # after the call: not what is written
        writer.add_scalar("loss", torch.tensor([[2.5]], dtype=torch.float16), 4)
        writer.add_scalar("count", torch.tensor(7), 4)
        assert read_scalars(tmp_path) == {}  # nothing read or written yet
        writer.flush()
    finally:
        writer.close()
    scalars = read_scalars(tmp_path)
    assert [(s, v) for s, v, _ in scalars["loss"]] == [(3, 0.25), (4, 2.5)]
    assert [(s, v) for s, v, _ in scalars["count"]] == [(4, 7.0)]


def test_steps_are_taken_at_the_call(tm, device_path, tmp_path):
    writer = writer_of(tm, tmp_path)
    try:
        tm.set_step(5)
        writer.add_scalar("a", torch.tensor(1.0))  # the training step now
        writer.add_scalar("b", torch.tensor(2.0), walltime=1234.5)
        tm.set_step(9)
        tm.set_step(None)
        writer.add_scalar("c", torch.tensor(3.0))  # no step: the tag's counter
        writer.add_scalar("c", torch.tensor(4.0))
    finally:
        writer.close()  # close writes the points still waiting
    scalars = read_scalars(tmp_path)
    assert [(s, v) for s, v, _ in scalars["a"]] == [(5, 1.0)]
    assert [(s, v, w) for s, v, w in scalars["b"]] == [(5, 2.0, 1234.5)]
    assert [(s, v) for s, v, _ in scalars["c"]] == [(0, 3.0), (1, 4.0)]


def test_bad_scalars_are_refused_at_the_call(tm, device_path, tmp_path):
    writer = writer_of(tm, tmp_path)
    try:
        with pytest.raises(ValueError, match="one-element tensor"):
            writer.add_scalar("x", torch.ones(2))
        with pytest.raises(TypeError, match="real"):
            writer.add_scalar("x", torch.ones(1, dtype=torch.complex64))
    finally:
        writer.close()
    assert read_scalars(tmp_path) == {}


def test_histogram_is_of_the_values_at_the_call(tm, device_path, tmp_path):
    values = torch.randn(1000, generator=torch.Generator().manual_seed(2)) * 3
    ref = theirs(values, tmp_path / "theirs")
    writer = writer_of(tm, tmp_path / "ours")
    try:
        writer.add_histogram("h", values, 7)
        values.mul_(10)  # after the call: not what is written
        assert read_histograms(tmp_path / "ours") == {}
        writer.flush()
    finally:
        writer.close()
    [(step, histo)] = read_histograms(tmp_path / "ours")["h"]
    assert step == 7
    assert_same(histo, ref)


def test_histogram_out_of_range_warns_at_the_write(tm, device_path, tmp_path):
    writer = writer_of(tm, tmp_path)
    try:
        with pytest.raises(ValueError, match="empty"):
            writer.add_histogram("h", torch.zeros(0), 1)  # checked at the call
        writer.add_histogram("h", torch.tensor([float("nan"), float("inf")]), 1)
        writer.add_histogram("ok", torch.ones(2), 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            writer.flush()
    finally:
        writer.close()
    assert list(read_histograms(tmp_path)) == ["ok"]
    messages = [str(w.message) for w in caught] + list(writer.problems)
    assert any("no value inside the histogram's range" in m for m in messages), messages


def test_scripted_add_scalar_defers_too(tm, device_path, tmp_path):
    class Logs(torch.nn.Module):
        def __init__(self, logdir: str):
            super().__init__()
            self.writer = torch.classes.torch_monitor.TensorBoardWriter(logdir, 3600.0)

        def forward(self, loss: torch.Tensor, step: int) -> torch.Tensor:
            self.writer.add_scalar("loss", loss, step)
            return loss

    module = torch.jit.script(Logs(str(tmp_path)))
    loss = torch.tensor(0.5)
    module(loss, 1)
    loss.fill_(9.0)
    module.writer.close()
    assert [(s, v) for s, v, _ in read_scalars(tmp_path)["loss"]] == [(1, 0.5)]


def test_many_waiting_points_ask_for_a_write(tm, device_path, tmp_path):
    writer = writer_of(tm, tmp_path)
    try:
        for step in range(FLUSH_DEFERRED_AT):
            writer.add_scalar("x", torch.tensor(float(step)), step)
        deadline = time.monotonic() + 60
        while len(read_scalars(tmp_path).get("x", [])) < FLUSH_DEFERRED_AT:
            assert time.monotonic() < deadline, "the writer did not write the waiting points"
            time.sleep(0.05)
    finally:
        writer.close()
    assert [v for _, v, _ in read_scalars(tmp_path)["x"]] == [float(s) for s in range(FLUSH_DEFERRED_AT)]
    assert writer.dropped == 0


def test_cpu_tensors_are_read_at_the_call(tm, tmp_path):
    writer = writer_of(tm, tmp_path)
    loss = torch.tensor(0.25)
    try:
        writer.add_scalar("loss", loss, 1)
        loss.fill_(2.0)
        writer.flush()
    finally:
        writer.close()
    assert [(s, v) for s, v, _ in read_scalars(tmp_path)["loss"]] == [(1, 0.25)]


@pytest.mark.cuda
def test_cuda_points_never_synchronise_and_are_the_values_at_the_call(tm, tmp_path):
    values = torch.randn(100_000, device="cuda") * 3
    loss = torch.tensor(0.125, device="cuda")
    ref = theirs(values.cpu(), tmp_path / "theirs")
    writer = writer_of(tm, tmp_path / "ours")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(3):
            writer.add_scalar("loss", loss, step)
            loss.add_(1.0)
        writer.add_histogram("h", values, 7)
        values.mul_(10)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    writer.close()
    scalars = read_scalars(tmp_path / "ours")
    assert [(s, v) for s, v, _ in scalars["loss"]] == [(0, 0.125), (1, 1.125), (2, 2.125)]
    [(step, histo)] = read_histograms(tmp_path / "ours")["h"]
    assert step == 7
    assert_same(histo, ref)


@pytest.mark.cuda
def test_cuda_points_from_another_stream(tm, tmp_path):
    writer = writer_of(tm, tmp_path)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        loss = torch.full((), 0.5, device="cuda")
        torch.cuda._sleep(50_000_000)  # the stream is still busy at the write
        writer.add_scalar("loss", loss * 2, 1)
    writer.add_scalar("other", torch.tensor(3.0, device="cuda"), 1)
    writer.close()
    scalars = read_scalars(tmp_path)
    assert [(s, v) for s, v, _ in scalars["loss"]] == [(1, f32(1.0))]
    assert [(s, v) for s, v, _ in scalars["other"]] == [(1, 3.0)]
