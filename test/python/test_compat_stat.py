"""Stat and Aggregation: torch.monitor compatibility (monitor-core.md, "Aggregation", "Stat").

torch.monitor has no injectable clock, so the windowed tests use real time: 100 ms
windows aligned on the monotonic clock (window id = floor(monotonic_ms / window_ms) + 1,
the same clock as C++ steady_clock), entered just after a boundary.  If the machine
stalls long enough for a batch of adds to cross a boundary, ``Windows.check`` notices
and the test is re-run (``@windowed``) instead of failing at random.

Tests that need no window change use a 60 s window and close it by destroying the stat.
The ``tm`` tests at the end use ``torch_monitor.testing.fake_clock()`` (torch_monitor only).
"""

import datetime
import functools
import gc
import math
import time

import pytest

AGGS = ["VALUE", "MEAN", "COUNT", "SUM", "MAX", "MIN"]
AGG_VALUES = {"VALUE": 1, "MEAN": 2, "COUNT": 3, "SUM": 4, "MAX": 5, "MIN": 6}
LONG = 60.0  # seconds: a window that never closes by time during a test
SAMPLES = [3.0, 1.0, 4.0, 1.0, 5.0]
NAN = float("nan")

WINDOW_MS = 100
MARGIN_MS = 20


# ---------------------------------------------------------------- helpers


def expected_values(samples, aggs, integer=False):
    """Aggregations over accepted, finite samples (monitor-core.md formulas)."""
    n, total = len(samples), sum(samples)
    if integer:
        mean = total // n if n else 0
    else:
        mean = total / n if n else 0.0
    values = {
        "VALUE": samples[-1],
        "MEAN": mean,
        "COUNT": n,
        "SUM": total,
        "MAX": max(samples),
        "MIN": min(samples),
    }
    cast = int if integer else float
    return {a: cast(values[a]) for a in aggs}


def zeros(aggs, integer=False):
    return {a: (0 if integer else 0.0) for a in aggs}


def visible(reference, aggs):
    """torch.monitor binds Python's Aggregation.VALUE to NONE: it never shows up (FIX)."""
    return [a for a in aggs if not (reference and a == "VALUE")]


def as_get(mod, values):
    """{"SUM": 1.0} -> {Aggregation.SUM: 1.0}, the shape of Stat.get()."""
    return {getattr(mod.Aggregation, a): v for a, v in values.items()}


def as_event(stat_name, values):
    """{"SUM": 1.0} -> {"<stat>.sum": 1.0}, the shape of a Stat event's data."""
    return {f"{stat_name}.{a.lower()}": v for a, v in values.items()}


def same(a, b):
    return (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) or a == b


def assert_values(actual, expected, value_type=float):
    """Equal dicts, NaN equal to NaN, every value of exactly ``value_type``."""
    assert set(actual) == set(expected), (actual, expected)
    for k, v in expected.items():
        assert type(actual[k]) is value_type, (k, actual[k])
        assert same(actual[k], v), (k, actual[k], v)


def make_stat(mod, name, aggs, window=LONG, *args, cls="Stat", **kwargs):
    return getattr(mod, cls)(name, [getattr(mod.Aggregation, a) for a in aggs], window, *args, **kwargs)


def destroy(stat_ref_holder):
    """Drop the last reference to a stat: CPython destroys it (and flushes) at once."""
    stat_ref_holder.clear()


class WindowRace(Exception):
    pass


class Windows:
    """Real-time window stepping on the monotonic clock."""

    def __init__(self, recorder, ms=WINDOW_MS):
        self.rec = recorder
        self.ms = ms
        self.seconds = ms / 1000.0
        self.expected = None

    def current(self):
        return math.floor(time.monotonic() * 1000.0 / self.ms) + 1

    def _sleep_until(self, target_ms):
        while True:
            left = target_ms - time.monotonic() * 1000.0
            if left <= 0:
                return
            time.sleep(left / 1000.0)

    def _start_ms(self, window_id):
        return (window_id - 1) * self.ms

    def start(self, offset_ms=MARGIN_MS):
        """Wait until ``offset_ms`` into a window; forget earlier events."""
        gc.collect()
        wid = self.current()
        if time.monotonic() * 1000.0 > self._start_ms(wid) + offset_ms - 2:
            wid += 1
        self._sleep_until(self._start_ms(wid) + offset_ms)
        self.expected = wid
        self.rec.clear()

    def check(self):
        """Everything so far happened inside the expected window."""
        if self.current() != self.expected:
            raise WindowRace(f"expected window {self.expected}, now {self.current()}")

    def next(self, n=1, offset_ms=MARGIN_MS):
        """Step ``n`` windows ahead (MARGIN_MS past the boundary)."""
        self.check()
        self.expected += n
        self._sleep_until(self._start_ms(self.expected) + offset_ms)


def windowed(test):
    """Re-run a test whose adds were caught by a window boundary (slow machine)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        for _ in range(3):
            try:
                return test(*args, **kwargs)
            except WindowRace:
                gc.collect()
        pytest.fail("a window boundary was crossed during the test three times")

    return wrapper


@pytest.fixture
def windows(recorder):
    return Windows(recorder)


# ---------------------------------------------------------------- Aggregation


@pytest.mark.parametrize("agg", AGGS)
def test_aggregation_members(impl, reference, agg):
    member = getattr(impl.Aggregation, agg)
    assert member.name == agg
    assert getattr(impl, agg) == member  # also exported at module level
    assert {member: 1}[getattr(impl, agg)] == 1  # usable as a dict key
    if reference and agg == "VALUE":
        # FIX: torch.monitor binds Python's VALUE to the C++ NONE (0).
        assert member.value == 0
    else:
        assert member.value == AGG_VALUES[agg]


def test_aggregation_members_are_distinct(impl):
    members = [getattr(impl.Aggregation, a) for a in AGGS]
    assert len(set(members)) == len(AGGS)


def test_invalid_aggregation(impl, reference):
    if reference:
        # torch.monitor accepts Aggregation(7) and fails in a std::bitset.
        with pytest.raises(IndexError, match="bitset"):
            impl.Stat("bad", [impl.Aggregation(7)], LONG)
        return
    with pytest.raises(ValueError) as info:
        impl.Stat("bad", [impl.Aggregation(7)], LONG)
    message = str(info.value).lower()
    for name in AGGS:
        assert name.lower() in message, f"valid choice {name} not named in: {message}"


# ---------------------------------------------------------------- Stat basics


@pytest.mark.parametrize(
    "window", [datetime.timedelta(milliseconds=200), 0.2, datetime.timedelta(seconds=60)], ids=str
)
def test_new_stat_state(impl, reference, window):
    stat = make_stat(impl, "fresh", AGGS, window)
    assert stat.name == "fresh"
    assert stat.count == 0
    assert_values(stat.get(), as_get(impl, zeros(visible(reference, AGGS))))


def test_constructor_keywords(impl, recorder):
    stat = impl.Stat(
        name="kw",
        aggregations=[impl.Aggregation.SUM],
        window_size=datetime.timedelta(seconds=60),
        max_samples=2,
    )
    stat.add(1.0)
    stat.add(v=2.0)  # torch.monitor's keyword; max_samples reached: closes at once
    assert recorder.stat_data("kw") == [{"kw.sum": 3.0}]


def test_duplicate_aggregations(impl, recorder):
    holder = [make_stat(impl, "dup", ["SUM", "MAX", "SUM", "MAX", "SUM"])]
    assert_values(holder[0].get(), as_get(impl, zeros(["SUM", "MAX"])))
    holder[0].add(1.0)
    holder[0].add(2.0)
    assert holder[0].count == 2  # count is per sample, not per aggregation
    destroy(holder)
    [data] = recorder.stat_data("dup")
    assert_values(data, as_event("dup", {"SUM": 3.0, "MAX": 2.0}))


def test_event_keys_and_float_values(impl, reference, recorder):
    holder = [make_stat(impl, "loss", AGGS)]
    for v in SAMPLES:
        holder[0].add(v)
    destroy(holder)
    events = [e for e in recorder.events if e.name == impl.STAT_EVENT]
    assert len(events) == 1
    assert impl.STAT_EVENT == "torch.monitor.Stat"
    assert isinstance(events[0], impl.Event)
    assert isinstance(events[0].timestamp, datetime.datetime)
    # Every value of a double stat is a float, COUNT too.
    assert_values(events[0].data, as_event("loss", expected_values(SAMPLES, visible(reference, AGGS))))


def test_int_samples_are_accepted(impl, recorder):
    holder = [make_stat(impl, "ints", ["SUM", "COUNT"])]
    holder[0].add(2)
    holder[0].add(3)
    destroy(holder)
    assert_values(recorder.stat_data("ints")[0], {"ints.sum": 5.0, "ints.count": 2.0})


def test_value_only_stat(impl, reference, recorder):
    """FIX: from Python, torch.monitor's VALUE produces nothing."""
    holder = [make_stat(impl, "val", ["VALUE"])]
    holder[0].add(7.0)
    holder[0].add(8.0)
    assert holder[0].count == 2
    if reference:
        assert holder[0].get() == {}
        destroy(holder)
        # It still logs a Stat event, with empty data.
        assert recorder.stat_data() == [{}]
    else:
        assert_values(holder[0].get(), as_get(impl, {"VALUE": 0.0}))
        destroy(holder)
        assert recorder.stat_data() == [{"val.value": 8.0}]


@pytest.mark.parametrize(
    "samples, values",
    [
        ([NAN, 1.0, 5.0], {"SUM": NAN, "MEAN": NAN, "MAX": NAN, "MIN": NAN, "COUNT": 3.0}),
        ([1.0, NAN, 5.0], {"SUM": NAN, "MEAN": NAN, "MAX": 5.0, "MIN": 1.0, "COUNT": 3.0}),
        ([1.0, 5.0, NAN], {"SUM": NAN, "MEAN": NAN, "MAX": 5.0, "MIN": 1.0, "COUNT": 3.0}),
    ],
    ids=["nan-first-poisons", "nan-middle-ignored", "nan-last-ignored"],
)
def test_nan_rules(impl, recorder, samples, values):
    holder = [make_stat(impl, "nan", list(values))]
    for v in samples:
        holder[0].add(v)
    destroy(holder)
    [data] = recorder.stat_data("nan")
    assert_values(data, as_event("nan", values))


def test_destruction_flushes_open_window(impl, recorder):
    holder = [make_stat(impl, "flush", ["SUM", "COUNT"])]
    holder[0].add(1.5)
    holder[0].add(2.5)
    assert recorder.stat_data("flush") == []  # 60 s window: nothing closed yet
    before = datetime.datetime.now()
    destroy(holder)
    gc.collect()
    after = datetime.datetime.now()
    events = [e for e in recorder.events if e.name == impl.STAT_EVENT]
    assert [e.data for e in events] == [{"flush.sum": 4.0, "flush.count": 2.0}]
    slack = datetime.timedelta(milliseconds=1)
    assert before - slack <= events[0].timestamp <= after + slack


def test_destruction_of_empty_stat_emits_nothing(impl, recorder):
    holder = [make_stat(impl, "empty", ["SUM"])]
    destroy(holder)
    closed = [make_stat(impl, "closed", ["SUM"], LONG, 1)]
    closed[0].add(1.0)  # max_samples=1: closed at once, nothing left open
    destroy(closed)
    assert recorder.stat_data("empty") == []
    assert recorder.stat_data("closed") == [{"closed.sum": 1.0}]


@pytest.mark.parametrize("cls", ["Stat", "IntStat"])
def test_int_stat_event_values_are_ints(impl, reference, recorder, cls):
    if reference and cls == "IntStat":
        assert not hasattr(impl, "IntStat")  # extra of torch_monitor
        return
    integer = cls == "IntStat"
    holder = [make_stat(impl, "i", AGGS, cls=cls)]
    for v in [1, 2, 4]:
        holder[0].add(v)
    destroy(holder)
    [data] = recorder.stat_data("i")
    aggs = visible(reference, AGGS)
    # IntStat: MEAN is integer division (7 // 3 == 2).
    assert_values(data, as_event("i", expected_values([1, 2, 4], aggs, integer)), int if integer else float)


# ---------------------------------------------------------------- bad input (FIX)

SMALL_WINDOWS = [
    datetime.timedelta(microseconds=999),
    datetime.timedelta(0),
    0.0005,
    0.0,
]
NEGATIVE_WINDOWS = [datetime.timedelta(milliseconds=-5), -1.0]


@pytest.mark.parametrize("window", SMALL_WINDOWS + NEGATIVE_WINDOWS, ids=repr)
def test_bad_window(impl, reference, window):
    if not reference:
        with pytest.raises(ValueError):
            make_stat(impl, "w", ["SUM"], window)
        return
    # torch.monitor accepts it silently.  Adding to a < 1 ms window kills the process
    # with SIGFPE (see test_reentrancy_and_faults.py); a negative one "works".
    stat = make_stat(impl, "w", ["SUM"], window)
    assert stat.count == 0
    if window in NEGATIVE_WINDOWS:
        stat.add(1.0)
        assert stat.count == 1


@pytest.mark.parametrize("max_samples", [0, -1])
def test_bad_max_samples(impl, reference, recorder, max_samples):
    if not reference:
        with pytest.raises(ValueError):
            make_stat(impl, "ms", ["SUM"], LONG, max_samples)
        return
    # torch.monitor silently treats it as 1.
    stat = make_stat(impl, "ms", ["SUM"], LONG, max_samples)
    stat.add(1.0)
    stat.add(2.0)
    assert stat.count == 0
    assert recorder.stat_data("ms") == [{"ms.sum": 1.0}]


# ---------------------------------------------------------------- windows (real time)


@windowed
def test_each_aggregation_over_a_window(impl, reference, recorder, windows):
    # One stat per aggregation, all fed in the same window.
    windows.start()
    stats = {agg: make_stat(impl, f"each_{agg.lower()}", [agg], windows.seconds) for agg in AGGS}
    for stat in stats.values():
        for v in SAMPLES:
            stat.add(v)
    for agg, stat in stats.items():
        assert stat.count == len(SAMPLES), agg
        # The open window is not visible.
        assert_values(stat.get(), as_get(impl, zeros(visible(reference, [agg]))))
    windows.next()
    for stat in stats.values():
        stat.add(100.0)
    windows.check()
    events = recorder.stat_data()
    assert len(events) == len(AGGS)
    for agg, stat in stats.items():
        values = expected_values(SAMPLES, visible(reference, [agg]))
        assert stat.count == 1, agg
        assert_values(stat.get(), as_get(impl, values))
        assert as_event(stat.name, values) in events, agg
    if reference:
        assert {} in events  # the VALUE-only stat logs an event with empty data


@windowed
def test_get_and_count_through_window_changes(impl, recorder, windows):
    aggs = ["SUM", "COUNT", "MAX"]
    windows.start()
    stat = make_stat(impl, "gc", aggs, datetime.timedelta(milliseconds=WINDOW_MS))
    stat.add(1.0)
    stat.add(2.0)
    assert stat.count == 2
    assert_values(stat.get(), as_get(impl, zeros(aggs)))
    assert recorder.stat_data("gc") == []
    windows.next()
    before = datetime.datetime.now()
    stat.add(10.0)  # closes the first window, then counts in the second
    after = datetime.datetime.now()
    assert stat.count == 1
    first = expected_values([1.0, 2.0], aggs)
    assert_values(stat.get(), as_get(impl, first))
    events = [e for e in recorder.events if e.name == impl.STAT_EVENT]
    assert [e.data for e in events] == [as_event("gc", first)]
    slack = datetime.timedelta(milliseconds=1)
    assert before - slack <= events[0].timestamp <= after + slack  # stamped by that add
    stat.add(11.0)
    assert stat.count == 2
    assert_values(stat.get(), as_get(impl, first))  # still the last closed window
    windows.next()
    stat.add(0.0)
    windows.check()
    second = expected_values([10.0, 11.0], aggs)
    assert_values(stat.get(), as_get(impl, second))
    assert recorder.stat_data("gc") == [as_event("gc", first), as_event("gc", second)]


@windowed
def test_windows_aligned_to_clock_not_to_construction(impl, recorder, windows):
    # Construct and add 60 ms before a boundary; the window closes at that boundary.
    windows.start(offset_ms=WINDOW_MS - 60)
    stat = make_stat(impl, "align", ["SUM"], windows.seconds)
    stat.add(1.0)
    windows.next()  # ~85 ms after construction, far less than one window
    stat.add(2.0)
    windows.check()
    assert recorder.stat_data("align") == [{"align.sum": 1.0}]
    assert stat.count == 1


@windowed
def test_no_add_no_close(impl, recorder, windows):
    # torch.monitor has no timer: an elapsed window stays open until the next add.
    windows.start()
    stat = make_stat(impl, "stall", ["SUM"], windows.seconds)
    stat.add(1.0)
    windows.next(2)
    assert recorder.stat_data("stall") == []
    assert stat.count == 1
    assert_values(stat.get(), as_get(impl, {"SUM": 0.0}))


@windowed
def test_skipped_windows_emit_nothing(impl, recorder, windows):
    windows.start()
    holder = [make_stat(impl, "skip", ["SUM", "COUNT"], windows.seconds)]
    holder[0].add(1.0)
    holder[0].add(2.0)
    windows.next(3)
    holder[0].add(5.0)
    windows.check()
    assert holder[0].count == 1
    assert_values(holder[0].get(), as_get(impl, {"SUM": 3.0, "COUNT": 2.0}))
    destroy(holder)
    assert recorder.stat_data("skip") == [
        {"skip.sum": 3.0, "skip.count": 2.0},
        {"skip.sum": 5.0, "skip.count": 1.0},
    ]


@windowed
def test_max_samples_discard_and_reset_quirk(impl, reference, recorder, windows):
    aggs = visible(reference, ["SUM", "COUNT", "VALUE"])
    windows.start()
    holder = [make_stat(impl, "cap", aggs, windows.seconds, 2)]
    stat = holder[0]
    stat.add(1.0)
    assert stat.count == 1
    assert recorder.stat_data("cap") == []
    stat.add(2.0)  # reaches max_samples: closes at once, this sample included
    full = expected_values([1.0, 2.0], aggs)
    assert stat.count == 0
    assert_values(stat.get(), as_get(impl, full))
    assert recorder.stat_data("cap") == [as_event("cap", full)]
    stat.add(3.0)  # discarded until the next window
    stat.add(4.0)
    assert stat.count == 0
    assert_values(stat.get(), as_get(impl, full))
    windows.next()
    stat.add(10.0)  # closes the empty, discarded window: get() goes back to zeros
    windows.check()
    assert stat.count == 1
    assert_values(stat.get(), as_get(impl, zeros(aggs)))
    assert len(recorder.stat_data("cap")) == 1  # the empty window emitted nothing
    del stat
    destroy(holder)
    assert recorder.stat_data("cap")[1:] == [as_event("cap", expected_values([10.0], aggs))]


# ---------------------------------------------------------------- torch_monitor fake clock


@pytest.fixture
def clock(tm):
    testing = getattr(tm, "testing", None)
    if testing is None:
        import importlib

        testing = importlib.import_module("torch_monitor.testing")
    with testing.fake_clock() as c:
        yield c


@pytest.mark.parametrize(
    "window, ms",
    [
        (datetime.timedelta(microseconds=299_999), 299),
        (0.2999, 299),
        (datetime.timedelta(milliseconds=300), 300),
        (0.25, 250),
        (datetime.timedelta(milliseconds=1), 1),
    ],
    ids=["td-299.999ms", "float-0.2999", "td-300ms", "float-0.25", "td-1ms"],
)
def test_fake_clock_alignment_and_truncation(tm, tm_recorder, clock, window, ms):
    start = 10 * ms + ms - 1  # one millisecond before a boundary
    clock.set_ms(start)
    stat = make_stat(tm, "fc", ["SUM", "COUNT"], window)
    stat.add(1.0)
    assert tm_recorder.stat_data("fc") == []
    clock.set_ms(11 * ms)  # the boundary, 1 ms after construction
    stat.add(2.0)
    assert tm_recorder.stat_data("fc") == [{"fc.sum": 1.0, "fc.count": 1.0}]
    clock.set_ms(12 * ms - 1)  # still the same window
    stat.add(4.0)
    assert stat.count == 2
    assert len(tm_recorder.stat_data("fc")) == 1
    clock.advance_ms(1)
    stat.add(8.0)
    assert tm_recorder.stat_data("fc")[1:] == [{"fc.sum": 6.0, "fc.count": 2.0}]
    assert_values(stat.get(), as_get(tm, {"SUM": 6.0, "COUNT": 2.0}))


@pytest.mark.parametrize("cls", ["Stat", "IntStat"])
def test_fake_clock_get_count_and_skipped_windows(tm, tm_recorder, clock, cls):
    integer = cls == "IntStat"
    vtype = int if integer else float
    clock.set_ms(1_000)
    holder = [make_stat(tm, "sk", AGGS, 0.1, cls=cls)]
    stat = holder[0]
    for v in [1, 2]:
        stat.add(v)
    assert stat.count == 2
    assert_values(stat.get(), as_get(tm, zeros(AGGS, integer)), vtype)
    clock.advance_ms(550)  # windows 11 -> 16: four skipped windows
    stat.add(7)
    first = expected_values([1, 2], AGGS, integer)  # IntStat MEAN: 3 // 2 == 1
    assert_values(stat.get(), as_get(tm, first), vtype)
    assert stat.count == 1
    [data] = tm_recorder.stat_data("sk")
    assert_values(data, as_event("sk", first), vtype)
    del stat
    destroy(holder)
    assert_values(tm_recorder.stat_data("sk")[1], as_event("sk", expected_values([7], AGGS, integer)), vtype)


def test_fake_clock_max_samples_quirk(tm, tm_recorder, clock):
    clock.set_ms(5_000)
    stat = make_stat(tm, "q", ["SUM", "VALUE"], 1.0, 2)
    for v in [1.0, 2.0, 3.0]:
        stat.add(v)
    assert tm_recorder.stat_data("q") == [{"q.sum": 3.0, "q.value": 2.0}]
    assert_values(stat.get(), as_get(tm, {"SUM": 3.0, "VALUE": 2.0}))
    clock.advance_ms(999)  # same window: still discarding
    stat.add(4.0)
    assert stat.count == 0
    clock.advance_ms(1)
    stat.add(5.0)
    assert stat.count == 1
    assert_values(stat.get(), as_get(tm, {"SUM": 0.0, "VALUE": 0.0}))
    assert len(tm_recorder.stat_data("q")) == 1
