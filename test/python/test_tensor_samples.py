"""stat.add(tensor): every element is one sample, exactly as adding the
elements one by one as Python numbers (the oracle), for every aggregation,
dtype and layout; NaN and infinities follow the same rules as floats."""

from datetime import timedelta

import pytest
import torch

tm = pytest.importorskip("torch_monitor")
from windows import closed_windows  # noqa: E402

ALL = [tm.VALUE, tm.MEAN, tm.COUNT, tm.SUM, tm.MAX, tm.MIN]
_names = iter(range(10**6))


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
        else:
            assert got[key] == want[key], key


def stat(name):
    return tm.Stat(name, ALL, timedelta(hours=1))


def int_stat(name):
    return tm.IntStat(name, ALL, timedelta(hours=1))


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.float16, torch.bfloat16,
     torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool],
)
def test_every_element_is_one_sample_like_adding_numbers(dtype):
    gen = torch.Generator().manual_seed(1)
    values = [(torch.randn(3, 4, generator=gen) * 20).to(dtype) for _ in range(3)]
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


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_intstat_takes_integer_tensors(dtype):
    values = torch.tensor([[3, 1], [4, 1]]).to(dtype)

    def tensors(s):
        s.add(values)
        s.add(5)

    def items(s):
        for x in values.reshape(-1).tolist():
            s.add(int(x))
        s.add(5)

    assert_same(*windows(int_stat, tensors, items))


def test_intstat_refuses_floating_tensors_and_complex_is_refused():
    with pytest.raises(TypeError, match="IntStat.add takes integer tensors"):
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
