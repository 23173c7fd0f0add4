"""capture_pytorch_counters: PyTorch's own wait counters as Stats (issue 27).

The oracle is PyTorch's own backend of the same counters, the control plane's
``wait_counter_values`` handler (torch.distributed.debug's /wait_counters),
called in-process: c10 hands every backend the same two clock readings per
unit of work, and that handler adds whole microseconds, so for the units a
capture saw, its count equals the handler's count difference, its max
floors to the handler's max (when the handler's max is new), and its sum
lies in [total, total + count) of the handler's total difference.
"""

import json
import math
import pathlib
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

tm = pytest.importorskip("torch_monitor")

from isolated import run_isolated, run_ranks  # noqa: E402

c10d = pytest.importorskip("torch._C._distributed_c10d")

PREFIX = "pytorch.wait_counter."


class _Request(c10d._Request):
    def body(self):
        return b""

    def params(self):
        return {}


class _Response(c10d._Response):
    def __init__(self):
        super().__init__()
        self.content = None

    def set_content(self, content, content_type):
        self.content = content

    def set_status(self, status):
        pass


def control_plane():
    """{key: {total_calls, total_time_us, max_time_us, active_count}} from
    PyTorch's own backend."""
    response = _Response()
    c10d._get_handler("wait_counter_values")(_Request(), response)
    return json.loads(response.content)


def captured(memory):
    """{key: {statistic: value}} summed over the Stat events `memory` got."""
    out = {}
    for event in memory.events():
        assert event.name == "torch.monitor.Stat"
        for name, value in event.data.items():
            key, _, statistic = name.rpartition(".")
            entry = out.setdefault(key, {})
            if statistic == "max":
                entry[statistic] = max(entry.get(statistic, 0.0), value)
            elif statistic != "mean":
                entry[statistic] = entry.get(statistic, 0.0) + value
    return out


def assert_matches_control_plane(got, before, after, keys):
    for key in keys:
        then = before.get(key, {"total_calls": 0, "total_time_us": 0, "max_time_us": 0})
        now = after[key]
        calls = now["total_calls"] - then["total_calls"]
        total = now["total_time_us"] - then["total_time_us"]
        assert got[key]["count"] == calls, key
        assert total <= got[key]["sum"] < total + calls, key
        if now["max_time_us"] > then["max_time_us"]:
            assert math.floor(got[key]["max"]) == now["max_time_us"], key


@pytest.fixture
def memory():
    handler = tm.MemoryHandler(capacity=10_000)
    handler.register()
    yield handler
    handler.unregister()


def test_a_user_wait_counter_is_captured_as_the_control_plane_counts_it(memory):
    counter = torch.monitor._WaitCounter("test.capture.user")
    with counter.guard():  # first use: c10 attaches the backends now
        pass
    before = control_plane()
    with tm.capture_pytorch_counters(window_size=3600.0) as capture:
        for _ in range(7):
            with counter.guard():
                sum(range(1000))
        assert capture.keys() == ["test.capture.user"]
    assert capture.removed
    assert_matches_control_plane(captured(memory), before, control_plane(), ["test.capture.user"])


def test_tcpstore_operations_are_captured():
    store = dist.TCPStore("127.0.0.1", 0, 1, True)
    memory = tm.MemoryHandler(capacity=10_000)
    memory.register()
    before = control_plane()
    with tm.capture_pytorch_counters(window_steps=1000, include="TCPStore"):
        for i in range(5):
            store.set(f"k{i}", "v")
        store.get("k1")
        store.add("n", 3)
    memory.unregister()
    keys = [PREFIX + f"TCPStore__{op}" for op in ("set", "get", "add")]
    got = captured(memory)
    assert sorted(got) == sorted(keys)
    assert got[PREFIX + "TCPStore__set"]["count"] == 5
    assert_matches_control_plane(got, before, control_plane(), keys)


def test_compilation_is_captured(memory):
    before = control_plane()
    with tm.capture_pytorch_counters(include=r"compile"):
        torch.compile(lambda x: x.cos() * 2, backend="eager")(torch.ones(3))
    keys = [PREFIX + k for k in ("dynamo_compile", "entire_forward_compile", "compile_aot_autograd")]
    got = captured(memory)
    assert set(keys) <= set(got)
    assert all(got[k]["count"] == 1 for k in keys)
    assert_matches_control_plane(got, before, control_plane(), keys)


def test_init_process_group_is_captured(memory, tmp_path):
    before = control_plane()
    with tm.capture_pytorch_counters(include=r"c10d\.", exclude="barrier"):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
        dist.destroy_process_group()
    key = PREFIX + "c10d.init_process_group"
    got = captured(memory)
    assert key in got and not any("barrier" in k for k in got)
    assert_matches_control_plane(got, before, control_plane(), [key])


def test_include_and_exclude_choose_keys(memory):
    counters = {name: torch.monitor._WaitCounter(f"test.choose.{name}") for name in ("a", "b", "ab")}
    with tm.capture_pytorch_counters(include=r"\.a", exclude="b$") as capture:
        for counter in counters.values():
            with counter.guard():
                pass
        assert capture.keys() == ["test.choose.a"]
    assert sorted(captured(memory)) == ["test.choose.a"]


def test_step_windows_close_at_set_step(memory):
    counter = torch.monitor._WaitCounter("test.capture.steps")
    tm.set_step(0)
    try:
        with tm.capture_pytorch_counters(window_steps=2):
            for step in range(5):
                tm.set_step(step)
                with counter.guard():
                    pass
    finally:
        tm.set_step(None)
    counts = [(e.step, e.data["test.capture.steps.count"]) for e in memory.events()]
    # Windows [0, 2), [2, 4), and the partial [4, 6) closed by remove().
    assert counts == [(2, 2.0), (4, 2.0), (5, 1.0)]


def test_units_running_at_a_close_are_logged_as_active_as_the_control_plane_counts_them(memory):
    """"<key>.active" is the number of units running when a window closes
    (the control plane's active_count), for the keys the capture takes;
    0 at the first close that finds none after some ran (so that no sink keeps
    the last count as if they still ran), then nothing."""
    held = torch.monitor._WaitCounter("test.active.held")
    done = torch.monitor._WaitCounter("test.active.done")
    other = torch.monitor._WaitCounter("test.active.excluded")
    tm.set_step(0)
    guards = [held.guard(), held.guard(), other.guard()]
    try:
        with tm.capture_pytorch_counters(window_steps=2, exclude="excluded"):
            for guard in guards:
                guard.__enter__()
            with done.guard():
                pass
            before = control_plane()
            tm.set_step(2)  # closes [0, 2) with two units of "held" running
            for guard in guards:
                guard.__exit__(None, None, None)
            tm.set_step(4)  # closes [2, 4): none running any more
            tm.set_step(6)  # closes [4, 6): none running
    finally:
        tm.set_step(None)
    active = [(e.step, e.data) for e in memory.events() if any(k.endswith(".active") for k in e.data)]
    assert before["test.active.held"]["active_count"] == 2
    assert active == [(2, {"test.active.held.active": 2}), (4, {"test.active.held.active": 0})]


def test_a_step_going_back_logs_the_running_units_at_the_step_reached(memory):
    """As a Stat's step window: the window the step went back from is closed
    then, stamped with the step the run had reached, not the new one."""
    guard = torch.monitor._WaitCounter("test.active.back").guard()
    tm.set_step(4)
    try:
        with tm.capture_pytorch_counters(window_steps=2):
            guard.__enter__()
            tm.set_step(1)  # back from [4, 6) to [0, 2)
            guard.__exit__(None, None, None)
    finally:
        tm.set_step(None)
    active = [(e.step, e.data) for e in memory.events() if "test.active.back.active" in e.data]
    # Then the window left open at remove(), its unit ended: 0, one step
    # after the last step set (as a Stat's window closed early).
    assert active == [(4, {"test.active.back.active": 1}), (2, {"test.active.back.active": 0})]


def test_time_windows_of_active_units_close_on_the_timer(memory):
    """A gauge has no sample whose add() could close its window: time
    windows close on the window timer, with no set_step and no unit ending."""
    counter = torch.monitor._WaitCounter("test.active.timer")
    guard = counter.guard()
    with tm.capture_pytorch_counters(window_size=0.05):
        guard.__enter__()
        deadline = time.monotonic() + 30
        while not memory.events() and time.monotonic() < deadline:
            time.sleep(0.02)
        guard.__exit__(None, None, None)
    assert memory.events(), "no window closed on the timer within 30 s"
    assert memory.events()[0].data == {"test.active.timer.active": 1}


def test_a_unit_started_before_the_capture_is_not_its_own(memory):
    counter = torch.monitor._WaitCounter("test.capture.straddle")
    guard = counter.guard()
    guard.__enter__()
    with tm.capture_pytorch_counters():
        guard.__exit__(None, None, None)
        with counter.guard():
            pass
    assert captured(memory)["test.capture.straddle"]["count"] == 1


def test_two_captures_each_log_their_own(memory):
    counter = torch.monitor._WaitCounter("test.capture.two")
    with tm.capture_pytorch_counters(), tm.capture_pytorch_counters(include="two"):
        with counter.guard():
            pass
    assert [e.data["test.capture.two.count"] for e in memory.events()] == [1.0, 1.0]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(window_steps=2, window_size=1.0), ValueError, "at most one of window_steps"),
        (dict(window_steps=0), ValueError, "window_steps must be at least 1"),
        (dict(window_size=0.0), ValueError, "window_size"),
        (dict(window_steps=3, close_on_time=True), ValueError, "close_on_time applies to time windows"),
        (dict(include="("), ValueError, "include='\\(' is not a valid regular expression"),
        (dict(exclude="a\0b"), ValueError, "exclude"),
        (dict(close_on_time="yes"), TypeError, "close_on_time"),
    ],
)
def test_bad_input_is_refused_at_the_call(kwargs, error, match):
    with pytest.raises(error, match=match):
        tm.capture_pytorch_counters(**kwargs)


def test_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        tm.capture_pytorch_counters(10)


def test_at_most_64_captures_run_at_once():
    captures = [tm.capture_pytorch_counters() for _ in range(64)]
    with pytest.raises(ValueError, match="64 captures are active already"):
        tm.capture_pytorch_counters()
    captures.pop().remove()
    tm.capture_pytorch_counters().remove()


def test_removing_a_capture_while_threads_time_work_is_safe(memory):
    counter = torch.monitor._WaitCounter("test.capture.threads")
    stop = threading.Event()

    def work():
        while not stop.is_set():
            with counter.guard():
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(50):
            tm.capture_pytorch_counters(window_size=0.001).remove()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    for e in memory.events():
        # A window's units, or how many of the four threads' were running.
        if "test.capture.threads.active" in e.data:
            assert e.data == {"test.capture.threads.active": e.data["test.capture.threads.active"]}
            assert 0 <= e.data["test.capture.threads.active"] <= 4  # 0: none since the last
        else:
            assert e.data["test.capture.threads.count"] >= 1


def test_the_last_window_is_logged_at_exit_and_a_forked_child_captures_its_own(tmp_path):
    """A capture never removed logs its open window at exit (the one exit
    sequence); a child of fork() captures its own units, not the parent's."""
    run_isolated(
        f"""
        import json, os, torch, torch_monitor as tm
        counter = torch.monitor._WaitCounter("test.capture.exit")
        capture = tm.capture_pytorch_counters(window_size=3600.0)
        with counter.guard():
            pass
        pid = os.fork()
        if pid == 0:
            writer = tm.JsonLinesWriter({str(tmp_path / "child.jsonl")!r})
            writer.register()
            for _ in range(3):
                with counter.guard():
                    pass
            raise SystemExit(0)
        assert os.waitpid(pid, 0)[1] == 0
        writer = tm.JsonLinesWriter({str(tmp_path / "parent.jsonl")!r})
        writer.register()
        with counter.guard():
            pass
        held = counter.guard()
        held.__enter__()  # still running at exit
        """,
        timeout=120,
    )

    def data(name):
        return [json.loads(line)["data"] for line in (tmp_path / name).read_text().splitlines()]

    assert [d["test.capture.exit.count"] for d in data("child.jsonl")] == [3]
    # The unit running at exit is logged once, by the first exit hook.
    parent = data("parent.jsonl")
    assert [d["test.capture.exit.count"] for d in parent if "test.capture.exit.count" in d] == [2]
    assert [d for d in parent if "test.capture.exit.count" not in d] == [{"test.capture.exit.active": 1}]


def test_a_key_first_used_before_import_is_not_captured():
    """c10 gives a key its backends at its first use."""
    run_isolated(
        """
        import torch
        early = torch.monitor._WaitCounter("test.capture.early")
        with early.guard():
            pass
        import torch_monitor as tm
        memory = tm.MemoryHandler(capacity=10)
        memory.register()
        with tm.capture_pytorch_counters() as capture:
            with early.guard():
                pass
            with torch.monitor._WaitCounter("test.capture.late").guard():
                pass
            assert capture.keys() == ["test.capture.late"], capture.keys()
        assert capture.keys() == []
        """,
        timeout=120,
    )


RANK_SCRIPT = """
import json, sys, torch, torch.distributed as dist, torch_monitor as tm
rank, init, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
events = []
handle = tm.register_event_handler(lambda e: events.append((e.step, dict(e.data))))
counter = torch.monitor._WaitCounter("test.capture.ranks")
tm.set_step(0)
with tm.capture_pytorch_counters(window_steps=4, include="ranks$", sync_ranks=True):
    held = counter.guard()
    for step in range(8):
        tm.set_step(step)
        if step == 3:  # running at the close at step 4, on both ranks
            held.__enter__()
        if step == 5:
            held.__exit__(None, None, None)
        for _ in range(rank + 1):  # rank 0 times 1 unit a step, rank 1 two
            with counter.guard():
                pass
    tm.set_step(8)
    tm._close_all_stats()
tm.flush_rank_sync()
tm.unregister_event_handler(handle)
json.dump(events, open(out, "w"))
dist.barrier()
dist.destroy_process_group()
"""


def test_sync_ranks_merges_each_keys_windows_exactly(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    init = f"file://{tmp_path / 'store'}"
    run_ranks(
        [[sys.executable, "-P", str(script), str(r), init, str(tmp_path / f"rank{r}.json")] for r in (0, 1)],
        timeout=120,
    )
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    key = "test.capture.ranks"
    # Two windows of 4 steps: 4 units of rank 0 and 8 of rank 1 each, and
    # in the second the unit each rank held across step 4.
    stats = [(step, data[key + ".count"], data[key + ".ranks"]) for step, data in rank0 if key + ".count" in data]
    assert stats == [(4, 12.0, 2), (8, 14.0, 2)]
    # The units running at the close at step 4: one per rank, summed; none
    # at the close at step 8.
    gauges = [(step, data) for step, data in rank0 if key + ".count" not in data]
    assert gauges == [
        (4, {key + ".active": 2, "pytorch_counters.ranks": 2}),
        (8, {key + ".active": 0, "pytorch_counters.ranks": 2}),
    ]
    assert rank1 == []


def test_removing_a_capture_never_waits_for_a_python_handler():
    """TCPStore operations run without the GIL, so a window they close runs
    a Python handler that must take it; a capture dropped meanwhile (its
    destructor runs with the GIL held) must not wait for that handler (in a
    subprocess: a deadlock is the failure)."""
    run_isolated(
        """
        import threading, time
        import torch.distributed as dist
        import torch_monitor as tm
        store = dist.TCPStore("127.0.0.1", 0, 1, True)
        seen = []
        tm.register_event_handler(lambda event: seen.append(event.name))
        stop = threading.Event()

        def work():
            while not stop.is_set():
                store.set("key", "value")

        thread = threading.Thread(target=work)
        thread.start()
        for _ in range(300):
            capture = tm.capture_pytorch_counters(window_size=0.001, include="TCPStore__set")
            time.sleep(0.002)
            del capture  # removed by its destructor, with the GIL held
        stop.set()
        thread.join()
        assert seen, "no window was logged"
        """,
        timeout=60,
    )
