"""State dicts, default callables and finding monitors, against inferno.

* ``load_state_dict`` restores the history and keeps the receiver's settings
  (step_time, duration, parameters), as inferno-ai 0.0.5 does.
* ``filter_`` / ``map_`` read back as callables when not given (inferno's
  defaults are functions), behaving as the defaults do.
* ``torch_monitor.monitors_of`` lists the monitors of eager, scripted and
  loaded models without guessing attribute names.
"""

import io

import pytest
import torch
from torch import nn

inferno_observe = pytest.importorskip("inferno.observe")

from conftest import load_module  # noqa: E402

tm = load_module("torch_monitor")


def fed(reducer, n=5):
    for i in range(n):
        reducer(torch.full((2,), float(i)))
    return reducer


# -- load_state_dict ------------------------------------------------------------


@pytest.mark.parametrize("lib", ["ours", "inferno"])
def test_load_state_dict_keeps_the_receivers_settings(lib):
    mod = tm if lib == "ours" else inferno_observe
    saved = fed(mod.EMAReducer(1.0, 0.5, duration=3.0))
    receiver = mod.EMAReducer(2.0, 0.25, duration=6.0)  # same 3 rows
    receiver(torch.zeros(2))  # inferno loads only into a started history
    receiver.load_state_dict(saved.state_dict())
    assert (receiver.dt, receiver.duration, receiver.alpha) == (2.0, 6.0, 0.25)
    torch.testing.assert_close(receiver.dump(), saved.dump())
    receiver(torch.ones(2))  # folds with the receiver's alpha
    torch.testing.assert_close(receiver.peek(), 0.25 * 1 + 0.75 * saved.peek())


def test_load_state_dict_matches_inferno_numerically():
    ours = fed(tm.EMAReducer(1.0, 0.5, duration=3.0))
    theirs = fed(inferno_observe.EMAReducer(1.0, 0.5, duration=3.0))
    ours_receiver = tm.EMAReducer(2.0, 0.25, duration=6.0)
    theirs_receiver = inferno_observe.EMAReducer(2.0, 0.25, duration=6.0)
    theirs_receiver(torch.zeros(2))
    ours_receiver.load_state_dict(ours.state_dict())
    theirs_receiver.load_state_dict(theirs.state_dict())
    for r in (ours_receiver, theirs_receiver):
        r(torch.full((2,), 7.0))
    torch.testing.assert_close(ours_receiver.dump(), theirs_receiver.dump())
    torch.testing.assert_close(ours_receiver.view(1.0), theirs_receiver.view(1.0))


def test_load_state_dict_into_a_fresh_receiver_and_a_monitor():
    # inferno refuses a receiver that never ran (size mismatch); ours loads.
    saved = fed(tm.CAReducer(1.0, duration=4.0))
    receiver = tm.CAReducer(0.5, duration=2.0)  # 4 rows too
    receiver.load_state_dict(saved.state_dict())
    assert receiver.dt == 0.5
    torch.testing.assert_close(receiver.dump(), saved.dump())
    # Through a monitor's state dict (the reducer is its submodule).
    module = nn.Linear(2, 2)
    source = tm.DifferenceMonitor(fed(tm.EMAReducer(1.0, 0.5, duration=2.0)), "weight", module)
    target = tm.DifferenceMonitor(tm.EMAReducer(4.0, 0.9, duration=8.0), "weight")
    target.load_state_dict(source.state_dict())
    assert (target.reducer.dt, target.reducer.alpha) == (4.0, 0.9)
    torch.testing.assert_close(target.dump(), source.dump())


def test_load_state_dict_with_another_history_size_says_so():
    saved = fed(tm.EMAReducer(1.0, 0.5, duration=3.0))
    receiver = tm.EMAReducer(1.0, 0.5, duration=9.0)
    with pytest.raises(ValueError):
        receiver.load_state_dict(saved.state_dict())
    assert receiver.duration == 9.0 and receiver.peek() is None


# -- default filter_ / map_ -----------------------------------------------------


def test_default_filter_and_map_are_callables_like_inferno():
    ours = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "weight")
    theirs = inferno_observe.DifferenceMonitor(inferno_observe.PassthroughReducer(1.0), "weight")
    assert callable(ours.filter_) and callable(ours.map_)
    post, pre = torch.tensor([3.0, 5.0]), torch.tensor([1.0, 1.0])
    for args in ((post, pre), (None, None), (post, None)):
        assert ours.filter_(*args) == theirs.filter_(*args)
    for args in ((post, pre), ((post, post * 2), (pre, pre))):
        for a, b in zip(ours.map_(*args), theirs.map_(*args)):
            torch.testing.assert_close(a, b)
    # One None side: zeros (inferno 0.0.5 raises here, against its docs).
    torch.testing.assert_close(ours.map_(post, None)[0], post)


def test_default_map_uses_op_and_keeps_the_monitor_saveable():
    mul = torch.mul
    monitor = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "weight", op_=mul)
    torch.testing.assert_close(
        monitor.map_(torch.tensor([2.0]), torch.tensor([3.0]))[0], torch.tensor([6.0])
    )
    plain = tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "weight")
    # The defaults read back and passed on are the defaults again.
    again = tm.DifferenceMonitor(
        tm.PassthroughReducer(1.0), "weight", filter_=plain.filter_, map_=plain.map_
    )
    assert not again.core.has_custom_callables()
    given = lambda post, pre: (post,)  # noqa: E731
    assert tm.DifferenceMonitor(tm.PassthroughReducer(1.0), "w", map_=given).map_ is given


# -- monitors_of ----------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.state = torch.zeros(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state = self.state + x
        return x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.block(x))


def monitored_net():
    net = Net()
    monitors = [
        tm.DifferenceMonitor(tm.PassthroughReducer(1.0, 3.0), "state", net.block),
        tm.DifferenceMonitor(tm.PassthroughReducer(1.0, 3.0), "weight", net.fc),
    ]
    net(torch.ones(2))
    return net, monitors


def test_monitors_of_eager_scripted_and_loaded_models():
    net, monitors = monitored_net()
    eager = tm.monitors_of(net)
    assert sorted(eager) == sorted(
        [f"block.{monitors[0].key}", f"fc.{monitors[1].key}"]
    )
    scripted = torch.jit.script(net)
    scripted(torch.ones(2))
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    loaded(torch.ones(2))
    for model in (scripted, loaded):
        found = tm.monitors_of(model)
        assert sorted(found) == sorted(eager)
        state = found[f"block.{monitors[0].key}"].peek()
        torch.testing.assert_close(state, torch.ones(2))
    assert tm.monitors_of(nn.Linear(2, 2)) == {}
    with pytest.raises(TypeError, match="monitors_of takes"):
        tm.monitors_of("not a module")


def test_calling_forward_directly_skips_the_top_modules_monitors():
    # TorchScript runs a module's hooks only through module(inputs): called
    # as module.forward(inputs), the monitors on that module itself feed
    # nothing (cpp_hooks.md, top); submodules called inside forward() still
    # run theirs. Listing the monitors is how to notice.
    net = Net()
    top = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, 3.0), "block.state", net)
    inner = tm.DifferenceMonitor(tm.PassthroughReducer(1.0, 3.0), "weight", net.fc)
    net(torch.ones(2))
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(net), buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    found = tm.monitors_of(loaded)
    for monitor in found.values():
        monitor.clear()
    loaded.forward(torch.ones(2))
    assert found[top.key].peek() is None
    assert found[f"fc.{inner.key}"].peek() is not None
    loaded(torch.ones(2))
    torch.testing.assert_close(found[top.key].peek(), torch.ones(2))
