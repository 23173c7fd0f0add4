"""Event: torch.monitor compatibility (monitor-core.md, "Event")."""

import datetime
import os
import pickle
import random
import time
import types

import numpy
import pytest
import torch

TIMESTAMPS = [
    datetime.datetime(2021, 3, 4, 5, 6, 7, 891011),
    datetime.datetime(1999, 12, 31, 23, 59, 59, 999999),
    datetime.datetime(2030, 7, 1, 0, 0, 0, 1),
]


def make_event(impl, name="ev", timestamp=TIMESTAMPS[0], **data):
    return impl.Event(name, timestamp, data)


@pytest.mark.parametrize("timestamp", TIMESTAMPS, ids=str)
def test_fields_round_trip(impl, timestamp):
    data = {"s": "text", "f": 2.5, "i": 7, "big": 2**63 - 1, "small": -(2**63), "inf": float("inf")}
    e = impl.Event("my.event", timestamp, data)
    assert e.name == "my.event"
    assert e.timestamp == timestamp  # naive local time, microsecond precision
    assert e.timestamp.tzinfo is None
    assert e.data == data
    assert {k: type(v) for k, v in e.data.items()} == {k: type(v) for k, v in data.items()}


def test_a_date_is_its_midnight(impl):
    e = impl.Event("day", datetime.date(2024, 1, 2), {})
    assert e.timestamp == datetime.datetime(2024, 1, 2)
    e.timestamp = datetime.date(2025, 3, 4)
    assert e.timestamp == datetime.datetime(2025, 3, 4)


def test_far_timestamps_round_trip_to_the_microsecond(impl):
    """Far from 1970 a float of seconds holds a microsecond only to within one
    (datetime.timestamp()); the instant must still come back exact. Noon-ish
    hours keep clear of daylight-saving gaps and folds."""
    rng = random.Random(0)
    stamps = [
        datetime.datetime(
            rng.choice([rng.randint(1678, 1840), rng.randint(2100, 2261)]), rng.randint(1, 12),
            rng.randint(1, 28), rng.randint(10, 20), rng.randint(0, 59), rng.randint(0, 59),
            rng.randint(0, 999_999),
        )
        for _ in range(2000)
    ]
    wrong = [t for t in stamps if impl.Event("far", t, {}).timestamp != t]
    assert wrong == []


def test_aware_timestamp_with_a_sub_second_offset(tm):
    """A UTC offset may hold microseconds; the instant is the wall time less it."""
    zone = datetime.timezone(datetime.timedelta(hours=1, microseconds=7))
    aware = datetime.datetime(2250, 1, 1, 0, 0, 0, 5, tzinfo=zone)
    assert tm.Event("off", aware, {}).timestamp == aware.astimezone().replace(tzinfo=None)


@pytest.fixture
def local_zone():
    """Sets the process's local time zone (TZ, then tzset) and restores it."""
    saved = os.environ.get("TZ")

    def use(zone):
        os.environ["TZ"] = zone
        time.tzset()

    yield use
    if saved is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = saved
    time.tzset()


@pytest.mark.parametrize(
    "zone, around, repeats",
    [
        ("Europe/Berlin", datetime.datetime(2026, 10, 25), True),  # back 1 h
        ("Europe/Berlin", datetime.datetime(2026, 3, 29), False),  # forward 1 h
        ("Australia/Lord_Howe", datetime.datetime(2026, 4, 5), True),  # back 30 min
        ("Pacific/Kwajalein", datetime.datetime(1969, 9, 30), True),  # back 23 h
    ],
    ids=str,
)
def test_read_back_in_a_repeated_hour(tm, local_zone, zone, around, repeats):
    """An instant in the hour a clock repeats reads back with fold=1, as
    datetime.fromtimestamp gives it, so .timestamp() is the instant, not an
    hour before it (torch.monitor reads fold=0 there)."""
    local_zone(zone)
    start = int(around.timestamp()) - 2 * 86400
    instants = range(start, start + 4 * 86400, 600)
    assert any(datetime.datetime.fromtimestamp(t).fold for t in instants) == repeats
    wrong = []
    for t in instants:
        want = datetime.datetime.fromtimestamp(t)
        got = tm.Event("dst", want, {}).timestamp
        if (got, got.fold, got.timestamp()) != (want, want.fold, t):
            wrong.append((t, got, got.fold, want.fold))
    assert wrong == []


def test_constructor_keywords(impl):
    e = impl.Event(name="kw", timestamp=TIMESTAMPS[0], data={"x": 1.0})
    assert (e.name, e.timestamp, e.data) == ("kw", TIMESTAMPS[0], {"x": 1.0})


def test_now_round_trips(impl):
    now = datetime.datetime.now()
    assert make_event(impl, timestamp=now).timestamp == now


def test_data_value_type_is_exported(impl):
    # torch.monitor: a pybind class; any typing-usable object will do.
    assert impl.data_value_t is not None


def test_data_is_a_copy(impl):
    source = {"a": 1.0}
    e = impl.Event("copy", TIMESTAMPS[0], source)
    source["b"] = 2.0  # the event does not alias the caller's dict
    got = e.data
    got["c"] = 3.0
    got["a"] = 100.0
    assert e.data == {"a": 1.0}
    assert e.data is not e.data


def test_bool_data(impl, reference):
    e = make_event(impl, yes=True, no=False)
    if reference:
        # FIX: torch.monitor turns bools into 1.0 / 0.0.
        assert e.data == {"yes": 1.0, "no": 0.0}
        assert type(e.data["yes"]) is float
    else:
        assert e.data == {"yes": True, "no": False}
        assert type(e.data["yes"]) is bool and type(e.data["no"]) is bool


def test_equality(impl, reference):
    a = make_event(impl, "eq", TIMESTAMPS[0], x=1.0, s="v")
    same = make_event(impl, "eq", TIMESTAMPS[0], x=1.0, s="v")
    assert a == a
    if reference:
        # FIX: torch.monitor has no __eq__: equal contents compare unequal.
        assert not (a == same)
        assert a != same
        return
    assert a == same and not (a != same)
    assert a != make_event(impl, "other", TIMESTAMPS[0], x=1.0, s="v")
    assert a != make_event(impl, "eq", TIMESTAMPS[1], x=1.0, s="v")
    assert a != make_event(impl, "eq", TIMESTAMPS[0], x=2.0, s="v")
    assert a != make_event(impl, "eq", TIMESTAMPS[0], x=1.0)


def test_an_event_holding_nan_equals_itself_and_its_copy(impl, reference):
    # A loss that went NaN: torch.monitor's identity equality holds for the
    # event itself; value equality must too, and for a copy (NaN != NaN).
    e = make_event(impl, "nan", TIMESTAMPS[0], loss=float("nan"), n=1)
    assert e == e
    if reference:
        return
    assert e == pickle.loads(pickle.dumps(e))
    assert e != make_event(impl, "nan", TIMESTAMPS[0], loss=1.0, n=1)
    assert make_event(impl, "nan", TIMESTAMPS[0], loss=1.0, n=1) != e


def test_repr(impl, reference):
    e = make_event(impl, "repr.name", TIMESTAMPS[0], some_key=1.5)
    text = repr(e)
    if reference:
        # FIX: torch.monitor has only the default object repr.
        assert text.startswith("<torch._C._monitor.Event object at 0x")
        return
    assert "object at 0x" not in text
    assert "repr.name" in text and "some_key" in text and "1.5" in text


def _other_offset(naive):
    """A UTC offset different from the local one at ``naive``."""
    local = naive.astimezone().utcoffset()
    return datetime.timezone(local + datetime.timedelta(hours=3))


def test_aware_datetime(impl, reference):
    naive = TIMESTAMPS[0]
    aware = naive.replace(tzinfo=_other_offset(naive))
    correct = aware.astimezone().replace(tzinfo=None)  # the same instant, naive local
    assert correct != naive
    got = make_event(impl, timestamp=aware).timestamp
    assert got.tzinfo is None
    if reference:
        # FIX: torch.monitor ignores tzinfo (wrong by the offset difference).
        assert got == naive
    else:
        assert got == correct


@pytest.mark.parametrize(
    "value",
    [None, [1.0], {"a": 1}, object(), torch.tensor(1.5), 2**63, -(2**63) - 1],
    ids=["None", "list", "dict", "object", "tensor", "2**63", "-2**63-1"],
)
def test_unsupported_data_value(impl, reference, value):
    overflow = isinstance(value, int)
    if reference:
        # torch.monitor: a pybind "incompatible constructor arguments" TypeError,
        # or a ValueError for an int outside int64.
        with pytest.raises(ValueError if overflow else TypeError):
            make_event(impl, the_bad_key=value)
        return
    with pytest.raises((TypeError, OverflowError), match="the_bad_key"):
        make_event(impl, the_bad_key=value)


def test_data_torch_monitor_also_takes(impl, reference):
    """bytes (UTF-8) values and keys, NumPy's bool and any mapping: pybind11
    converts them for torch.monitor."""
    data = types.MappingProxyType({"text": b"xy", b"key": 3, "flag": numpy.bool_(True)})
    e = impl.Event("taken", TIMESTAMPS[0], data)
    # FIX: torch.monitor turns NumPy's bool into 1.0, as it does bool.
    assert e.data == {"text": "xy", "key": 3, "flag": 1.0 if reference else True}
    assert type(e.data["flag"]) is (float if reference else bool)


def test_non_string_key(impl):
    with pytest.raises(TypeError):
        impl.Event("k", TIMESTAMPS[0], {1: 1.0})
