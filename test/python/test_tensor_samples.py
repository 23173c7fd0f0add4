"""stat.add(tensor): every element is one sample, exactly as adding the
elements one by one as Python numbers (the oracle), for every aggregation,
dtype and layout; NaN and infinities follow the same rules as floats.

Every test runs twice: with CPU tensors read at once (their own path) and
with CPU tensors taking the path of accelerator tensors (elements kept in a
buffer on the device, read when the window closes), which the CUDA tests at
the end check on a real device. Beyond the buffer's 65536 elements that path
folds them into summary rows on the device, whose SUM and MEAN may differ
from the one-by-one sum in the last bits."""

from datetime import timedelta

import pytest
import torch

tm = pytest.importorskip("torch_monitor")
import torch_monitor.testing  # noqa: E402,F401  (tm.testing)
from windows import closed_windows  # noqa: E402

ALL = [tm.VALUE, tm.MEAN, tm.COUNT, tm.SUM, tm.MAX, tm.MIN]
_names = iter(range(10**6))
_summed_on_device = False


@pytest.fixture(autouse=True, params=["host", "device"])
def tensor_path(request):
    global _summed_on_device
    _summed_on_device = request.param == "device"
    if _summed_on_device:
        with tm.testing.cpu_tensors_take_device_path():
            yield request.param
    else:
        yield request.param


def windows(make, feed_tensor, feed_items):
    """One closed window of a stat fed with tensors and one of a stat fed
    with the same elements as numbers."""
    tensor_stat = make(f"tensor.samples.{next(_names)}")
    item_stat = make(f"item.samples.{next(_names)}")
    feed_tensor(tensor_stat)
    feed_items(item_stat)
    return closed_windows(tensor_stat, item_stat)


def assert_same(got, want):
    assert got.keys() == want.keys()
    for key in want:
        if want[key] != want[key]:  # NaN
            assert got[key] != got[key], key
        elif _summed_on_device and key in (".sum", ".mean"):
            assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-12), key
        else:
            assert got[key] == want[key], key


def stat(name):
    return tm.Stat(name, ALL, timedelta(hours=1))


def int_stat(name):
    return tm.IntStat(name, ALL, timedelta(hours=1))


def _holds_values(dtype):
    try:
        torch.ones(1).to(dtype)
        return True
    except (RuntimeError, TypeError):  # bit-packed and sub-byte kinds
        return False


# Every real dtype torch makes tensors of values in (the float8 and unsigned
# kinds included), found in torch itself, so a new one is tested by existing.
REAL_DTYPES = sorted(
    {d for d in vars(torch).values()
     if isinstance(d, torch.dtype) and not d.is_complex and _holds_values(d)
     and d not in (torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4)},
    key=str,
)


@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=str)
def test_every_element_is_one_sample_like_adding_numbers(dtype):
    gen = torch.Generator().manual_seed(1)
    values = [torch.randn(3, 4, generator=gen) * 20 for _ in range(3)]
    values = [(t if dtype.is_signed else t.abs()).to(dtype) for t in values]
    values.append(torch.tensor(7).to(dtype))  # a 0-d tensor, a loss

    def items(s):
        for t in values:
            for x in t.reshape(-1).tolist():
                s.add(float(x))

    def tensors(s):
        for t in values:
            s.add(t)

    assert_same(*windows(stat, tensors, items))


def test_floats_and_tensors_mix_in_one_window():
    def mixed(s):
        s.add(1.0)
        s.add(torch.tensor([2.0, 3.0]))
        s.add(4)

    def numbers(s):
        for x in (1.0, 2.0, 3.0, 4.0):
            s.add(x)

    assert_same(*windows(stat, mixed, numbers))


def test_non_contiguous_and_grad_tensors_are_read_as_their_elements():
    base = torch.arange(12.0, requires_grad=True).reshape(3, 4)
    view = base.t()[1:]  # non-contiguous, part of a graph

    def tensors(s):
        s.add(view)

    def items(s):
        for x in view.detach().reshape(-1).tolist():
            s.add(x)

    assert_same(*windows(stat, tensors, items))


def test_nan_and_infinities_follow_the_float_rules():
    special = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0])

    def tensors(s):
        s.add(special)

    def items(s):
        for x in special.tolist():
            s.add(x)

    assert_same(*windows(stat, tensors, items))


@pytest.mark.parametrize("dtype", [d for d in REAL_DTYPES if not d.is_floating_point], ids=str)
def test_intstat_takes_integer_tensors(dtype, tensor_path):
    if dtype == torch.uint64 and tensor_path == "device":
        pytest.skip("refused on the device path: test_intstat_refuses_uint64_it_cannot_hold")
    values = torch.tensor([[3, 1], [4, 1]]).to(dtype)

    def tensors(s):
        s.add(values)
        s.add(5)

    def items(s):
        for x in values.reshape(-1).tolist():
            s.add(int(x))
        s.add(5)

    assert_same(*windows(int_stat, tensors, items))


def test_intstat_refuses_uint64_it_cannot_hold(tensor_path):
    """An int64 sample cannot hold a uint64 past 2**63 - 1: refused, never
    wrapped (to -1), as IntStat.add(2**64 - 1) is; on a device, where the
    values cannot be seen without waiting, every uint64 tensor is."""
    s = int_stat(f"refuse.uint64.{next(_names)}")
    big = torch.tensor([1, 2**64 - 1], dtype=torch.uint64)
    if tensor_path == "device":
        with pytest.raises(TypeError, match="uint64 tensors on the CPU only"):
            s.add(big)
    else:
        with pytest.raises(ValueError, match="element 1 of the uint64 tensor, 18446744073709551615, does not fit"):
            s.add(big)
    assert s.count == 0  # nothing of it was added
    with pytest.raises(OverflowError):
        s.add(2**64 - 1)


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "mkldnn"])
def test_tensors_that_are_not_dense_are_refused_saying_what_to_add(layout):
    dense = torch.eye(2)
    values = {"sparse_coo": dense.to_sparse, "sparse_csr": dense.to_sparse_csr, "mkldnn": dense.to_mkldnn}[layout]()
    with pytest.raises(TypeError, match=r"takes dense tensors, got a .* tensor; add values.to_dense\(\)"):
        stat(f"refuse.{layout}.{next(_names)}").add(values)


def test_intstat_refuses_floating_tensors_and_complex_is_refused():
    with pytest.raises(TypeError, match="takes integer tensors"):
        tm.IntStat("refuse.float", [tm.SUM], timedelta(hours=1)).add(torch.ones(2))
    with pytest.raises(TypeError, match="real tensors"):
        tm.Stat("refuse.complex", [tm.SUM], timedelta(hours=1)).add(torch.ones(2, dtype=torch.cfloat))


def test_scripted_code_adds_tensors_like_numbers():
    class Adds(torch.nn.Module):
        def __init__(self, stat):
            super().__init__()
            self.stat = stat

        def forward(self, x: torch.Tensor) -> None:
            self.stat.add(x)  # the TorchScript add takes numbers and tensors
            self.stat.add(2.5)

    values = torch.tensor([[1.0, -3.0], [float("nan"), 8.0]])

    def tensors(s):
        torch.jit.script(Adds(s))(values)

    def items(s):
        for x in values.reshape(-1).tolist() + [2.5]:
            s.add(x)

    assert_same(*windows(stat, tensors, items))


def test_order_of_numbers_and_tensors_decides_value_and_first_sample():
    nan = float("nan")
    cases = [
        [torch.tensor([1.0, 2.0]), 5.0],  # a number last: VALUE is it
        [5.0, torch.tensor([1.0, 2.0])],  # a tensor last: its last element
        [torch.tensor([nan, 3.0]), 1.0, torch.tensor(9.0)],  # NaN first poisons
        [1.0, torch.tensor([nan, 3.0]), -2.0],  # a later NaN is ignored
        [torch.tensor(nan), torch.tensor([4.0, nan, -4.0])],
        [torch.tensor([2.0, nan]), torch.tensor([nan, nan]), 0.5],
    ]
    for samples in cases:

        def mixed(s, samples=samples):
            for x in samples:
                s.add(x)

        def numbers(s, samples=samples):
            for x in samples:
                for v in (x.reshape(-1).tolist() if torch.is_tensor(x) else [x]):
                    s.add(v)

        assert_same(*windows(stat, mixed, numbers))


def test_many_tensor_adds_in_one_window():
    # More adds than the device path keeps as rows (it then folds them on
    # the device), with NaN and infinities among them.
    gen = torch.Generator().manual_seed(3)
    values = [torch.randn(int(n), generator=gen) for n in torch.randint(1, 5, (2500,), generator=gen)]
    values[0][0] = float("nan")  # poisons MAX and MIN for the whole window
    values[700][0] = float("inf")
    values.append(torch.tensor(-1.0))

    def tensors(s):
        for t in values:
            s.add(t)

    def items(s):
        for t in values:
            for x in t.reshape(-1).tolist():
                s.add(x)

    assert_same(*windows(stat, tensors, items))
    values[0][0] = 0.0  # now the extremes are real numbers
    assert_same(*windows(stat, tensors, items))


# The device path's buffer of pending elements (TensorWindow::kMaxPending).
PENDING = 65536


@pytest.mark.parametrize("nan_at", [None, "first", "big", "folded", "pending"])
def test_tensors_beyond_the_pending_buffer(nan_at):
    # A tensor too large for the buffer (summarised at its add), and more
    # small ones than it holds (folded when it fills), between 0-d ones.
    gen = torch.Generator().manual_seed(4)
    values = [torch.tensor(0.5), torch.randn(PENDING + 5, generator=gen)]
    values += [torch.randn(20000, generator=gen) for _ in range(4)]
    values.append(torch.tensor(-3.0))
    if nan_at == "first":
        values[0] = torch.tensor(float("nan"))  # poisons MAX and MIN
    elif nan_at == "big":
        values[1][0] = float("nan")
    elif nan_at == "folded":
        values[4][7] = float("nan")  # in the buffer when it fills
    elif nan_at == "pending":
        # first in the buffer read at the close, before its MAX and MIN
        values[5][:3] = torch.tensor([float("nan"), 100.0, -100.0])

    def tensors(s):
        for t in values:
            s.add(t)

    def items(s):
        for t in values:
            for x in t.reshape(-1).tolist():
                s.add(x)

    assert_same(*windows(stat, tensors, items))


def test_more_summary_rows_than_kept():
    # Past 1024 summary rows the device path folds them into one.
    t = torch.randn(PENDING + 1, generator=torch.Generator().manual_seed(6))
    adds = 1030
    s = stat(f"tensor.rows.{next(_names)}")
    for _ in range(adds):
        s.add(t)
    (got,) = closed_windows(s)
    total = t.double().sum().item() * adds
    assert got[".count"] == t.numel() * adds
    assert got[".sum"] == pytest.approx(total, rel=1e-9, abs=1e-6)
    assert got[".max"] == t.max().item()
    assert got[".min"] == t.min().item()
    assert got[".value"] == t[-1].item()


def test_tensor_samples_count_and_close_with_their_window():
    with tm.testing.fake_clock(0) as clock:
        events = []
        handle = tm.register_event_handler(events.append)
        try:
            s = tm.Stat("tensor.windows", [tm.SUM, tm.COUNT, tm.VALUE], timedelta(milliseconds=100))
            s.add(torch.tensor([1.0, 2.0]))
            s.add(3.0)
            assert s.count == 3
            clock.set_ms(150)
            s.add(torch.tensor([10.0]))
            assert s.get() == {tm.SUM: 6.0, tm.COUNT: 3.0, tm.VALUE: 3.0}
            clock.set_ms(250)
            s.add(torch.zeros(0))  # no samples: nothing happens
            s.add(1.0)
        finally:
            tm.unregister_event_handler(handle)
        mine = [e.data for e in events if "tensor.windows.sum" in e.data]
        assert mine == [
            {"tensor.windows.sum": 6.0, "tensor.windows.count": 3.0, "tensor.windows.value": 3.0},
            {"tensor.windows.sum": 10.0, "tensor.windows.count": 1.0, "tensor.windows.value": 10.0},
        ]


def test_add_tensor_in_torchscript():
    @torch.jit.script
    def feed(s: torch.classes.torch_monitor.Stat, x: torch.Tensor):
        s.add_tensor(x)

    values = torch.tensor([4.0, -1.0, 2.5])

    def tensors(s):
        feed(s, values)

    def items(s):
        for x in values.tolist():
            s.add(x)

    assert_same(*windows(stat, tensors, items))




@pytest.mark.cuda
def test_cuda_tensors_never_synchronise_and_match_the_numbers():
    gen = torch.Generator().manual_seed(5)
    host = [torch.randn(int(n), generator=gen) for n in torch.randint(1, 6, (300,), generator=gen)]
    host.append(torch.tensor(float("nan")))
    host.append(torch.tensor(2.0))
    device = [t.cuda() for t in host]
    torch.cuda.synchronize()
    tensor_stat = stat(f"cuda.samples.{next(_names)}")
    item_stat = stat(f"cuda.items.{next(_names)}")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for t in device:
            tensor_stat.add(t)
            tensor_stat.add(t.half())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for t in host:
        for x in t.reshape(-1).tolist() + t.half().reshape(-1).tolist():
            item_stat.add(x)
    global _summed_on_device
    _summed_on_device = True
    assert_same(*closed_windows(tensor_stat, item_stat))


@pytest.mark.cuda
def test_cuda_int_tensors_in_an_intstat():
    values = torch.tensor([[3, -1], [4, 1]], device="cuda")

    def tensors(s):
        s.add(values)
        s.add(values.to(torch.uint8))

    def items(s):
        for x in values.reshape(-1).tolist() + values.to(torch.uint8).reshape(-1).tolist():
            s.add(int(x))

    assert_same(*windows(int_stat, tensors, items))
