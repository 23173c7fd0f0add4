"""WaitCounter: torch.monitor's _WaitCounter API (compared with the wheel's),
and what ours adds: count, total, max and mean duration per window, as a
Stat event named after the key, in Python, TorchScript and pickled models.
"""

import copy
import datetime
import io
import pickle
import textwrap
import threading
import time
from typing import Dict

import pytest
import torch

from isolated import run_isolated


# ------------------------------------------------ torch.monitor's API, both


def test_guard_is_a_context_manager_of_the_tracker_type(impl):
    counter = impl._WaitCounter("test.compat")
    tracker = counter.guard()
    assert isinstance(tracker, impl._WaitCounterTracker)
    with tracker:
        pass
    with impl._WaitCounter(key="test.keyword").guard():
        pass


def test_tracker_is_not_constructible(impl):
    with pytest.raises(TypeError):
        impl._WaitCounterTracker()


def test_exit_without_enter_and_twice_is_harmless(impl):
    tracker = impl._WaitCounter("test.exit").guard()
    tracker.__exit__(None, None, None)
    tracker.__enter__()
    tracker.__exit__(None, None, None)
    tracker.__exit__()


def test_exceptions_of_the_timed_code_propagate(impl):
    with pytest.raises(KeyError):
        with impl._WaitCounter("test.raises").guard():
            raise KeyError("timed code failed")


def test_key_must_be_a_string(impl):
    with pytest.raises(TypeError):
        impl._WaitCounter(3)


# ------------------------------------------------------------- ours only


@pytest.fixture
def events(tm):
    received = []
    handle = tm.register_event_handler(received.append)
    yield received
    tm.unregister_event_handler(handle)


def counter_events(tm, events, key):
    return [
        e.data
        for e in events
        if e.name == tm.STAT_EVENT and all(k.startswith(key + ".") for k in e.data)
    ]


def test_private_names_are_aliases(tm):
    assert tm._WaitCounter is tm.WaitCounter
    assert tm._WaitCounterTracker is tm.WaitCounterTracker


def test_each_window_logs_count_total_max_and_mean_in_microseconds(tm, events):
    from torch_monitor.testing import fake_clock

    with fake_clock(0) as clock:
        counter = tm.WaitCounter("io.read", datetime.timedelta(seconds=1))
        assert counter.key == "io.read"
        assert counter.window_size == datetime.timedelta(seconds=1)
        with counter.guard():
            time.sleep(0.002)
        with counter.guard():
            pass
        assert counter_events(tm, events, "io.read") == []
        clock.advance_ms(1000)
        with counter.guard():  # its sample opens the next window
            pass
    [data] = counter_events(tm, events, "io.read")
    assert sorted(data) == ["io.read.count", "io.read.max", "io.read.mean", "io.read.sum"]
    assert data["io.read.count"] == 2
    assert 2000 <= data["io.read.max"] < 2_000_000  # microseconds
    assert data["io.read.sum"] >= data["io.read.max"]
    assert data["io.read.mean"] == pytest.approx(data["io.read.sum"] / 2)
    got = counter.get()
    assert got[tm.COUNT] == 2 and got[tm.MAX] == data["io.read.max"]


def test_a_unit_that_raises_is_recorded(tm, events):
    counter = tm.WaitCounter("failing", 60.0)
    with pytest.raises(ValueError):
        with counter.guard():
            raise ValueError("boom")
    tm._close_all_stats()  # logs the open window
    assert counter_events(tm, events, "failing")[0]["failing.count"] == 1


def test_counters_of_one_key_are_one_counter(tm, events):
    """torch.monitor's _WaitCounter(key) is a handle of the process's one
    counter of that key, and PyTorch's own code makes a handle per call
    (`with _WaitCounter(key).guard():`): every handle of a key feeds one
    window, which logs one event (each had its own and logged one per
    call). A key with another window is another counter."""
    for _ in range(50):
        with tm.WaitCounter("per.call").guard():
            pass
    kept = tm.WaitCounter("per.call")
    with kept.guard():
        pass
    other = tm.WaitCounter("per.call", 3600.0)
    with other.guard():
        pass
    assert counter_events(tm, events, "per.call") == []  # nothing closed yet
    tm._close_all_stats()
    counts = sorted(e["per.call.count"] for e in counter_events(tm, events, "per.call"))
    assert counts == [1, 51]


def test_entering_a_guard_twice_is_an_error(tm):
    tracker = tm.WaitCounter("twice").guard()
    with tracker:
        with pytest.raises(RuntimeError, match="already timing"):
            tracker.__enter__()
    with tracker:  # usable again once exited
        pass


def test_guard_enter_and_exit_check_their_arguments(tm, events):
    # guard(), __enter__ and __exit__ are hand-written (the hot path): they
    # take what the derived methods took, and `as` binds the tracker.
    counter = tm.WaitCounter("fast.arguments")
    with pytest.raises(TypeError, match="guard"):
        counter.guard(1)
    with pytest.raises(TypeError, match="guard"):
        counter.guard(key="x")
    tracker = counter.guard()
    with pytest.raises(TypeError, match="__enter__"):
        tracker.__enter__(1)
    with tracker as bound:
        assert bound is tracker
    with pytest.raises(TypeError, match="by position"):
        tracker.__exit__(exc_type=None)
    tracker.__enter__()
    tracker.__exit__(None, None, None, "extra")  # *exc_info: any number
    tm._close_all_stats()
    assert counter.get()[tm.Aggregation.COUNT] == 2


def test_guards_on_several_threads_are_all_counted(tm, events):
    counter = tm.WaitCounter("threads", 60.0)

    def work():
        for _ in range(500):
            with counter.guard():
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tm._close_all_stats()
    assert counter_events(tm, events, "threads")[0]["threads.count"] == 2000


@pytest.mark.parametrize(
    "args, kwargs, error",
    [
        (("k", 0.0), {}, ValueError),
        (("k", -1.0), {}, ValueError),
        (("k", "1s"), {}, TypeError),
        (("bad\0key",), {}, ValueError),
        (("k",), {"close_on_time": 1}, TypeError),
    ],
)
def test_bad_arguments_are_errors(tm, args, kwargs, error):
    with pytest.raises(error):
        tm.WaitCounter(*args, **kwargs)


def test_copies_keep_configuration_and_trackers_refuse(tm):
    counter = tm.WaitCounter("copied", 2.5, close_on_time=True)
    for other in (copy.copy(counter), copy.deepcopy(counter), pickle.loads(pickle.dumps(counter))):
        assert other is not counter and other != counter
        assert (other.key, other.window_size, other.close_on_time) == (
            "copied",
            datetime.timedelta(seconds=2.5),
            True,
        )
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(counter.guard())
    assert "copied" in repr(counter)


class Timed(torch.nn.Module):
    def __init__(self, counter):
        super().__init__()
        self.counter = counter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.counter.guard():
            y = x * 2
        return y


def test_torchscript_with_statement_feeds_the_same_counter(tm, events):
    from torch_monitor.testing import fake_clock

    with fake_clock(0) as clock:
        counter = tm.WaitCounter("scripted", 60.0)
        scripted = torch.jit.script(Timed(counter))
        for _ in range(3):
            assert torch.equal(scripted(torch.ones(2)), torch.full((2,), 2.0))
        with counter.guard():  # and once from Python
            pass
        assert scripted.counter == counter
        clock.advance_ms(60_000)
        scripted(torch.ones(2))  # closes the window
    assert counter_events(tm, events, "scripted")[0]["scripted.count"] == 4


def test_scripted_model_with_a_counter_saves_and_loads(tm):
    scripted = torch.jit.script(Timed(tm.WaitCounter("saved", 5.0)))
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    assert loaded.counter.key() == "saved"
    assert loaded.counter.window_size_ms() == 5000
    assert torch.equal(loaded(torch.ones(1)), torch.full((1,), 2.0))


def test_torchscript_constructs_a_counter_and_enters_its_guard(tm):
    @torch.jit.script
    def timed(key: str) -> Dict[str, float]:
        counter = torch.classes.torch_monitor.WaitCounter(key, 60.0)
        with counter.guard():
            pass
        return counter.get()

    assert timed("in.script") == {"count": 0.0, "sum": 0.0, "max": 0.0, "mean": 0.0}


def test_uninitialised_objects_are_refused():
    outcome = run_isolated(
        textwrap.dedent(
            """
            import torch_monitor as tm
            for cls in (tm.WaitCounter, tm.WaitCounterTracker):
                try:
                    cls.__new__(cls)
                except TypeError:
                    pass
                else:
                    raise AssertionError(f"{cls.__name__}.__new__ gave an object")
            print("ok")
            """
        )
    )
    assert outcome.stdout.strip() == "ok"


def test_guard_inside_compiled_code_is_a_clear_error(tm):
    # A compiled graph cannot time a region of itself; the derived fake says
    # so, naming the method, instead of timing nothing silently.
    counter = tm.WaitCounter("compiled", 60.0)

    @torch.compile(backend="eager", fullgraph=True)
    def step(x):
        with counter.guard():
            y = x + 1
        return y

    with pytest.raises(Exception, match=r"guard\(\) cannot be called inside code"):
        step(torch.ones(2))


def test_objects_made_inside_compiled_code_are_made(tm):
    # As torch.monitor's: Dynamo breaks the graph around the constructor
    # (it failed inside its own handling of the face's __new__ before).
    @torch.compile(backend="eager")
    def step(x):
        stat = tm.Stat("compiled.made", ["mean"], 60.0)
        stat.add(2.0)
        counter = tm.WaitCounter("compiled.made")
        return x + 1, stat, counter

    y, stat, counter = step(torch.ones(2))
    assert torch.equal(y, torch.full((2,), 2.0))
    assert stat.count == 1 and stat.name == "compiled.made"
    assert counter.key == "compiled.made"
