"""torch_monitor.watch(model, optimizer, ...): every statistic of every kind,
checked against values computed here with plain torch ops on copies of the
observed tensors (captured by hooks of the test's own), over windows of
steps; cadence, non-finite values, gradient accumulation, parameters without
gradients, tied parameters, windows closing across skipped steps; bad input;
sinks and histograms; no host read between window closes; torch.compile;
CUDA (marked, skipped without a GPU); 2 and 3 gloo ranks (in processes with
time limits). See docs/watch.md.
"""

import json
import math
import pathlib
import re
import sys
import typing
from collections import defaultdict
from typing import List, Tuple

import pytest
import torch

tm = pytest.importorskip("torch_monitor")
import torch_monitor.testing  # noqa: E402,F401  (tm.testing)
from torch_monitor import _internals  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import isolated  # noqa: E402
from isolated import run_isolated  # noqa: E402

KINDS = ("grad", "weight", "update", "output", "output_grad")
STATISTICS = ("rms", "mean", "min", "max", "abs_max", "norm", "norm_max", "nonfinite", "zero_frac")


# ------------------------------------------------------------ the oracle


class Oracle:
    """The observed tensors, captured by the test's own hooks, and the
    statistics a window of them must have, computed with torch ops in
    float64 (independent of the library)."""

    def __init__(self):
        self.seen = defaultdict(list)  # key -> [(step, float64 copy, ratio or None)]
        self.before_squares = defaultdict(float)  # step -> sum of ||W before||^2

    def add(self, key, step, tensor):
        self.seen[key].append((step, tensor.detach().double().flatten().clone(), None))

    def add_update(self, key, step, after, before):
        delta = (after.detach() - before).double().flatten()  # in the weight's dtype first
        finite = delta[torch.isfinite(delta)]
        b = before.double().norm().item()
        ratio = finite.norm().item() / b if math.isfinite(b) and b > 0 else None
        self.seen[key].append((step, delta.clone(), ratio))
        self.before_squares[step] += b * b  # for total.update's ratio

    def with_total(self):
        """The observations, with "total.grad" and "total.update": per step,
        every gradient (update) observed in it, as one observation (its
        norm: the total norm; an update's ratio: over the whole model)."""
        seen = dict(self.seen)
        for kind in ("grad", "update"):
            total = f"total.{kind}"
            if total in seen:  # given (each rank's, in watch_rank_worker.py)
                continue
            by_step = defaultdict(list)
            for key, items in self.seen.items():
                if key.endswith(f".{kind}"):
                    for step, t, _ in items:
                        by_step[step].append(t)
            if by_step:
                seen[total] = [(step, torch.cat(ts), self.total_ratio(kind, step, ts))
                               for step, ts in sorted(by_step.items())]
        return seen

    def total_ratio(self, kind, step, deltas):
        b = math.sqrt(self.before_squares[step])
        if kind != "update" or not (math.isfinite(b) and b > 0):
            return None
        return math.sqrt(sum(d[torch.isfinite(d)].square().sum().item() for d in deltas)) / b

    def window(self, lo, hi, every=1):
        """{data key: value} of the observations at steps in [lo, hi)."""
        out = {}
        for key, items in self.with_total().items():
            items = [i for i in items if lo <= i[0] < hi and i[0] % every == 0]
            if not items:
                continue
            x = torch.cat([t for _, t, _ in items])
            finite = torch.isfinite(x)
            f = x[finite]
            nan = float("nan")
            n = f.numel()
            out[f"{key}.rms"] = f.square().mean().sqrt().item() if n else nan
            out[f"{key}.mean"] = f.mean().item() if n else nan
            out[f"{key}.min"] = f.min().item() if n else nan
            out[f"{key}.max"] = f.max().item() if n else nan
            out[f"{key}.abs_max"] = f.abs().max().item() if n else nan
            norms = [t[torch.isfinite(t)].norm().item() for _, t, _ in items]
            out[f"{key}.norm"] = sum(norms) / len(items)
            out[f"{key}.norm_max"] = max(norms)
            out[f"{key}.nonfinite"] = int((~finite).sum().item())
            out[f"{key}.zero_frac"] = (x == 0).sum().item() / x.numel()
            if key.endswith(".update"):
                ratios = [r for _, _, r in items if r is not None]
                out[f"{key}.ratio"] = sum(ratios) / len(ratios) if ratios else nan
        return out

    def first_nonfinite(self, lo, hi):
        out = {}
        for key, items in self.with_total().items():
            for step, t, _ in items:
                if lo <= step < hi and not torch.isfinite(t).all():
                    out[key] = step
                    break
        return out


def assert_data(got, want, rel=1e-12):
    assert sorted(got) == sorted(want), (sorted(set(got) ^ set(want)))
    for key, value in want.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got[key]), key
        elif key.endswith(".nonfinite"):
            assert got[key] == value and isinstance(got[key], int), key
        else:
            assert got[key] == pytest.approx(value, rel=rel, abs=1e-12), key


class Events:
    """A registered handler keeping the watch's events; unregistered at the end."""

    def __init__(self):
        self.all = []
        self.handle = tm.register_event_handler(self.all.append)

    def named(self, name):
        return [e for e in self.all if e.name == name]

    @property
    def windows(self):
        return self.named(tm.WATCH_EVENT)

    @property
    def nonfinite(self):
        return self.named(tm.NONFINITE_EVENT)

    def close(self):
        tm.unregister_event_handler(self.handle)


@pytest.fixture
def events():
    e = Events()
    yield e
    e.close()


@pytest.fixture(params=["host", "device"])
def path(request):
    """CPU tensors scanned on the host, or through the path of accelerator
    tensors (rows computed with ATen ops, merged under the device gate)."""
    if request.param == "device":
        with tm.testing.cpu_tensors_take_device_path():
            yield request.param
    else:
        yield request.param


def tolerance(path):
    # The device path sums in another order (torch's reductions).
    return 1e-12 if path == "host" else 1e-9


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.act = torch.nn.Tanh()
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def capture(model, oracle, step_of, kinds):
    """The test's own hooks: outputs and their gradients, by module path."""
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue

        def hook(module, args, output, name=name):
            if not isinstance(output, torch.Tensor):
                return
            if "output" in kinds:
                oracle.add(f"{name}.output", step_of(), output)
            if "output_grad" in kinds and output.requires_grad:
                output.register_hook(lambda g: oracle.add(f"{name}.output_grad", step_of(), g))

        handles.append(module.register_forward_hook(hook))
    return handles


def train(model, optimizer, oracle, steps, kinds, set_step=True, data_seed=1, nan_at=None):
    """An ordinary training loop; the oracle sees what the watch should."""
    current = [0]
    handles = capture(model, oracle, lambda: current[0], kinds)
    gen = torch.Generator().manual_seed(data_seed)
    for step in range(steps):
        current[0] = step
        if set_step:
            tm.set_step(step)
        x = torch.randn(16, 4, generator=gen)
        if nan_at is not None and step == nan_at:
            x[0, 0] = float("nan")
        optimizer.zero_grad()
        model(x).square().mean().backward()
        before = {}
        for name, p in model.named_parameters():
            if p.grad is not None:
                if "grad" in kinds:
                    oracle.add(f"{name}.grad", step, p.grad)
                before[name] = p.detach().clone()
        optimizer.step()
        for name, p in model.named_parameters():
            if "weight" in kinds:
                oracle.add(f"{name}.weight", step, p)
            if "update" in kinds and name in before:
                oracle.add_update(f"{name}.update", step, p, before[name])
    for h in handles:
        h.remove()


# ------------------------------------------------------------ exact statistics


@pytest.mark.parametrize("every", [1, 3])
def test_every_statistic_of_every_kind_equals_torch_ops(path, events, every):
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    oracle = Oracle()
    w = tm.watch(model, optimizer, what=KINDS, window_steps=4, every=every)
    train(model, optimizer, oracle, steps=10, kinds=KINDS)
    w.remove()  # logs the open window [8, 12)
    got = events.windows
    assert [e.step for e in got] == [4, 8, 10]  # the last, closed early: one step after 9
    for e, (lo, hi) in zip(got, [(0, 4), (4, 8), (8, 12)]):
        assert_data(e.data, oracle.window(lo, hi, every), rel=tolerance(path))
    assert events.nonfinite == []
    # The keys: "<path>.<kind>" in slot order, kinds grouped.
    assert w.keys[:4] == ["fc1.weight.grad", "fc1.bias.grad", "fc2.weight.grad", "fc2.bias.grad"]
    assert w.keys[-3:] == ["fc1.output_grad", "act.output_grad", "fc2.output_grad"]


def test_steps_are_the_optimizers_when_the_program_sets_none(events):
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    oracle = Oracle()
    tm.set_step(None)
    w = tm.watch(model, optimizer, what=("grad", "update"), window_steps=3)
    train(model, optimizer, oracle, steps=7, kinds=("grad", "update"), set_step=False)
    w.remove()
    # Optimizer steps 0..6: windows close after steps 2 and 5 (at 3, 6).
    assert [e.step for e in events.windows] == [3, 6, 7]
    for e, (lo, hi) in zip(events.windows, [(0, 3), (3, 6), (6, 9)]):
        assert_data(e.data, oracle.window(lo, hi))


def test_gradient_accumulation(events):
    """With the optimizer: the accumulated gradient the step uses, once per
    step. Without: each backward's gradient."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with_opt = tm.watch(model, optimizer, what="grad", window_steps=100, include="fc2")
    model2 = MLP()
    without = tm.watch(model2, what="grad", window_steps=100, include="fc2")
    accumulated, each = Oracle(), Oracle()
    current = [0]
    hooks = [p.register_hook(lambda g, n=n: each.add(f"{n}.grad", current[0], g))
             for n, p in model2.named_parameters() if n.startswith("fc2")]
    for step in range(2):
        current[0] = step
        tm.set_step(step)
        optimizer.zero_grad()
        model2.zero_grad()
        for micro in range(3):
            x = torch.randn(8, 4)
            model(x).square().mean().backward()
            model2(x).square().mean().backward()
        for n, p in model.named_parameters():
            if n.startswith("fc2"):
                accumulated.add(f"{n}.grad", step, p.grad)
        optimizer.step()  # model2 has no optimizer: nothing steps it
    for h in hooks:
        h.remove()
    with_opt.remove()
    without.remove()
    first, second = events.windows
    assert_data(first.data, accumulated.window(0, 100))
    assert first.data["fc2.weight.grad.norm"] > 0
    assert_data(second.data, each.window(0, 100))
    # Six backwards per key in the second: norm is the mean of six norms.
    assert len(each.seen["fc2.weight.grad"]) == 6


@pytest.mark.parametrize("optimizer_kind", ["sgd", "lbfgs"])
def test_a_step_with_a_closure_observes_the_gradients_it_computed(path, events, optimizer_kind):
    """A closure (LBFGS, Lightning's automatic optimization) computes the
    gradients inside step(): the watch observes them as the step left them
    (LBFGS: its last call of the closure), from the first step on, and the
    update of every parameter the closure gave a gradient."""
    torch.manual_seed(0)
    model = MLP()
    if optimizer_kind == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    oracle = Oracle()
    w = tm.watch(model, optimizer, what=("grad", "update"), window_steps=1)
    gen = torch.Generator().manual_seed(1)
    for step in range(3):
        tm.set_step(step)
        x = torch.randn(16, 4, generator=gen)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}

        def closure():
            optimizer.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            return loss

        optimizer.step(closure)
        for n, p in model.named_parameters():
            oracle.add(f"{n}.grad", step, p.grad)  # what the last closure left
            oracle.add_update(f"{n}.update", step, p, before[n])
    w.remove()
    assert [e.step for e in events.windows] == [1, 2, 3]
    for e, step in zip(events.windows, range(3)):
        assert_data(e.data, oracle.window(step, step + 1), rel=tolerance(path))


@pytest.mark.parametrize("fused", [False, True])
def test_gradscaler_steps_observe_unscaled_gradients_and_skip_overflowed_steps(events, fused):
    """GradScaler's fused path hands the scale to the optimizer's kernel,
    which unscales the gradients in place, and calls step() on an overflow
    too, for the kernel to skip: the watch observes the unscaled gradients
    and neither observes nor counts the skipped step (as on the other path,
    where GradScaler does not call step() then)."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    oracle = Oracle()
    tm.set_step(None)
    w = tm.watch(model, optimizer, what="grad", window_steps=100, on_nonfinite="raise")
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        x = torch.randn(16, 4, generator=gen)
        optimizer.zero_grad()
        loss = model(x).square().mean()
        if step == 2:
            loss = loss * float("inf")  # an overflow: this step is skipped
        scaler.scale(loss).backward()
        if step != 2:
            for n, p in model.named_parameters():
                # The true gradient, of the unscaled loss.
                oracle.add(f"{n}.grad", step, p.grad / scaler.get_scale())
        scaler.step(optimizer)
        scaler.update()
    w.remove()  # no NonFinite raised: the overflowed step was not observed
    (e,) = events.windows
    assert e.step == 3  # three optimizer steps counted, not four
    assert_data(e.data, oracle.window(0, 100), rel=1e-6)


def test_a_histogram_of_no_finite_value_is_left_out_and_training_goes_on(tmp_path, events):
    """add_histogram refuses a tensor with no finite value (as SummaryWriter
    does); a watch leaves that histogram out, its non-finite counts say
    why, and the training step goes on (it raised from the forward)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = tm.TensorBoardWriter(str(tmp_path))
    w = tm.watch(model, optimizer, what=("grad", "output"), window_steps=2,
                 histograms_every=1, writer=writer, on_nonfinite="log")
    for step in range(3):
        tm.set_step(step)
        x = torch.randn(8, 4)
        if step == 1:
            x[:] = float("nan")
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    w.remove()
    writer.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0})
    acc.Reload()
    assert [h.step for h in acc.Histograms("fc1.output")] == [0]  # every later one all NaN
    assert events.nonfinite and "fc1.output" in str(events.nonfinite[0].data)


def test_parameters_without_gradients(events):
    class Partly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Linear(3, 3)
            self.unused = torch.nn.Linear(3, 3)  # no gradient ever
            self.frozen = torch.nn.Linear(3, 3).requires_grad_(False)

        def forward(self, x):
            return self.used(self.frozen(x))

    model = Partly()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.1)
    w = tm.watch(model, optimizer, what=("grad", "weight", "update"), window_steps=10)
    assert not any(k.startswith("frozen.") for k in w.keys)  # nothing to observe
    tm.set_step(0)
    oracle = Oracle()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randn(4, 3)).sum().backward()
    for n, p in model.named_parameters():
        if p.grad is not None:
            oracle.add(f"{n}.grad", 0, p.grad)
    optimizer.step()
    for n, p in model.named_parameters():
        if p.requires_grad:
            oracle.add(f"{n}.weight", 0, p)
            if p.grad is not None:
                oracle.add_update(f"{n}.update", 0, p, before[n])
    w.remove()
    (e,) = events.windows
    assert_data(e.data, oracle.window(0, 10))
    assert "unused.weight.grad.rms" not in e.data and "unused.weight.update.rms" not in e.data
    assert "unused.weight.weight.rms" in e.data


class _Phase(torch.nn.Module):
    """A complex parameter, and a complex output."""

    def __init__(self):
        super().__init__()
        self.z = torch.nn.Parameter(torch.randn(4, dtype=torch.complex64))

    def forward(self, h):
        return h * self.z


class _SparseAndComplex(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4, sparse=True)  # sparse, uncoalesced gradients
        self.phase = _Phase()

    def forward(self, idx):
        return self.phase(self.emb(idx)).abs().square().sum()


def test_sparse_gradients_and_complex_tensors_are_observed_and_training_goes_on(path, events):
    # A sparse gradient: the statistics of its coalesced values (an index
    # given twice has one value, the sum). A complex tensor: of its
    # magnitudes; an update's ratio is of the complex norms.
    torch.manual_seed(0)
    model = _SparseAndComplex()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    oracle = Oracle()
    w = tm.watch(model, optimizer, what=KINDS, window_steps=10)
    seen_outputs = []
    hooks = [m.register_forward_hook(lambda m, a, out, name=name: seen_outputs.append((name, out)))
             for name, m in model.named_modules() if name]

    def magnitudes(t):
        t = t.detach()
        return t.abs() if t.is_complex() else t

    for step in range(3):
        tm.set_step(step)
        optimizer.zero_grad()
        seen_outputs.clear()
        grads_out = {}
        loss = model(torch.tensor([1, 2, 2, 7]))
        for name, out in seen_outputs:
            oracle.add(f"{name}.output", step, magnitudes(out))
            out.register_hook(lambda g, name=name: grads_out.__setitem__(name, g))
        loss.backward()
        for name in ("emb", "phase"):
            oracle.add(f"{name}.output_grad", step, magnitudes(grads_out[name]))
        assert model.emb.weight.grad.is_sparse and not model.emb.weight.grad.is_coalesced()
        oracle.add("emb.weight.grad", step, model.emb.weight.grad.coalesce().values())
        oracle.add("phase.z.grad", step, magnitudes(model.phase.z.grad))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        for n, p in model.named_parameters():
            oracle.add(f"{n}.weight", step, magnitudes(p))
            delta = p.detach() - before[n]
            ratio = delta.norm().item() / before[n].norm().item()
            oracle.seen[f"{n}.update"].append((step, magnitudes(delta).double().flatten(), ratio))
            oracle.before_squares[step] += before[n].norm().item() ** 2
    for h in hooks:
        h.remove()
    w.remove()
    (e,) = events.windows
    assert_data(e.data, oracle.window(0, 10), rel=1e-6)  # complex64 magnitudes, in float32 first


def test_tied_parameters_are_watched_once_under_their_first_name(events):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Linear(4, 4, bias=False)
            self.decoder = torch.nn.Linear(4, 4, bias=False)
            self.decoder.weight = self.encoder.weight

        def forward(self, x):
            return self.decoder(torch.relu(self.encoder(x)))

    model = Tied()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    w = tm.watch(model, optimizer, what=("grad", "update"), window_steps=10)
    assert w.keys == ["encoder.weight.grad", "total.grad", "encoder.weight.update", "total.update"]
    oracle = Oracle()
    tm.set_step(0)
    model(torch.randn(5, 4)).square().sum().backward()
    oracle.add("encoder.weight.grad", 0, model.encoder.weight.grad)  # both uses
    before = model.encoder.weight.detach().clone()
    optimizer.step()
    oracle.add_update("encoder.weight.update", 0, model.encoder.weight, before)
    w.remove()
    (e,) = events.windows
    assert_data(e.data, oracle.window(0, 10))


def test_windows_close_across_skipped_steps(path, events):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    w = tm.watch(model, what="output", window_steps=10)
    for step, value in [(3, 1.0), (9, 2.0), (27, 5.0), (31, 7.0)]:
        tm.set_step(step)  # 9 -> 27 skips the window [10, 20)
        with torch.no_grad():
            model[0].weight.zero_()
            model[0].bias.fill_(value)
        model(torch.zeros(1, 2))
    tm.set_step(40)  # closes [30, 40) at 40
    w.remove()
    got = [(e.step, e.data["0.output.mean"], e.data["0.output.norm"]) for e in events.windows]
    assert got == [
        (27, 1.5, pytest.approx(math.sqrt(2) * 1.5)),
        (31, 5.0, pytest.approx(math.sqrt(2) * 5.0)),
        (40, 7.0, pytest.approx(math.sqrt(2) * 7.0)),
    ]


def test_time_windows(events):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with tm.testing.fake_clock(0) as clock:
        w = tm.watch(model, what="output", window_size=0.1)
        tm.set_step(0)
        model(torch.ones(1, 2))
        clock.set_ms(50)
        tm.set_step(1)  # still in [0, 100 ms)
        model(torch.ones(1, 2))
        clock.set_ms(120)
        tm.set_step(2)  # closes it
        model(torch.ones(1, 2))
        w.remove()
    assert [e.step for e in events.windows] == [2, 3]  # remove(): one step after the last


def test_nonfinite_values_are_counted_and_named_with_their_first_step(path, events):
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    oracle = Oracle()
    w = tm.watch(model, optimizer, what=("grad", "output"), window_steps=4)
    # A NaN input at step 5: outputs and then gradients turn NaN, weights too.
    train(model, optimizer, oracle, steps=8, kinds=("grad", "output"), nan_at=5)
    w.remove()
    first, second = events.windows
    assert_data(first.data, oracle.window(0, 4), rel=tolerance(path))
    assert_data(second.data, oracle.window(4, 8), rel=tolerance(path))
    assert second.data["fc1.weight.grad.nonfinite"] > 0
    # Reported at the step change after step 5, not when the window closes
    # at 8, and once per window although steps 6 and 7 saw NaN too.
    (bad,) = events.nonfinite
    assert bad.step == 6
    assert bad.data == oracle.first_nonfinite(4, 8)
    assert bad.data["fc1.output"] == 5 and bad.data["fc2.output"] == 5


@pytest.mark.parametrize("first", [2**53 + 1, 2**62 + 1, 2**63 - 3])
def test_first_nonfinite_steps_are_exact_int64(path, events, first):
    """Steps beyond 2**53 (a nanosecond clock, say) have no double: the
    first non-finite step is kept as an int64, on both paths and in the
    model's total, so 2**62 + 1 is not reported as 2**62."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    w = tm.watch(model, optimizer, what=("grad", "output"), window_steps=1000)
    for step in (first - 1, first, first + 1):
        tm.set_step(step)
        x = torch.ones(4, 3)
        if step >= first:
            x[0, 0] = float("nan")  # NaN from `first` on
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    tm.set_step(first + 2)
    w.remove()
    (bad,) = events.nonfinite
    assert bad.step == first + 1
    # The bias's gradient (of a sum) stays finite.
    assert bad.data == {key: first for key in ("0.weight.grad", "total.grad", "0.output")}

def nan_training(model, optimizer, steps, nan_at, set_step=True):
    """Steps of training with a NaN input at step `nan_at`; returns the
    step whose set_step() (or optimizer step, without set_step) raised
    FloatingPointError and its message, or (None, None)."""
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        try:
            if set_step:
                tm.set_step(step)
            x = torch.randn(16, 4, generator=gen)
            if step == nan_at:
                x[0, 0] = float("nan")
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        except FloatingPointError as e:
            return step, str(e)
    return None, None


def test_nonfinite_raise_comes_from_the_next_set_step_naming_keys_and_step(path, events):
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tm.watch(model, optimizer, what="grad", window_steps=10, on_nonfinite="raise"):
        # Before the fix, NaN at step 13 surfaced only when the window
        # closed at 20; now set_step(14) raises.
        step, message = nan_training(model, optimizer, 20, nan_at=13)
        assert step == 14, message
        assert message.startswith("torch_monitor.watch: NaN or inf in 5 watched tensors: "), message
        assert "fc1.bias.grad (first at step 13)" in message and "total.grad (first at step 13)" in message
        # The event came first; the rest of the window raises no more,
        # although the weights are NaN now and so is every later gradient.
        (bad,) = events.nonfinite
        assert bad.step == 14 and set(bad.data.values()) == {13}
        for step in range(14, 21):
            if step > 14:
                tm.set_step(step)  # 20 closes the window: nothing unreported
            optimizer.zero_grad()
            model(torch.randn(16, 4)).square().mean().backward()
            optimizer.step()
        # The next window reports its own.
        with pytest.raises(FloatingPointError, match=r"first at step 20\)"):
            tm.set_step(21)
    tm.set_step(None)


def test_nonfinite_raise_without_set_step_comes_from_the_optimizer_step(events):
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tm.watch(model, optimizer, what="grad", window_steps=100, on_nonfinite="raise"):
        step, message = nan_training(model, optimizer, 10, nan_at=3, set_step=False)
    # The optimizer steps are the steps: the 4th optimizer step (index 3)
    # observed NaN gradients before it ran, and its post-hook counts step 4.
    assert step == 3 and "(first at step 3)" in message, message


def test_nonfinite_warn_and_callable(events):
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(RuntimeWarning, match=r"torch_monitor.watch: NaN or inf in .*first at step 2"):
        with tm.watch(model, optimizer, what="grad", window_steps=10, on_nonfinite="warn"):
            assert nan_training(model, optimizer, 4, nan_at=2) == (None, None)
    tm.set_step(None)
    model = MLP()  # the first one's weights are NaN now
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    with tm.watch(model, optimizer, what="grad", window_steps=10, on_nonfinite=seen.append):
        nan_training(model, optimizer, 4, nan_at=2)
    tm.set_step(None)
    assert [(e.name, e.step) for e in seen] == [(tm.NONFINITE_EVENT, 3)]
    assert set(seen[0].data) == {f"{p}.grad" for p, _ in model.named_parameters()} | {"total.grad"}

    def stop(event):
        raise KeyboardInterrupt(f"stop at {event.step}")

    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    with tm.watch(model, optimizer, what="grad", window_steps=10, on_nonfinite=stop):
        with pytest.raises(KeyboardInterrupt, match="stop at 3"):
            nan_training(model, optimizer, 4, nan_at=2)
    tm.set_step(None)


# ------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(what="gradient", window_steps=10), ValueError, "unknown kind 'gradient'"),
        (dict(what=("grad", "update"), window_steps=10), ValueError, '"update" is observed around optimizer steps: pass the optimizer'),
        (dict(what="weight", window_steps=10), ValueError, "pass the optimizer"),
        (dict(what="grad"), ValueError, "exactly one window.*neither"),
        (dict(what="grad", window_steps=10, window_size=5.0), ValueError, "exactly one window.*both"),
        (dict(what="grad", window_steps=0), ValueError, "window_steps must be an int >= 1"),
        (dict(what="grad", window_steps=10, include="conv"), ValueError, "include='conv' matches no parameter path"),
        (dict(what="grad", window_steps=10, exclude="^bn"), ValueError, "exclude='\\^bn' matches no"),
        (dict(what="grad", window_steps=10, include="("), ValueError, "not a valid regular expression"),
        (dict(what="output", window_steps=10, include="weight"), ValueError, "no submodule is selected"),
        (dict(what="grad", window_steps=10, every=0), ValueError, "every must be an int >= 1"),
        (dict(what="grad", window_steps=10, histograms_every=5), ValueError, "histograms_every needs writer="),
        (dict(what="grad", window_steps=10, sync_ranks=True), ValueError, "torch.distributed initialised"),
        (dict(what=(), window_steps=10), ValueError, "names no kind"),
        (dict(what=5, window_steps=10), TypeError, "what must be a kind"),
        (dict(what="grad", window_size="1s"), TypeError, "window_size must be a datetime.timedelta"),
        (dict(what="grad", window_size=0.0001), ValueError, "window_size must be at least 1 ms"),
        (dict(what="grad", window_size=1e16), ValueError, r"window_size must be at most 86399999999999 s \(datetime.timedelta.max"),
        (dict(what="grad", window_steps=10, include=3), TypeError, "include must be a regular expression"),
        (dict(what="grad", window_steps=10, histograms_every=2, writer=42), TypeError, "writer must be"),
        (dict(what="grad", window_steps=10, writer=42), ValueError, "writer= is where histograms go"),
        (dict(what="grad", window_steps=10, sync_ranks=1), TypeError, "sync_ranks must be a bool"),
        (dict(what="grad", window_steps=10, memory=1), TypeError, "memory must be a bool"),
        (dict(what="grad", window_steps=10, on_nonfinite="loud"), ValueError,
         "on_nonfinite must be \"log\", \"warn\" or \"raise\".*got 'loud'"),
        (dict(what="grad", window_steps=10, on_nonfinite=1), TypeError, "on_nonfinite must be None"),
        (dict(what="grad", window_size=1.0, close_on_time=1), TypeError, "close_on_time must be a bool"),
        (dict(what="grad", window_steps=10, close_on_time=True), ValueError, "close_on_time closes time windows"),
    ],
)
def test_bad_input_is_refused_at_watch_time(kwargs, error, message):
    with pytest.raises(error, match=message) as refused:
        tm.watch(MLP(), **kwargs)
    # One prefix, whichever side (Python or the C++ planning) refuses.
    assert str(refused.value).startswith("torch_monitor.watch: "), str(refused.value)


@pytest.mark.parametrize("model", [None, torch.randn(2), torch.jit.script(torch.nn.Linear(2, 2))])
def test_a_model_watch_cannot_take_is_refused_with_the_prefix(model):
    with pytest.raises((TypeError, ValueError)) as refused:
        tm.watch(model, what="output", window_steps=10)
    assert str(refused.value).startswith("torch_monitor.watch: "), str(refused.value)


def test_frozen_parameters_and_parameters_the_optimizer_skips_are_not_watched():
    # The keys come from C++ (watch/plan.h), as a C++ Watch's do.
    model = MLP()
    model.fc1.weight.requires_grad_(False)
    optimizer = torch.optim.SGD([model.fc2.weight], lr=0.1)
    w = tm.watch(model, optimizer, what=("update", "grad", "output"), window_steps=10)
    assert w.keys == [
        "fc1.bias.grad", "fc2.weight.grad", "fc2.bias.grad", "total.grad", "fc2.weight.update", "total.update",
        "fc1.output", "act.output", "fc2.output",
    ]
    w.remove()
    with pytest.raises(ValueError, match="no parameter is selected that requires grad"):
        tm.watch(model, what="grad", window_steps=10, include="fc1.weight")
    with pytest.raises(ValueError, match="no parameter is selected that the optimizer updates"):
        tm.watch(model, optimizer, what="weight", window_steps=10, include="fc1")
    with pytest.raises(TypeError, match="sequence of kinds"):
        tm.watch(model, what=("grad", 1), window_steps=10)
    # A lone layer has no submodule whose output could be watched.
    with pytest.raises(ValueError, match="the model has no submodule .*log it with a Stat"):
        tm.watch(torch.nn.Linear(2, 2), what="output", window_steps=10)


def test_a_watch_refuses_a_nul_in_a_path_and_a_key_given_twice():
    # Paths reach every sink as event keys (a NUL truncates in C APIs), and a
    # key given twice would have two observers write one row of statistics.
    # Checked in the recorder, so Python, TorchScript and C++ all refuse
    # (TorchScript's constructor checks its text arguments first).
    Watch = torch.classes.torch_monitor.Watch
    with pytest.raises(ValueError, match="Watch\\(\\) argument 'paths' contains a NUL byte at index 2"):
        Watch(["fc1", "fc\0x"], ["output", "output"], window_steps=10)
    with pytest.raises(ValueError, match="'fc1.output' is given twice \\(keys 0 and 2\\)"):
        Watch(["fc1", "fc2", "fc1"], ["output", "output", "output"], window_steps=10)
    with pytest.raises(ValueError, match="the path of key 0 is empty"):
        Watch([""], ["output"], window_steps=10)
    with pytest.raises(ValueError, match="meta device"):
        Watch(["fc1"], ["output"], window_steps=10, device="meta")

    def scripted(paths: List[str]) -> int:
        return torch.classes.torch_monitor.Watch(paths, ["grad", "grad"], window_steps=10).id()

    with pytest.raises(Exception, match="'a.grad' is given twice"):
        torch.jit.script(scripted)(["a", "a"])
    w = Watch(["fc1", "fc1"], ["output", "output_grad"], window_steps=10)  # one path, two keys
    assert w.keys() == ["fc1.output", "fc1.output_grad"]
    w.remove()


def test_the_choice_of_keys_is_the_same_call_in_eager_and_torchscript():
    def plan(what: List[str], parameters: List[str], trainable: List[bool], stepped: List[bool],
             modules: List[str]) -> Tuple[List[str], List[str], List[int]]:
        # Positional, as watch() calls it (torch 2.11 names no arguments of a static method).
        return torch.classes.torch_monitor.Watch.plan(what, parameters, trainable, stepped, modules, None, None)

    args = dict(what=["update", "grad", "output"], parameters=["a.w", "a.b", "c.w"],
                trainable=[True, False, True], stepped=[True, True, False], modules=["a", "c"])
    expected = (["a.w", "c.w", "total", "a.w", "total", "a", "c"],
                ["grad", "grad", "grad", "update", "update", "output", "output"], [0, 2, -1, 0, -1, 0, 1])
    assert tuple(plan(**args)) == tuple(torch.jit.script(plan)(**args)) == expected


def test_writer_must_be_a_tensorboard_writer(tmp_path):
    with pytest.raises(TypeError, match="TensorBoardWriter"):
        tm.watch(MLP(), what="grad", window_steps=10, histograms_every=2, writer=object())
    with pytest.raises(ValueError, match="give histograms_every"):
        tm.watch(MLP(), what="grad", window_steps=10, writer=tm.TensorBoardWriter(str(tmp_path)))


def test_remove_removes_every_hook_and_the_context_manager_does_too(events):
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tm.watch(model, optimizer, what=KINDS, window_steps=2) as w:
        assert model.fc1._forward_hooks and optimizer._optimizer_step_pre_hooks
        tm.set_step(0)
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    assert w.keys and "removed" in repr(w)
    assert not any(m._forward_hooks for m in model.modules())
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    n = len(events.all)
    assert n == 1  # the window, logged when leaving the block
    model2 = MLP()
    w2 = tm.watch(model2, what="grad", window_steps=2)
    assert all(p._backward_hooks for p in model2.parameters())
    w2.remove()
    w2.remove()  # idempotent
    assert not any(p._backward_hooks for p in model2.parameters())
    model(torch.randn(2, 4)).sum().backward()
    tm.set_step(10)
    assert len(events.all) == n


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_a_copy_of_a_watched_model_works_and_is_not_watched(events, how):
    """The EMA or teacher copy, a checkpoint: copying works, and nothing the
    copy computes reaches the original's windows (issue 25)."""
    import copy
    import io
    import pickle

    def run(model, steps=4):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(3)
        for step in range(steps):
            tm.set_step(step)
            optimizer.zero_grad()
            model(torch.randn(8, 4, generator=gen)).square().mean().backward()
            optimizer.step()

    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tm.watch(model, optimizer, what=KINDS, window_steps=2):
        if how == "deepcopy":
            twin = copy.deepcopy(model)
        elif how == "pickle":
            twin = pickle.loads(pickle.dumps(model))
        else:
            buffer = io.BytesIO()
            torch.save(model, buffer)
            buffer.seek(0)
            twin = torch.load(buffer, weights_only=False)
        for theirs, ours in zip(twin.parameters(), model.parameters()):
            torch.testing.assert_close(theirs, ours)
        run(twin)  # its own optimizer; the watch's hooks are not on it
    assert events.all == []  # nothing observed by the original: no window
    # The copy takes a watch of its own.
    with tm.watch(twin, what="output", window_steps=2) as w:
        run(twin, steps=2)
    assert len(events.windows) == 1 and set(w.keys) == {"fc1.output", "act.output", "fc2.output"}


class Sequence(torch.nn.Module):
    """Submodules returning tuples (nn.LSTM, nn.MultiheadAttention) and an
    integer tensor: the model of C++'s Watch.OutputsOfTuplesObserveTheirFirstTensor."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 4)
        self.attention = torch.nn.MultiheadAttention(4, 2)
        self.argmax = ArgMax()

    def forward(self, x):
        out, _ = self.lstm(x)
        attended, _ = self.attention(out, out, out)
        self.argmax(attended)
        return attended


class ArgMax(torch.nn.Module):
    def forward(self, x):
        return x.argmax(-1)


def test_outputs_of_tuples_observe_their_first_tensor(events):
    torch.manual_seed(0)
    model = Sequence()
    x = torch.randn(5, 2, 3)
    with torch.no_grad():
        out, _ = model.lstm(x)
        attended, _ = model.attention(out, out, out)
    with tm.watch(model, what="output", window_steps=1):
        tm.set_step(0)
        with torch.no_grad():
            model(x)
        tm.set_step(1)
    (window,) = events.windows
    assert window.data["lstm.output.max"] == pytest.approx(out.max().item(), rel=1e-12)
    assert window.data["attention.output.max"] == pytest.approx(attended.max().item(), rel=1e-12)
    assert not any(key.startswith("argmax.output") for key in window.data)


def test_a_watched_model_is_not_watched_again_until_its_watch_is_removed(events):
    model = MLP()
    first = tm.watch(model, what="output", window_steps=10)
    with pytest.raises(ValueError, match=r"already watched .*remove\(\) that watch first"):
        tm.watch(model, what="grad", window_steps=10)
    copy = __import__("copy").deepcopy(model)  # another model: watched on its own
    with tm.watch(copy, what="output", window_steps=10):
        pass
    first.remove()
    with tm.watch(model, what="output", window_steps=10):
        tm.set_step(0)
        model(torch.randn(2, 4))
    (e,) = events.windows
    assert e.data["fc1.output.norm"] > 0  # logged once, by the second watch


def test_a_compiled_model_is_watched_under_its_own_paths(events):
    torch.manual_seed(0)
    model = MLP()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with tm.watch(model, what="output", window_steps=10) as plain:
        keys = plain.keys
    with tm.watch(compiled, what="output", window_steps=10) as w:
        assert w.keys == keys and not any("_orig_mod" in k for k in w.keys)
        with pytest.raises(ValueError, match="already watched"):
            tm.watch(model, what="output", window_steps=10)  # the same model
        tm.set_step(0)
        x = torch.randn(2, 4)
        compiled(x)
    (e,) = events.windows
    assert e.data["fc1.output.norm"] == pytest.approx(model.fc1(x).norm().item(), rel=1e-6)


def test_parameters_the_watch_cannot_follow_are_named_in_one_warning(events):
    import warnings

    model = MLP()
    model.head = torch.nn.Linear(3, 3)  # a head trained later, as in fine-tuning
    optimizer = torch.optim.SGD([p for n, p in model.named_parameters() if not n.startswith("head")], lr=0.1)
    w = tm.watch(model, optimizer, what=("grad", "update"), window_steps=10)

    def step():
        optimizer.zero_grad()
        model.head(model(torch.randn(2, 4))).sum().backward()
        optimizer.step()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()
        optimizer.add_param_group({"params": list(model.head.parameters())})
        model.fc1.weight = torch.nn.Parameter(model.fc1.weight.detach().clone())
        for _ in range(3):
            step()
    w.remove()
    messages = [str(c.message) for c in caught if "torch_monitor.watch" in str(c.message)]
    assert len(messages) == 1 and "'head.weight', 'head.bias' joined the optimizer after watch()" in messages[0]
    # A replacement is checked at the first step and every 100th after it.
    model2 = MLP()
    optimizer2 = torch.optim.SGD(model2.parameters(), lr=0.1)
    w2 = tm.watch(model2, optimizer2, what="grad", window_steps=10)
    model2.fc2.bias = torch.nn.Parameter(torch.zeros(3))
    with pytest.warns(UserWarning, match="'fc2.bias' were replaced in the model after watch()"):
        model2(torch.randn(2, 4)).sum().backward()
        optimizer2.step()
    w2.remove()


def test_a_swapped_module_and_unfrozen_parameters_are_named_in_a_warning():
    """The periodic check looks parameters up through the model (a swapped
    module kept its old parameters, so nothing was said), and names the
    parameters frozen at watch() that became trainable (progressive
    unfreezing: they were left out of the statistics and total.grad)."""
    import warnings

    model = MLP()
    model.fc1.requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # holds every parameter
    w = tm.watch(model, optimizer, what="grad", window_steps=1000)
    assert not any(k.startswith("fc1.") for k in w.keys)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(102):  # checked at the first step and every 100th after it
            if step == 1:
                model.fc2 = torch.nn.Linear(8, 3)  # swapped
                model.fc1.requires_grad_(True)  # unfrozen
            optimizer.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
    w.remove()
    messages = sorted(str(c.message) for c in caught if "torch_monitor.watch" in str(c.message))
    assert len(messages) == 2, messages
    assert "'fc1.weight', 'fc1.bias' were frozen at watch() and are trainable now" in messages[0]
    assert "'fc2.weight', 'fc2.bias' were replaced in the model after watch()" in messages[1]


def test_include_and_exclude_patterns_with_flags_are_refused():
    """A compiled pattern is read by its text, so its flags were dropped
    without a word (re.I matched case-sensitively)."""
    import re

    with pytest.raises(ValueError, match=r"drops the pattern's flags \(re.IGNORECASE\)"):
        tm.watch(MLP(), include=re.compile("FC1", re.I), window_steps=1)
    w = tm.watch(MLP(), include=re.compile("fc1"), window_steps=1)  # no flag: taken
    assert w.keys == ["fc1.weight.grad", "fc1.bias.grad", "total.grad"]
    w.remove()


def test_a_model_on_the_meta_device_is_watched_once_materialised():
    with torch.device("meta"):
        model = MLP()
    with pytest.raises(ValueError, match=r"meta device .*call watch\(\) after materialising it"):
        tm.watch(model, what=("grad", "output"), window_steps=2)
    model.to_empty(device="cpu")
    for p in model.parameters():
        torch.nn.init.normal_(p)
    with tm.watch(model, what=("grad", "output"), window_steps=2) as w:
        model(torch.randn(2, 4)).sum().backward()
    assert "fc1.output" in w.keys


def test_the_total_gradient_norm_is_clip_grad_norms_and_a_spike_shows_in_norm_max(path, events):
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    w = tm.watch(model, optimizer, what="grad", window_steps=4)
    totals = []
    for step in range(4):
        tm.set_step(step)
        optimizer.zero_grad()
        scale = 1000.0 if step == 2 else 1.0  # one step's gradients 1000x
        (scale * model(torch.randn(8, 4)).square().mean()).backward()
        # torch's own total norm, as torchtitan and Lightning log it
        totals.append(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"), norm_type=2.0).item())
        optimizer.step()
    w.remove()
    (e,) = events.windows
    assert e.data["total.grad.norm"] == pytest.approx(sum(totals) / 4, rel=1e-6)  # float32 in torch
    assert e.data["total.grad.norm_max"] == pytest.approx(totals[2], rel=1e-6)
    assert e.data["total.grad.norm_max"] > 3 * e.data["total.grad.norm"]  # the mean hides the spike


def test_a_parameter_or_module_at_the_path_total_is_refused():
    class Named(torch.nn.Module):
        def __init__(self, holder):
            super().__init__()
            if holder == "parameter":
                self.total = torch.nn.Parameter(torch.zeros(2))
            else:
                self.total = torch.nn.Linear(2, 2)

    for holder in ("parameter", "submodule"):
        with pytest.raises(ValueError, match=f"has a {holder} at the path 'total'.*rename it"):
            tm.watch(Named(holder), what="grad", window_steps=2)


def test_a_model_compiled_before_watch_observes_outputs_after_a_reset(events):
    # The rule docs/watch.md states: a graph compiled before watch() does
    # not run its hooks; torch.compiler.reset() after watch() compiles again.
    model = MLP()
    compiled = torch.compile(model, backend="eager")
    compiled(torch.randn(2, 4))  # compiled before the watch
    with tm.watch(compiled, what="output", window_steps=100) as w:
        tm.set_step(0)
        compiled(torch.randn(2, 4))
        w.close()
        assert events.windows == []  # the old graph ran without the hooks
        torch.compiler.reset()
        tm.set_step(1)
        compiled(torch.randn(2, 4))
    assert [e.step for e in events.windows] == [2] and "fc1.output.norm" in events.windows[0].data


def test_include_and_exclude_are_read_as_cpp_reads_them():
    """One selection for both worlds (watch/plan.h): ECMAScript patterns."""
    model = MLP()
    w = tm.watch(model, what=("grad", "output"), window_steps=2, include=r"fc\d", exclude="bias$")
    assert w.keys == ["fc1.weight.grad", "fc2.weight.grad", "total.grad", "fc1.output", "fc2.output"]
    w.remove()
    with pytest.raises(ValueError, match="ECMAScript"):
        tm.watch(model, what="grad", window_steps=2, include="(?P<layer>fc1)")


def test_the_default_watches_gradients_only():
    """The default is what is cheap enough to leave on (docs/watch.md,
    "Cost"): gradients, as wandb.watch's default; updates are asked for."""
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tm.watch(model, optimizer, window_steps=2) as w:
        assert w.keys == ["fc1.weight.grad", "fc1.bias.grad", "fc2.weight.grad", "fc2.bias.grad", "total.grad"]


def test_scripting_a_watched_model_says_to_script_first():
    model = MLP()
    with tm.watch(model, what=("grad", "output"), window_steps=2):
        with pytest.raises(RuntimeError, match="script the model first, then watch the scripted module"):
            torch.jit.script(model)
    # Without outputs there is no forward hook to compile: the scripted
    # module shares the parameters, and is watched through them.
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    handle = tm.register_event_handler(lambda e: seen.append(e))
    try:
        with tm.watch(model, optimizer, what=("grad", "update"), window_steps=2) as w:
            scripted = torch.jit.script(model)
            norms = []
            for step in range(2):
                tm.set_step(step)
                optimizer.zero_grad()
                scripted(torch.randn(5, 4)).sum().backward()
                norms.append(model.fc1.weight.grad.norm().item())
                optimizer.step()
    finally:
        tm.unregister_event_handler(handle)
    windows = [e for e in seen if e.name == "torch_monitor.Watch"]
    assert len(windows) == 1
    assert windows[0].data["fc1.weight.grad.norm_max"] == pytest.approx(max(norms), rel=1e-5)
    assert windows[0].data["fc1.weight.update.norm_max"] > 0
    scripted = torch.jit.script(MLP())
    optimizer = torch.optim.SGD(scripted.parameters(), lr=0.1)
    with tm.watch(scripted, optimizer, what=("grad", "update"), window_steps=2) as w:
        assert "fc1.weight.update" in w.keys
    with pytest.raises(ValueError, match="ScriptModule"):
        tm.watch(scripted, what="output", window_steps=2)


def test_the_last_window_reaches_python_handlers_and_sinks_at_exit(tmp_path):
    # The exit sequence (C++, with the Stats' last windows) closes the open
    # window of a watch the program never removed, before Python handlers
    # go; with -W error a warning could not stop it half-way.
    out = run_isolated(
        f"""
        import torch, torch_monitor as tm
        model = torch.nn.Linear(3, 2)
        w = tm.watch(model, what="grad", window_steps=100)
        tm.register_event_handler(lambda e: print("handler", e.name, e.step, sorted(e.data)[:1]))
        tm.JsonLinesWriter({str(tmp_path / "w.jsonl")!r}).register()
        for step in range(3):
            tm.set_step(step)
            model(torch.ones(1, 3)).sum().backward()
        """,
        env={"PYTHONWARNINGS": "error"},
    )
    assert out.returncode == 0, out.describe()
    assert "handler torch_monitor.Watch 3 ['bias.grad.abs_max']" in out.stdout, out.describe()
    lines = (tmp_path / "w.jsonl").read_text().splitlines()
    assert len(lines) == 1 and '"torch_monitor.Watch"' in lines[0]


# ------------------------------------------------------------ sinks, histograms, memory


def test_sinks_take_watch_events_as_they_take_stat_events(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tb = tm.TensorBoardWriter(str(tmp_path / "tb"))
    jl = tm.JsonLinesWriter(str(tmp_path / "events.jsonl"))
    prom = tm.PrometheusTextFile(str(tmp_path / "watch.prom"))
    handles = [tm.register_event_handler(s) for s in (tb, jl, prom)]
    try:
        w = tm.watch(model, optimizer, what=("grad", "update"), window_steps=5,
                     histograms_every=5, writer=tb)
        train(model, optimizer, Oracle(), steps=11, kinds=())
        w.remove()
    finally:
        for h in handles:
            tm.unregister_event_handler(h)
    tb.close()
    jl.close()
    acc = EventAccumulator(tb.run_dir, size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    # range(11): the last window, closed at remove(), lands on 11, not on 10 again
    assert [s.step for s in acc.Scalars("fc1.weight.grad.rms")] == [5, 10, 11]
    assert [s.step for s in acc.Scalars("fc2.bias.update.ratio")] == [5, 10, 11]
    # A histogram per watched tensor every 5 steps.
    assert [h.step for h in acc.Histograms("fc1.weight.grad")] == [0, 5, 10]
    assert [h.step for h in acc.Histograms("fc1.weight.update")] == [0, 5, 10]
    hist = acc.Histograms("fc2.weight.grad")[0].histogram_value
    assert hist.num == model.fc2.weight.numel()
    lines = [json.loads(l) for l in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [l["name"] for l in lines] == [tm.WATCH_EVENT] * 3
    assert lines[0]["step"] == 5 and isinstance(lines[0]["data"]["fc1.weight.grad.nonfinite"], int)
    text = (tmp_path / "watch.prom").read_text()
    for statistic in STATISTICS:
        assert f'torch_monitor_fc1_weight_grad{{aggregation="{statistic}"}}' in text, statistic
    assert 'torch_monitor_fc1_weight_update{aggregation="ratio"}' in text
    assert "torch_monitor.Watch 'fc1.weight.grad': last closed window" in text


def test_memory_counters_are_absent_without_cuda(events):
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine has them (test_cuda_memory_counters)")
    model = MLP()
    w = tm.watch(model, what="output", window_steps=10, memory=True)
    tm.set_step(0)
    model(torch.ones(1, 4))
    w.remove()
    (e,) = events.windows
    assert not any(k.startswith("cuda.memory") for k in e.data)


# ------------------------------------------------------------ no host read


HOST_READS = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal")


def test_observations_read_nothing_on_the_host_between_window_closes(events):
    """On the device path (forced for CPU tensors) an observation only
    queues ATen ops; the profiler, which records ops called from inside
    our kernels too, sees no op that reads a tensor's value on the host."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tm.testing.cpu_tensors_take_device_path():
        w = tm.watch(model, optimizer, what=KINDS, window_steps=100, every=2)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            train(model, optimizer, Oracle(), steps=6, kinds=())
        names = {e.name for e in prof.events()}
        assert "torch_monitor::watch_observe_" in names
        assert "aten::where" in names  # the device path ran (gated rows)
        assert not names & set(HOST_READS), names & set(HOST_READS)
        w.remove()
    assert len(events.windows) == 1


def test_device_work_per_step_does_not_grow_with_the_parameters():
    """The optimizer's observations (grads, updates, weights) are batched:
    one set of ops per call whatever the number of parameters (issue 26:
    each was ~45 launches per tensor before)."""
    kinds = ("grad", "weight", "update")
    few, many = (tm.testing.watch_device_work(layers, kinds) for layers in (4, 128))  # 8 and 256 parameters
    assert few == many, (few, many)
    assert few < 250, few


def test_memory_per_watched_tensor_is_fixed():
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    w = tm.watch(model, optimizer, what=KINDS, window_steps=1000)
    slots = w._slots
    train(model, optimizer, Oracle(), steps=3, kinds=())
    size = slots.numel()
    train(model, optimizer, Oracle(), steps=30, kinds=())
    # (The weights' copies for "update" are the C++ StepObserver's: one per
    # key, made at its first step, as for a C++ Watch.)
    assert w._slots is slots and slots.numel() == size
    assert slots.shape == (len(w.keys), 15)
    w.remove()


# ------------------------------------------------------------ torch.compile


def compiled_run(backend=None, steps=20, every=3):
    """The windows of a watched training run: eager, or its forward compiled
    with `backend`."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    got = Events()
    try:
        w = tm.watch(model, optimizer, what=KINDS, window_steps=5, every=every)
        fullgraph = not _internals.dynamo_reorders_hook_inputs()
        run = torch.compile(model, fullgraph=fullgraph, backend=backend) if backend else model
        gen = torch.Generator().manual_seed(1)
        for step in range(steps):
            tm.set_step(step)
            optimizer.zero_grad()
            run(torch.randn(16, 4, generator=gen)).square().mean().backward()
            optimizer.step()
        w.remove()
    finally:
        got.close()
    return got.windows


def assert_same_windows(compiled, eager):
    assert [e.step for e in compiled] == [e.step for e in eager] == [5, 10, 15, 20]
    for c, e in zip(compiled, eager):
        assert sorted(c.data) == sorted(e.data)
        for key in e.data:
            assert c.data[key] == pytest.approx(e.data[key], rel=1e-5, abs=1e-6), key


REORDERING_DYNAMO = pytest.mark.skipif(
    _internals.dynamo_reorders_hook_inputs(),
    reason=f"torch {torch.__version__}'s Dynamo mis-orders hooks that share a tensor: "
    "the gradient hooks break the graph there (test_where_dynamo_misorders_hooks...)",
)


@REORDERING_DYNAMO
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_forward_has_no_graph_break_no_recompile_and_eager_statistics(backend):
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager = compiled_run()
    with torch._dynamo.config.patch(error_on_recompile=True):
        windows = compiled_run(backend)  # every=3 skips two steps in three
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["graph_break"]
    assert_same_windows(windows, eager)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_where_dynamo_misorders_hooks_the_gradient_hooks_break_the_graph_and_statistics_stay(
    backend, monkeypatch
):
    """torch 2.11's Dynamo moves a hook's captured tensors below the first
    hook that uses them (_internals.dynamo_reorders_hook_inputs): there
    each output_grad hook is registered outside the graph. Forced here on
    any torch; on 2.11 this is what runs."""
    import torch._dynamo

    monkeypatch.setattr(_internals, "dynamo_reorders_hook_inputs", lambda: True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager = compiled_run()
    windows = compiled_run(backend)
    assert torch._dynamo.utils.counters["graph_break"]
    assert_same_windows(windows, eager)


def test_the_op_passes_opcheck(path):
    """torch.library.opcheck: the schema declares what the op mutates (the
    slots, not the gate or the values), the Meta kernel serves as its fake,
    and AOT dispatch (functionalised, the slots a mutated input) gives what
    eager gives."""
    model = MLP()
    w = tm.watch(model, what="output", window_steps=100)
    try:
        for values, keys in [([torch.randn(5, 3)], [0]), ([torch.randn(4), torch.randn(2, 2)], [1, 2])]:
            torch.library.opcheck(
                torch.ops.torch_monitor.watch_observe_.default,
                (w._slots, w._gate, values, keys, [], w._id),
            )
    finally:
        w.remove()


@REORDERING_DYNAMO
def test_compiled_graph_holds_the_op_once_per_observation():
    import torch._dynamo

    torch._dynamo.reset()
    model = MLP()
    w = tm.watch(model, what=("output", "output_grad"), window_steps=5)
    explanation = torch._dynamo.explain(lambda x: model(x))(torch.randn(2, 4))
    w.remove()
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1
    calls = [n for g in explanation.graphs for n in g.graph.nodes
             if n.op == "call_function" and "watch_observe_" in str(n.target)]
    assert len(calls) == 3  # one per module output


# ------------------------------------------------------------ CUDA


@pytest.mark.cuda
def test_cuda_observations_never_synchronise_and_equal_the_cpu(events):
    torch.manual_seed(0)
    model = MLP().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    w = tm.watch(model, optimizer, what=KINDS, window_steps=4, every=2, memory=True)
    oracle = Oracle()
    handles = capture(model, oracle, lambda: 0, ())
    gen = torch.Generator(device="cuda").manual_seed(1)
    for step in range(8):
        tm.set_step(step)  # closes a window at 4: one host read, outside the checked region
        torch.cuda.set_sync_debug_mode("error")
        try:
            x = torch.randn(16, 4, generator=gen, device="cuda")
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    w.remove()
    for h in handles:
        h.remove()
    # The second window, closed by remove() before step 8 ended it, lands one
    # step after the last step set (docs/training_loop.md).
    assert [e.step for e in events.windows] == [4, 8]
    assert all(e.data["cuda.memory.allocated"] > 0 for e in events.windows)
    assert {"cuda.memory.reserved", "cuda.memory.peak_allocated", "cuda.memory.alloc_retries",
            "cuda.memory.ooms"} <= set(events.windows[0].data)


@pytest.mark.cuda
def test_cuda_nonfinite_is_reported_between_steps_without_synchronising(events):
    torch.manual_seed(0)
    model = MLP().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tm.watch(model, optimizer, what="grad", window_steps=100):
        for step in range(8):
            torch.cuda.set_sync_debug_mode("error")  # set_step included
            try:
                tm.set_step(step)
                x = torch.randn(16, 4, device="cuda")
                if step == 5:
                    x[0, 0] = float("nan")
                optimizer.zero_grad()
                model(x).square().mean().backward()
                optimizer.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            if step >= 5:
                torch.cuda.synchronize()  # the device caught up: the copy arrives
        # set_step(6) queued the copy of the counts (and found it arrived, or
        # set_step(7) did): not the window's close at 100.
        (bad,) = events.nonfinite
        assert bad.step in (6, 7) and set(bad.data.values()) == {5}, (bad.step, bad.data)
    tm.set_step(None)


@pytest.mark.cuda
def test_cuda_statistics_equal_the_oracle(events):
    torch.manual_seed(0)
    model = MLP().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    oracle = Oracle()
    w = tm.watch(model, optimizer, what=KINDS, window_steps=4, every=3)
    current = [0]
    handles = capture(model, oracle, lambda: current[0], KINDS)
    for step in range(8):
        current[0] = step
        tm.set_step(step)
        x = torch.randn(16, 4, device="cuda")
        optimizer.zero_grad()
        model(x).square().mean().backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        for n, p in model.named_parameters():
            oracle.add(f"{n}.grad", step, p.grad)
        optimizer.step()
        for n, p in model.named_parameters():
            oracle.add(f"{n}.weight", step, p)
            oracle.add_update(f"{n}.update", step, p, before[n])
    for h in handles:
        h.remove()
    w.remove()
    for e, (lo, hi) in zip(events.windows, [(0, 4), (4, 8)]):
        assert_data(e.data, oracle.window(lo, hi, 3), rel=1e-9)


@pytest.mark.cuda
def test_cuda_reduce_overhead_keeps_working(events):
    torch.manual_seed(0)
    model = MLP().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    w = tm.watch(model, optimizer, what=("grad", "output"), window_steps=5, every=2)
    run = torch.compile(model, mode="reduce-overhead")
    for step in range(12):
        tm.set_step(step)
        optimizer.zero_grad()
        run(torch.randn(16, 4, device="cuda")).square().mean().backward()
        optimizer.step()
    w.remove()
    # The third window (steps 10 and 11), closed by remove(), lands on 12.
    assert [e.step for e in events.windows] == [5, 10, 12]
    assert all(e.data["fc2.output.norm"] > 0 for e in events.windows)


# ------------------------------------------------------------ ranks

WORKER = pathlib.Path(__file__).parent / "watch_rank_worker.py"


def run_ranks(tmp_path, world, env=None, timeout=120):
    """Every rank of a watch_rank_worker.py run; results by rank. Never hangs."""
    init = f"file://{tmp_path / 'store'}"
    isolated.run_ranks(
        [[sys.executable, "-P", str(WORKER), str(r), str(world), init, str(tmp_path)] for r in range(world)],
        timeout,
        env,
    )
    return {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)}


def merged_oracle(results, ranks, window):
    """The statistics of all `ranks`' observations in `window`, from each
    rank's own captured sufficient statistics (torch ops in the worker)."""
    oracle = Oracle()
    for r in ranks:
        for key, items in results[r]["observed"][str(window)].items():
            for values, ratio in items:
                oracle.seen[key].append((0, torch.tensor(values, dtype=torch.float64), ratio))
    return oracle.window(0, 1)


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_merge_exactly(tmp_path, world):
    results = run_ranks(tmp_path, world)
    events = results[0]["events"]
    assert [e["step"] for e in events] == [4, 8, 12]  # in step order
    for w, e in enumerate(events):
        data = dict(e["data"])
        assert data.pop("watch.ranks") == world
        assert_data(data, merged_oracle(results, range(world), w), rel=1e-9)
    for r in range(1, world):
        assert results[r]["events"] == []  # merged events go to rank 0 only


def test_a_stalled_rank_gives_partial_merges_without_blocking(tmp_path):
    results = run_ranks(tmp_path, 3, env={"DEADLINE": "1", "STALL": "2.5"})
    events = results[0]["events"]
    assert [e["step"] for e in events] == [4, 8, 12]
    for w, e in enumerate(events):
        data = dict(e["data"])
        assert data.pop("watch.ranks") == 2  # rank 2 missed every deadline
        assert_data(data, merged_oracle(results, [0, 1], w), rel=1e-9)
    assert results[0]["seconds"] < 10


def test_a_rank_watching_other_keys_is_refused_and_logs_its_own_windows(tmp_path):
    # Rank 1 watches fc1 only: rank 0 must not merge its rows into its own
    # layout; it refuses them and says so, and rank 1 logs them itself.
    results = run_ranks(tmp_path, 2, env={"DEADLINE": "1", "OTHER_KEYS": "1"})
    for rank in (0, 1):
        events = results[rank]["events"]
        assert [e["step"] for e in events] == [4, 8, 12], (rank, events)
        for w, e in enumerate(events):
            data = dict(e["data"])
            assert data.pop("watch.ranks") == 1, (rank, w)  # its own window alone
            want = merged_oracle(results, [rank], w)
            if rank == 1:  # what its hooks saw, less what it does not watch
                want = {k: v for k, v in want.items() if not k.startswith("fc2.")}
            assert_data(data, want, rel=1e-9)
    refused = [m for m in results[0]["warnings"] if "is not the same on every rank" in m]
    assert len(refused) == 1 and "rank 1" in refused[0], results[0]["warnings"]


@pytest.mark.parametrize(
    "rank1, steps1, shapes",
    [
        ({"RANK1_WINDOW": "6"}, [6, 12], ("window_steps=4", "window_steps=6")),
        ({"RANK1_EVERY": "2"}, [4, 8, 12], ("every=1", "every=2")),
    ],
    ids=["window_steps", "every"],
)
def test_ranks_whose_watches_differ_in_window_or_cadence_are_never_merged(tmp_path, rank1, steps1, shapes):
    # The same keys on both ranks, but rank 1's rows mean something else
    # (windows of 6 steps, or every other step): rank 0 must refuse them,
    # naming the watch and both shapes, and each rank logs its own windows.
    results = run_ranks(tmp_path, 2, env={"DEADLINE": "1", **rank1})
    for rank, steps in ((0, [4, 8, 12]), (1, steps1)):
        events = results[rank]["events"]
        assert [e["step"] for e in events] == steps, (rank, events)
        for w, e in enumerate(events):
            data = dict(e["data"])
            assert data.pop("watch.ranks") == 1, (rank, w)  # its own window alone
            assert_data(data, merged_oracle(results, [rank], w), rel=1e-9)
    refused = [m for m in results[0]["warnings"] if "is not the same on every rank" in m]
    assert len(refused) == 1, results[0]["warnings"]
    assert "torch_monitor.Watch#0" in refused[0] and "rank 1" in refused[0], refused[0]
    assert all(shape in refused[0] for shape in shapes), refused[0]


# ------------------------------------------------------------ import cost


def test_the_watch_module_imports_nothing_heavy():
    """`import torch_monitor` stays as cheap as it was: watch.py imports no
    PT2 or distributed machinery at import time (sync_ranks imports
    torch.distributed's helpers when asked for)."""
    import ast

    tree = ast.parse(pathlib.Path(tm.watch.__code__.co_filename).read_text())
    imported = set()
    for node in tree.body:  # module level only
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert not {m for m in imported if m.startswith(("torch._dynamo", "torch.export", "torch.distributed"))}
    out = run_isolated(
        """
        import sys, time, torch
        import torch_monitor
        before = set(sys.modules)
        start = time.perf_counter()
        import importlib; importlib.reload(sys.modules["torch_monitor.watch"])
        print(sorted(set(sys.modules) - before), time.perf_counter() - start)
        """
    )
    new_modules, seconds = out.stdout.rsplit(" ", 1)
    assert new_modules == "[]" and float(seconds) < 0.1, out.stdout


def test_the_kinds_type_is_the_kinds_the_core_takes():
    """tm.WatchKind (what mypy checks what= against) names exactly the kinds
    C++ takes, in its order (watch::kindName)."""
    kinds = typing.get_args(tm.WatchKind)
    with pytest.raises(ValueError) as refused:
        torch.classes.torch_monitor.Watch(["fc"], ["nope"], 1, 0.0, 1, 0, None, False, False, "cpu")
    named = re.findall(r'"(\w+)"', str(refused.value))
    assert named == list(kinds)
    for kind in kinds:
        torch.classes.torch_monitor.Watch(["fc"], [kind], 1, 0.0, 1, 0, None, False, False, "cpu").remove()


SHARDED_SCRIPT = """
import json, sys, time
import torch, torch.distributed as dist
import torch_monitor as tm
from torch.distributed.fsdp import fully_shard

rank, init, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3))  # 6 and 3 rows: uneven
for layer in model:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
memory = tm.MemoryHandler()
memory.register()
windows = lambda: [e.data for e in memory.events() if e.name == tm.WATCH_EVENT]
full = lambda tensors: {n: t.full_tensor().tolist() for n, t in tensors}

w = tm.watch(model, optimizer, what=("grad", "weight", "update"), window_steps=1, sync_ranks=True)
tm.set_step(0)
optimizer.zero_grad()
torch.manual_seed(1 + rank)
model(torch.randn(5, 4)).sum().backward()
before = full(model.named_parameters())
grads = full((n, p.grad) for n, p in model.named_parameters())
optimizer.step()
after = full(model.named_parameters())
tm.set_step(1)  # step 0's window closes; rank 0 logs the merge
deadline = time.monotonic() + 60
while rank == 0 and not windows() and time.monotonic() < deadline:
    time.sleep(0.01)
merged = windows()
w.remove()

# Without an optimizer each rank observes its own shards, as FSDP2 assigns
# the reduced gradients (no tensor hook sees them).
memory.clear()
w = tm.watch(model, window_steps=1)
tm.set_step(10)
optimizer.zero_grad()
model(torch.randn(5, 4)).sum().backward()
shards = {n: p.grad.to_local().tolist() for n, p in model.named_parameters()}
tm.set_step(11)
own = windows()
w.remove()
json.dump(dict(merged=merged, before=before, grads=grads, after=after, own=own, shards=shards), open(out, "w"))
dist.barrier()
dist.destroy_process_group()
"""

# What merges exactly across shards: sums add, extremes take extremes. A
# key's .norm (and .norm_max, .ratio) is each rank's own shard's, averaged.
SHARD_EXACT = ("rms", "mean", "min", "max", "abs_max", "nonfinite", "zero_frac")


def test_fsdp2_sharded_parameters_are_watched_by_their_shards(tmp_path):
    """FSDP2's parameters and gradients are DTensors: the watch observes each
    rank's local shard, so that the merged window of a key is the statistics
    of the whole tensor (the optimizer's step raised before)."""
    script = tmp_path / "sharded.py"
    script.write_text(SHARDED_SCRIPT)
    init = f"file://{tmp_path / 'store'}"
    isolated.run_ranks(
        [[sys.executable, "-P", str(script), str(r), init, str(tmp_path / f"rank{r}.json")] for r in (0, 1)],
        timeout=180,
    )
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    oracle = Oracle()
    rank0 = results[0]
    for name, grad in rank0["grads"].items():
        as_tensor = lambda values: torch.tensor(values, dtype=torch.float32)
        oracle.add(f"{name}.grad", 0, as_tensor(grad))
        oracle.add(f"{name}.weight", 0, as_tensor(rank0["after"][name]))
        oracle.add_update(f"{name}.update", 0, as_tensor(rank0["after"][name]), as_tensor(rank0["before"][name]))
    want = {k: v for k, v in oracle.window(0, 1).items() if k.rpartition(".")[2] in SHARD_EXACT}
    (merged,) = rank0["merged"]
    assert_data({k: merged[k] for k in want}, want, rel=1e-9)
    assert results[1]["merged"] == []  # rank 0 logs the merge
    for result in results:
        own = Oracle()
        for name, shard in result["shards"].items():
            own.add(f"{name}.grad", 10, torch.tensor(shard, dtype=torch.float32))
        (window,) = result["own"]
        assert_data(window, own.window(10, 11), rel=1e-9)
