"""torch_monitor's Python API beyond torch.monitor's: IntStat, argument
parsing and errors, copies, the fake clock, and events from TorchScript."""

import copy
import datetime
import math
import pickle

import pytest
import torch

tm = pytest.importorskip("torch_monitor")
from torch_monitor.testing import fake_clock  # noqa: E402


@pytest.fixture
def events():
    received = []
    handle = tm.register_event_handler(received.append)
    yield received
    tm.unregister_event_handler(handle)


def stat_events(events):
    return [e for e in events if e.name == tm.STAT_EVENT]


def test_int_stat_emits_ints_and_integer_mean(events):
    with fake_clock(0) as clock:
        stat = tm.IntStat("n", [tm.MEAN, tm.SUM, tm.COUNT, tm.MAX, tm.MIN, tm.VALUE], 0.1)
        for v in (1, 2, 4):
            stat.add(v)
        clock.set_ms(100)
        stat.add(10)
    (event,) = stat_events(events)
    assert event.data == {"n.mean": 2, "n.sum": 7, "n.count": 3, "n.max": 4, "n.min": 1, "n.value": 4}
    assert all(type(v) is int for v in event.data.values())
    assert stat.get()[tm.MEAN] == 2 and type(stat.get()[tm.MEAN]) is int
    assert stat.count == 1


def test_int_stat_rejects_floats_and_overflow():
    stat = tm.IntStat("n", [tm.SUM], 60)
    with pytest.raises(TypeError):
        stat.add(1.5)
    with pytest.raises(OverflowError):
        stat.add(2**63)
    assert stat.count == 0


def test_stat_add_rejects_non_numbers():
    stat = tm.Stat("x", [tm.SUM], 60)
    with pytest.raises(TypeError):
        stat.add("1.0")
    with pytest.raises(TypeError):
        stat.add(None)
    assert stat.count == 0


@pytest.mark.parametrize(
    "aggregations", [[tm.MEAN, tm.MAX], ["mean", "MAX"], [2, 5], (tm.MEAN, "max")]
)
def test_aggregations_as_members_names_or_ints(aggregations):
    stat = tm.Stat("x", aggregations, 60)
    assert stat.aggregations == [tm.MEAN, tm.MAX]


@pytest.mark.parametrize(
    "aggregations, error, words",
    [
        (["avg"], ValueError, ["avg", "mean", "count"]),
        ([0], ValueError, ["0", "1..6"]),
        ([7], ValueError, ["7", "1..6"]),
        ([None], TypeError, ["NoneType"]),
        ([True], TypeError, ["bool"]),
        ("mean", TypeError, ["sequence"]),
    ],
)
def test_invalid_aggregations_name_the_choices(aggregations, error, words):
    with pytest.raises(error) as info:
        tm.Stat("x", aggregations, 60)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    "window, expected_ms",
    [
        (datetime.timedelta(seconds=60), 60000),
        (datetime.timedelta(microseconds=1999), 1),  # truncated to ms
        (datetime.timedelta(days=1, milliseconds=5), 86400005),
        (0.25, 250),
        (2, 2000),
        # A float of seconds misses these by a hair (1.001 * 1000 is
        # 1000.9999999999999); read to the microsecond first, they stay whole.
        (datetime.timedelta(milliseconds=1001), 1001),
        (1.001, 1001),
        (datetime.timedelta(seconds=3, milliseconds=9), 3009),
    ],
)
def test_window_size_forms(window, expected_ms):
    stat = tm.Stat("x", [tm.SUM], window)
    assert stat.window_size == datetime.timedelta(milliseconds=expected_ms)
    counter = tm.WaitCounter("x", window_size=window)
    assert counter.window_size_ms() == expected_ms


@pytest.mark.parametrize("ms", [1001, 4432109905917567, 2**52 + 3, 86399999999999999])
def test_a_window_survives_every_copy(ms):
    # A saved state holds the window in seconds, a float: near and above
    # 2**52 ms the nearest float read back a millisecond off, one more per
    # copy.
    for make in (lambda w: tm.Stat("x", [tm.SUM], w), lambda w: tm.WaitCounter("x", window_size=w)):
        original = make(datetime.timedelta(milliseconds=ms))
        copied = pickle.loads(pickle.dumps(copy.deepcopy(pickle.loads(pickle.dumps(original)))))
        assert copied.window_size_ms() == original.window_size_ms()


@pytest.mark.parametrize(
    "window, error",
    [
        (datetime.timedelta(microseconds=999), ValueError),
        (0.0005, ValueError),
        (-1.0, ValueError),
        (datetime.timedelta(seconds=-1), ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("60", TypeError),
        (None, ValueError),  # neither window_size nor window_steps
    ],
)
def test_invalid_windows_are_errors(window, error):
    with pytest.raises(error, match="window_size"):
        tm.Stat("x", [tm.SUM], window)


@pytest.mark.parametrize("max_samples", [0, -5])
def test_invalid_max_samples(max_samples):
    with pytest.raises(ValueError, match="max_samples"):
        tm.Stat("x", [tm.SUM], 60, max_samples)


@pytest.mark.parametrize("make_copy", [copy.copy, copy.deepcopy, lambda s: pickle.loads(pickle.dumps(s))])
def test_copies_keep_configuration_not_window(make_copy):
    stat = tm.Stat("loss", [tm.MEAN, tm.MAX], datetime.timedelta(seconds=30), 7)
    stat.add(1.0)
    twin = make_copy(stat)
    assert type(twin) is tm.Stat and twin is not stat
    assert (twin.name, twin.aggregations, twin.window_size, twin.max_samples) == (
        "loss", [tm.MEAN, tm.MAX], datetime.timedelta(seconds=30), 7)
    assert twin.count == 0 and stat.count == 1
    twin.add(2.0)
    assert stat.count == 1


def test_module_with_stat_deep_copies():
    module = torch.nn.Linear(2, 2)
    module.stat = tm.Stat("w", [tm.SUM], 60)
    clone = copy.deepcopy(module)
    assert clone.stat is not module.stat and clone.stat.name == "w"


def test_fake_clock_drives_windows(events):
    with fake_clock(1_000) as clock:
        stat = tm.Stat("x", [tm.SUM], 0.1)  # windows [1000, 1100), [1100, 1200) ...
        stat.add(1.0)
        clock.set_ms(1099)
        stat.add(2.0)
        assert stat_events(events) == []
        clock.set_ms(1100)
        stat.add(4.0)
        assert [e.data for e in stat_events(events)] == [{"x.sum": 3.0}]
        clock.advance_ms(1000)  # skipped windows emit nothing
        stat.add(8.0)
        assert [e.data for e in stat_events(events)] == [{"x.sum": 3.0}, {"x.sum": 4.0}]


def test_handler_exception_propagates_from_add_and_sample_counts(events):
    def broken(event):
        raise KeyError("boom")

    handle = tm.register_event_handler(broken)
    try:
        with fake_clock(0) as clock:
            stat = tm.Stat("x", [tm.COUNT], 0.1)
            stat.add(1.0)
            clock.set_ms(100)
            with pytest.raises(KeyError, match="boom"):
                stat.add(1.0)
            assert stat.count == 1  # the sample went in anyway
    finally:
        tm.unregister_event_handler(handle)
    assert len(stat_events(events)) == 1  # the later handler still ran


def test_register_rejects_non_callables():
    with pytest.raises(TypeError, match="callable"):
        tm.register_event_handler(42)


def test_log_event_checks_its_argument(events):
    now = datetime.datetime.now()
    with pytest.raises(TypeError, match="log_event expects a torch_monitor.Event, got str"):
        tm.log_event("not an event")
    with pytest.raises(TypeError, match="exactly one argument"):
        tm.log_event()
    with pytest.raises(TypeError, match="exactly one argument"):
        tm.log_event(tm.Event("a", now, {}), tm.Event("b", now, {}))
    with pytest.raises(TypeError, match="exactly one argument"):
        tm.log_event(evnt=tm.Event("a", now, {}))
    with pytest.raises(TypeError):  # Event.__new__ alone runs __init__, which refuses
        tm.log_event(tm.Event.__new__(tm.Event))
    assert events == []


def test_log_event_without_handlers_still_checks_its_argument():
    # The no-handler shortcut comes after the type check.
    with pytest.raises(TypeError, match="log_event expects a torch_monitor.Event, got int"):
        tm.log_event(1)
    with pytest.raises(TypeError):  # Event.__new__ alone runs __init__, which refuses
        tm.log_event(tm.Event.__new__(tm.Event))
    tm.log_event(tm.Event("nobody listens", datetime.datetime.now(), {}))


def test_log_event_keyword_and_subclass(events):
    class Tagged(tm.Event):
        pass

    now = datetime.datetime.now()
    tm.log_event(event=tm.Event("by keyword", now, {"k": 1}))
    tagged = Tagged("subclass", now, {})
    tm.log_event(tagged)
    assert [e.name for e in events] == ["by keyword", "subclass"]
    assert events[1] is tagged, "handlers get the caller's own object"


def test_event_handler_handle_cannot_be_constructed():
    with pytest.raises(TypeError):
        tm.EventHandlerHandle()


def test_event_timestamp_keeps_microseconds_and_converts_aware_times():
    naive = datetime.datetime(2024, 3, 1, 12, 30, 15, 123456)
    assert tm.Event("e", naive, {}).timestamp == naive
    aware = datetime.datetime(2024, 3, 1, 12, 30, 15, 654321, tzinfo=datetime.timezone.utc)
    event = tm.Event("e", aware, {})
    assert event.timestamp.tzinfo is None
    assert event.timestamp == datetime.datetime.fromtimestamp(aware.timestamp())
    assert event.timestamp.microsecond == 654321


def test_event_data_types_and_errors():
    now = datetime.datetime.now()
    data = tm.Event("e", now, {"s": "x", "f": 1.5, "i": 2**62, "b": False}).data
    assert data == {"s": "x", "f": 1.5, "i": 2**62, "b": False}
    assert [type(data[k]) for k in "sfib"] == [str, float, int, bool]
    for bad in (None, [1], torch.ones(1), {"a": 1}):
        with pytest.raises(TypeError, match="'k'"):
            tm.Event("e", now, {"k": bad})
    with pytest.raises(OverflowError, match="'big'"):
        tm.Event("e", now, {"big": 2**63})
    with pytest.raises(TypeError, match="keys must be str"):
        tm.Event("e", now, {1: 1})
    with pytest.raises(TypeError, match="datetime"):
        tm.Event("e", 12.0, {})


def test_event_setters_and_unhashable():
    event = tm.Event("e", datetime.datetime(2024, 1, 1), {"a": 1})
    event.name = "f"
    event.data = {"b": 2.0}
    event.timestamp = datetime.datetime(2025, 1, 1)
    assert (event.name, event.data, event.timestamp) == ("f", {"b": 2.0}, datetime.datetime(2025, 1, 1))
    with pytest.raises(TypeError):
        hash(event)


class _LogsFromScript(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        event = torch.classes.torch_monitor.Event("scripted")
        event.set_float("f", 0.5)
        event.set_int("i", 3)
        event.set_bool("b", True)
        event.set_str("s", "text")
        torch.ops.torch_monitor.log_event(event)
        return x


def test_scripted_event_reaches_python_handler(events):
    before = datetime.datetime.now() - datetime.timedelta(seconds=1)
    torch.jit.script(_LogsFromScript())(torch.zeros(1))
    (event,) = [e for e in events if e.name == "scripted"]
    assert event.data == {"f": 0.5, "i": 3, "b": True, "s": "text"}
    assert type(event.data["b"]) is bool
    assert before <= event.timestamp <= datetime.datetime.now()


def test_scripted_stat_constructor_errors():
    Stat = torch.classes.torch_monitor.Stat
    with pytest.raises(Exception, match="valid aggregations"):
        Stat("x", ["avg"], 1.0)
    with pytest.raises(Exception, match="at least 1 millisecond"):
        Stat("x", ["mean"], 0.0001)
    with pytest.raises(Exception, match="max_samples"):
        Stat("x", ["mean"], 1.0, 0)
    stat = torch.classes.torch_monitor.IntStat("n", [3, 4], 2)
    assert stat.aggregations() == ["count", "sum"] and stat.window_size_ms() == 2000


def test_live_stat_names_lists_every_live_stat_of_every_world():
    """For exporters and debugging (monitor-core.md, "Helpers worth having"):
    the Stats alive now, made in Python or TorchScript, an IntStat, a
    WaitCounter's; gone once destroyed. The op is the same list."""
    scripted = torch.classes.torch_monitor.Stat("live.scripted", ["sum"], 60.0)
    made = [tm.Stat("live.b", [tm.SUM], 60), tm.IntStat("live.a", [tm.SUM], window_steps=2),
            tm.WaitCounter("live.counter", 60)]
    names = [n for n in tm.live_stat_names() if n.startswith("live.")]
    assert names == ["live.a", "live.b", "live.counter", "live.scripted"]
    assert torch.ops.torch_monitor.live_stat_names() == tm.live_stat_names()
    del made[0]
    del scripted
    assert [n for n in tm.live_stat_names() if n.startswith("live.")] == ["live.a", "live.counter"]


def test_live_stat_names_is_not_traceable_and_says_so():
    def reads(x):
        return x + len(torch.ops.torch_monitor.live_stat_names())

    with pytest.raises(Exception, match="live_stat_names"):
        torch.compile(reads, fullgraph=True, backend="aot_eager")(torch.ones(1))
