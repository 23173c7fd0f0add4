"""TensorBoardWriter.add_histogram against SummaryWriter.add_histogram.

The same tensor is written by torch.utils.tensorboard.SummaryWriter (default
bins="tensorflow") and by our writer, from Python and from TorchScript; both
files are read back with TensorBoard's EventAccumulator, the oracle, and the
HistogramProtos must agree: bucket limits, counts, min, max and num exactly,
sum and sum_squares up to float summation order.
"""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402


def read_histograms(logdir):
    """{tag: [(step, HistogramValue), ...]} as TensorBoard reads them."""
    acc = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.HISTOGRAMS: 0}
    )
    acc.Reload()
    return {
        tag: [(e.step, e.histogram_value) for e in acc.Histograms(tag)]
        for tag in acc.Tags()["histograms"]
    }


def theirs(values, logdir):
    writer = SummaryWriter(str(logdir))
    writer.add_histogram("h", values, 7)
    writer.close()
    [(step, histo)] = read_histograms(logdir)["h"]
    assert step == 7
    return histo


def ours_python(tm, values, logdir):
    writer = tm.TensorBoardWriter(str(logdir))
    writer.add_histogram("h", values, 7)
    writer.close()
    [(step, histo)] = read_histograms(logdir)["h"]
    assert step == 7
    return histo


class ScriptedWriter(torch.nn.Module):
    def __init__(self, logdir: str):
        super().__init__()
        self.writer = torch.classes.torch_monitor.TensorBoardWriter(logdir, 3600.0)

    def forward(self, values: torch.Tensor) -> int:
        self.writer.add_histogram("h", values, 7)
        return 0


def ours_script(values, logdir):
    module = torch.jit.script(ScriptedWriter(str(logdir)))
    module(values)
    module.writer.close()
    [(step, histo)] = read_histograms(logdir)["h"]
    assert step == 7
    return histo


def same_float(a, b, tolerance=0.0):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= tolerance


def assert_same(ours, ref):
    assert list(ours.bucket_limit) == list(ref.bucket_limit)
    assert list(ours.bucket) == list(ref.bucket)
    assert ours.num == ref.num
    assert same_float(ours.min, ref.min) and same_float(ours.max, ref.max)
    # numpy (pairwise sum, BLAS dot) and torch may add in another order: the
    # rounding error is relative to the terms, not to a cancelling result
    largest = max(abs(ref.min), abs(ref.max))
    if math.isfinite(largest):
        terms = largest * ref.num
        assert same_float(ours.sum, ref.sum, 1e-12 * terms), (ours.sum, ref.sum)
        assert same_float(ours.sum_squares, ref.sum_squares, 1e-12 * largest * terms)
    else:
        assert same_float(ours.sum, ref.sum) and same_float(ours.sum_squares, ref.sum_squares)


def _tensors():
    g = torch.Generator().manual_seed(0)
    nan, inf = float("nan"), float("inf")
    return {
        "normal": torch.randn(1000, generator=g),
        "single": torch.tensor([3.5]),
        "zero_dim": torch.tensor(-2.25),
        "zeros": torch.zeros(5),
        "mixed_signs": torch.tensor([-3.0, -1e-5, 0.0, 2e-7, 50.0]),
        "large_range": torch.tensor([-1e15, -1.0, 1e-10, 1e18], dtype=torch.float64),
        "beyond_edges": torch.tensor([1e25, -1e30, 1.0, 1e-20]),
        "int64": torch.arange(-50, 50),
        "int32": torch.randint(-1000, 1000, (300,), generator=g, dtype=torch.int32),
        "uint8": torch.randint(0, 255, (64,), generator=g, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "float16": torch.randn(200, generator=g).half(),
        "bfloat16": torch.randn(200, generator=g).bfloat16(),
        "float64": torch.randn(500, generator=g, dtype=torch.float64) * 1e6,
        "non_contiguous": torch.randn(20, 30, generator=g).t()[::2],
        "3d": torch.randn(4, 5, 6, generator=g),
        "requires_grad": torch.randn(100, generator=g).requires_grad_(),
        "nan_inf": torch.tensor([1.0, nan, 2.0, inf, -inf]),
        "nan_only_some": torch.tensor([nan, 0.5]),
        # CPU tensors are bucketed in chunks of 2**20 elements (whole rows,
        # or parts of a row longer than that): the chunks add up exactly.
        "chunks": torch.randn(3_000_000, generator=g),
        "chunks_long_rows": torch.randn(2, 1_500_000, generator=g, dtype=torch.float64),
        "chunks_expanded": torch.randn(1000, generator=g).expand(3000, 1000),
        "chunks_nan_late": torch.cat([torch.randn(2_500_000, generator=g), torch.tensor([nan])]),
    }


TENSORS = _tensors()


@pytest.mark.parametrize("name", sorted(TENSORS))
def test_same_histogram_as_summary_writer(tm, tmp_path, name):
    values = TENSORS[name]
    ref = theirs(values, tmp_path / "theirs")
    assert_same(ours_python(tm, values, tmp_path / "python"), ref)
    assert_same(ours_script(values, tmp_path / "script"), ref)


def test_values_on_the_last_edge_and_between_edges(tm, tmp_path):
    """numpy's last bucket includes its upper edge; values on inner edges
    start their bucket."""
    edges = SummaryWriter(str(tmp_path / "edges")).default_bins
    values = torch.tensor(
        [edges[-1], edges[0], edges[700], edges[800], edges[801] * 0.999999, 0.0],
        dtype=torch.float64,
    )
    assert_same(ours_python(tm, values, tmp_path / "ours"), theirs(values, tmp_path / "ref"))


@pytest.mark.cuda
def test_cuda_tensor_same_histogram(tm, tmp_path):
    values = torch.randn(100_000, device="cuda") * 3
    ref = theirs(values, tmp_path / "theirs")
    assert_same(ours_python(tm, values, tmp_path / "python"), ref)
    assert_same(ours_script(values, tmp_path / "script"), ref)


def test_bad_values(tm, tmp_path):
    writer = tm.TensorBoardWriter(str(tmp_path))
    try:
        with pytest.raises(ValueError, match="empty"):
            writer.add_histogram("h", torch.zeros(0), 1)
        with pytest.raises(TypeError, match="complex"):
            writer.add_histogram("h", torch.ones(3, dtype=torch.complex64), 1)
        # SummaryWriter raises ValueError too when no value is in range
        with pytest.raises(ValueError, match="no value lies within"):
            writer.add_histogram("h", torch.tensor([float("nan"), float("inf")]), 1)
        with pytest.raises(TypeError):
            writer.add_histogram("h", [1.0, 2.0], 1)
        # Refused at the call, not when the writer reads them (late, in
        # ATen's words, the point dropped).
        with pytest.raises(ValueError, match="meta device"):
            writer.add_histogram("h", torch.empty(3, device="meta"), 1)
        with pytest.raises(TypeError, match="dense tensor, got layout Sparse"):
            writer.add_histogram("h", torch.eye(3).to_sparse(), 1)
        with pytest.warns(UserWarning, match="nested tensors"), pytest.raises(TypeError, match="nested"):
            writer.add_histogram("h", torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), 1)
        # None (a monitor before its first step) writes nothing
        writer.add_histogram("h", None, 1)
        writer.add_histogram("ok", torch.ones(2), 3)
    finally:
        writer.close()
    histos = read_histograms(tmp_path)
    assert list(histos) == ["ok"]
    assert writer.dropped == 0


def test_steps_given_or_counted_per_tag(tm, tmp_path):
    writer = tm.TensorBoardWriter(str(tmp_path))
    for _ in range(3):
        writer.add_histogram("a", torch.ones(2))
    writer.add_histogram("b", torch.ones(2))
    writer.add_histogram("b", torch.ones(2), global_step=2**40, walltime=1234.5)
    writer.close()
    histos = read_histograms(tmp_path)
    assert [s for s, _ in histos["a"]] == [0, 1, 2]
    assert [s for s, _ in histos["b"]] == [0, 2**40]
    acc = event_accumulator.EventAccumulator(
        str(tmp_path), size_guidance={event_accumulator.HISTOGRAMS: 0}
    )
    acc.Reload()
    assert acc.Histograms("b")[1].wall_time == 1234.5


# ------------------------------------------------ monitors feed histograms

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def train(model, steps, after_step):
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        model(torch.zeros(1, 4))  # the forward that records the update
        after_step(step)


def test_difference_monitor_feeds_a_histogram_every_n_steps(tm, tmp_path):
    """The one line of docs/sinks.md, in Python, with the monitor's
    difference checked against SummaryWriter."""
    model = Net()
    monitor = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "fc.weight", model)
    writer = tm.TensorBoardWriter(str(tmp_path / "ours"))
    ref = SummaryWriter(str(tmp_path / "ref"))

    def after_step(step):
        if step % 3 == 0:
            writer.add_histogram("fc.weight.update", monitor.peek(), step)
            ref.add_histogram("fc.weight.update", monitor.peek(), step)

    train(model, 10, after_step)
    writer.close()
    ref.close()
    ours = read_histograms(tmp_path / "ours")["fc.weight.update"]
    theirs_ = read_histograms(tmp_path / "ref")["fc.weight.update"]
    assert [s for s, _ in ours] == [0, 3, 6, 9] == [s for s, _ in theirs_]
    for (_, a), (_, b) in zip(ours, theirs_):
        assert_same(a, b)
        assert a.num == 12


class TrainStep(torch.nn.Module):
    """A scripted training step that logs the monitor's newest update."""

    def __init__(self, monitor, writer):
        super().__init__()
        self.monitor = monitor
        self.writer = writer

    def forward(self, step: int) -> int:
        if step % 3 == 0:
            self.writer.add_histogram("fc.weight.update", self.monitor.peek(), step)
        return step


def test_difference_monitor_feeds_a_histogram_from_torchscript(tm, tmp_path):
    model = Net()
    monitor = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "fc.weight", model)
    writer = torch.classes.torch_monitor.TensorBoardWriter(str(tmp_path / "ours"), 3600.0)
    logger = torch.jit.script(TrainStep(monitor.core, writer))
    logger(0)  # before the first forward: peek() is None, nothing is written
    ref = SummaryWriter(str(tmp_path / "ref"))

    def after_step(step):
        logger(step)
        if step % 3 == 0:
            ref.add_histogram("fc.weight.update", monitor.peek(), step)

    train(model, 7, after_step)
    writer.close()
    ref.close()
    ours = read_histograms(tmp_path / "ours")["fc.weight.update"]
    theirs_ = read_histograms(tmp_path / "ref")["fc.weight.update"]
    assert [s for s, _ in ours] == [0, 3, 6] == [s for s, _ in theirs_]
    for (_, a), (_, b) in zip(ours, theirs_):
        assert_same(a, b)


class ScriptedSteps(torch.nn.Module):
    def __init__(self, logdir: str):
        super().__init__()
        self.writer = torch.classes.torch_monitor.TensorBoardWriter(logdir, 3600.0)

    def forward(self, values: torch.Tensor, step: torch.Tensor) -> int:
        self.writer.add_histogram("counted", values)
        self.writer.add_histogram("given", values, step)
        self.writer.add_histogram("none", None, step)
        return 0


def test_script_steps_as_tensors_or_counted(tmp_path):
    module = torch.jit.script(ScriptedSteps(str(tmp_path)))
    for step in (5, 9):
        module(torch.ones(3), torch.tensor(step))
    with pytest.raises(Exception, match="step must be an int"):
        module(torch.ones(3), torch.tensor(1.5))
    module.writer.close()
    histos = read_histograms(tmp_path)
    assert sorted(histos) == ["counted", "given"]
    # the failed call wrote "counted" (step 2) before add_histogram("given") threw
    assert [s for s, _ in histos["counted"]] == [0, 1, 2]
    assert [s for s, _ in histos["given"]] == [5, 9]


class CompiledWriter(torch.nn.Module):
    def __init__(self, writer):
        super().__init__()
        self.tb = writer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        self.tb.add_histogram("y", y, 3)
        return y + 1


def test_torch_compile_and_export_write_histograms(tm, tmp_path):
    """The call stays in compiled and exported graphs (call_torchbind)."""
    writer = tm.TensorBoardWriter(str(tmp_path))
    module = CompiledWriter(writer)
    x = torch.randn(10)
    torch.compile(module, fullgraph=True)(x)
    torch.export.export(module, (x,), strict=False).module()(x)
    writer.close()
    histos = read_histograms(tmp_path)["y"]
    assert len(histos) == 2
    assert all(h.num == 10 and h.sum == pytest.approx(float((x * 2).sum())) for _, h in histos)
