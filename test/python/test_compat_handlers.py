"""Event handlers: torch.monitor compatibility (monitor-core.md, "Handlers").

Only well-behaved handlers here; reentrant handlers, raising handlers and other fault
cases run in subprocesses in test_reentrancy_and_faults.py.
"""

import datetime
import threading

import pytest

TS = datetime.datetime(2022, 5, 6, 7, 8, 9, 101112)


def log(impl, name, **data):
    event = impl.Event(name, TS, data)
    assert impl.log_event(event) is None
    return event


def names(events):
    return [e.name for e in events]


def test_registration_order(impl, handlers):
    calls = []
    for tag in ["first", "second", "third"]:
        handlers.register(lambda e, tag=tag: calls.append((tag, e.name)))
    log(impl, "a")
    log(impl, "b")
    assert calls == [
        ("first", "a"), ("second", "a"), ("third", "a"),
        ("first", "b"), ("second", "b"), ("third", "b"),
    ]  # fmt: skip


def test_duplicate_registration_calls_twice(impl, handlers):
    seen = []
    h1 = handlers.register(seen.append)
    handlers.register(seen.append)
    log(impl, "dup")
    assert names(seen) == ["dup", "dup"]
    handlers.unregister(h1)
    seen.clear()
    log(impl, "once")
    assert names(seen) == ["once"]


def test_unregister_stops_delivery(impl, handlers):
    kept, dropped = [], []
    handlers.register(kept.append)
    h = handlers.register(dropped.append)
    log(impl, "before")
    handlers.unregister(h)
    log(impl, "after")
    assert names(kept) == ["before", "after"]
    assert names(dropped) == ["before"]


def test_registration_keywords(impl):
    """torch.monitor's argument names, for code that passes them by keyword."""
    seen = []
    h = impl.register_event_handler(callback=seen.append)
    try:
        log(impl, "kw")
    finally:
        impl.unregister_event_handler(handler=h)
    log(impl, "gone")
    assert names(seen) == ["kw"]


def test_no_handlers_is_a_noop(impl):
    log(impl, "nobody.listens", x=1.0)
    stat = impl.Stat("quiet", [impl.Aggregation.SUM], 60.0, 1)
    stat.add(1.0)  # closes a window with no handler registered
    assert stat.count == 0
    assert stat.get() == {impl.Aggregation.SUM: 1.0}


def test_python_event_reaches_python_handler_as_same_object(impl, recorder):
    event = log(impl, "same", x=1.0)
    assert len(recorder.events) == 1
    assert recorder.events[0] is event


def test_handle_type(impl, handlers):
    handle = handlers.register(lambda e: None)
    assert isinstance(handle, impl.EventHandlerHandle)
    with pytest.raises(TypeError):
        impl.EventHandlerHandle()


def test_callable_object_handler(impl, handlers):
    class Counter:
        def __init__(self):
            self.n = 0

        def __call__(self, event):
            self.n += 1

    counter = Counter()
    handlers.register(counter)
    log(impl, "c")
    log(impl, "c")
    assert counter.n == 2


def test_stat_event_reaches_handler(impl, recorder):
    stat = impl.Stat("h", [impl.Aggregation.SUM], 60.0)
    stat.add(2.0)
    del stat
    [event] = recorder.events
    assert isinstance(event, impl.Event)
    assert event.name == impl.STAT_EVENT == "torch.monitor.Stat"
    assert event.data == {"h.sum": 2.0}


def test_handler_runs_on_the_logging_thread(impl, handlers):
    threads = []
    handlers.register(lambda e: threads.append(threading.current_thread()))
    worker = threading.Thread(target=log, args=(impl, "threaded"))
    worker.start()
    worker.join(10)
    assert threads == [worker]


def test_log_event_rejects_non_events(impl, recorder):
    with pytest.raises(TypeError):
        impl.log_event("not an event")
    assert recorder.events == []


def test_tensorboard_event_handler(impl, reference, handlers):
    class FakeWriter:  # SummaryWriter.add_scalar's signature
        def __init__(self):
            self.scalars = []

        def add_scalar(self, tag, scalar_value, global_step=None, walltime=None, **kwargs):
            self.scalars.append((tag, scalar_value, global_step, walltime))

    writer = FakeWriter()
    handlers.register(impl.TensorboardEventHandler(writer))
    log(impl, "not.a.stat", x=1.0)  # only Stat events are written
    assert writer.scalars == []
    stat = impl.Stat("tb", [impl.Aggregation.SUM, impl.Aggregation.MAX], 60.0, 2)
    stat.add(1.0)
    stat.add(3.0)
    assert sorted((tag, value) for tag, value, _, _ in writer.scalars) == [("tb.max", 3.0), ("tb.sum", 4.0)]
    [walltime] = {w for _, _, _, w in writer.scalars}
    assert abs(walltime - datetime.datetime.now().timestamp()) < 60
    steps = [step for _, _, step, _ in writer.scalars]
    # FIX (sinks.md): torch.monitor passes no step; ours counts per tag from 0.
    assert steps == ([None, None] if reference else [0, 0])
