"""The law of merges (issue 25): ranks merge only windows of the same shape.
Rank 0 merges another rank's window into its own only when both ranks made
the object the same way in everything that decides what a window's numbers
mean; a rank whose object differs is refused, with one warning on rank 0
naming the object and both ranks' shapes, and each rank still logs its own
windows (as windows of one rank).

The objects are enumerated from the registry: every class of
``torch.classes.torch_monitor`` whose constructor takes ``sync_ranks``. Each
class has a row in ``ROWS``: its constructor's arguments sorted into shape
(each with the change rank 1 makes) and not shape. A new class, or a new
constructor argument, fails here until its row says which it is. One launch
of 2 gloo ranks (``merge_law_worker.py``) per class checks all its
variations at once, beside one object made the same way on both ranks,
which must merge.
"""

import json
import pathlib
import re
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import isolated  # noqa: E402
import merge_law_worker as worker  # noqa: E402

import torch_monitor as tm  # noqa: E402

WORKER = pathlib.Path(worker.__file__)
TIMEOUT_S = 90
AGGREGATIONS = ["value", "mean", "count", "sum", "max", "min"]
STAT_SHAPE = {
    # field: (the constructor arguments it covers, rank 1's change, what
    # rank 1's shape then says)
    "aggregations": (("aggregations",), {"aggregations": ["mean", "count", "sum", "max", "min"]},
                     "aggregations=[mean, count, sum, max, min]"),
    "window": (("window_size", "window_steps"), {"window_steps": 8}, "window_steps=8"),
    # A cap decides which samples a window holds (the first N).
    "max_samples": (("max_samples",), {"max_samples": 1000}, "max_samples=1000"),
}


class Row:
    """A class's law: how to make it, what is shape, what is not.

    ``base(i)``: the kwargs of object i, made so on rank 0 (on both ranks
    for the control); ``shape``: field -> (the constructor arguments it
    covers, rank 1's change, what rank 1's shape then says; "{i}" is i);
    ``swap``: the class rank 1 makes instead for the field "class" (the class
    itself is shape); ``not_shape``: the arguments that never stop a merge,
    with the reason; ``owns(i, event)``: whether an event is object i's;
    ``ranks_key(i)``: the data key that says how many ranks its window covers.
    """

    def __init__(self, base, shape, not_shape, owns, ranks_key, swap=None):
        self.base, self.shape, self.not_shape = base, shape, not_shape
        self.owns, self.ranks_key, self.swap = owns, ranks_key, swap


def stat_row(other):
    return Row(
        base=lambda i: {"name": f"law{i}", "aggregations": AGGREGATIONS, "window_steps": 4},
        shape=STAT_SHAPE,
        not_shape={
            "name": "names the object: two names are two objects",
            "close_on_time": "when a window closes, not what it holds",
            "sync_ranks": "the switch itself",
        },
        owns=lambda i, e: any(k.startswith(f"law{i}.") for k in e["data"]),
        ranks_key=lambda i: f"law{i}.ranks",
        swap=other,
    )


def watch_base(i):
    return {"paths": [f"w{i}.a", f"w{i}.b"], "kinds": ["grad", "grad"], "window_steps": 4}


ROWS = {
    # A capture's windows are its keys' Stats: each key merges as a Stat of
    # the capture's window (merge_law_worker.py times key "law<i>").
    "PytorchCounterCapture": Row(
        base=lambda i: {"include": f"^law{i}$", "window_steps": 4},
        shape={"window": (("window_size", "window_steps"), {"window_steps": 8}, "window_steps=8")},
        not_shape={
            "include": "which keys it takes, not what a key's window holds",
            "exclude": "which keys it takes, not what a key's window holds",
            "close_on_time": "when a window closes, not what it holds",
            "sync_ranks": "the switch itself",
        },
        owns=lambda i, e: any(k.startswith(f"law{i}.") for k in e["data"]),
        ranks_key=lambda i: f"law{i}.ranks",
    ),
    "Stat": stat_row("IntStat"),
    "IntStat": stat_row("Stat"),
    "Watch": Row(
        base=watch_base,
        shape={
            # Each changes which rows a window holds or what they mean.
            "paths": (("paths",), {"paths": ["w{i}.a", "w{i}.c"]}, "w{i}.c.grad"),
            "kinds": (("kinds",), {"kinds": ["grad", "weight"]}, "w{i}.b.weight"),
            "window": (("window_steps", "window_seconds"), {"window_steps": 8}, "window_steps=8"),
            "every": (("every",), {"every": 2}, "every=2"),
            "memory": (("memory",), {"memory": True}, "memory=True"),
        },
        not_shape={
            "histograms_every": "histograms go to this rank's own writer",
            "writer": "this rank's own TensorBoard writer",
            "sync_ranks": "the switch itself",
            "device": "where the rows are kept, not what they mean",
            "on_nonfinite": "each rank's own alarm: non-finite values are reported where they are seen",
            "close_on_time": "when a window closes, not what it holds",
        },
        owns=lambda i, e: e["name"] == tm.WATCH_EVENT and any(k.startswith(f"w{i}.") for k in e["data"]),
        ranks_key=lambda i: "watch.ranks",
    ),
}


def constructor_args():
    """{class: its constructor's argument names} for the classes that sync ranks."""
    out = {}
    for name, schemas in tm._internals.custom_class_schemas("torch_monitor").items():
        for schema in schemas:
            if schema.name == "__init__":
                args = [a.name for a in schema.arguments[1:]]
                if "sync_ranks" in args:
                    out[name] = args
    return out


CLASSES = constructor_args()


def test_every_class_that_syncs_ranks_has_a_row():
    assert {"Stat", "IntStat", "Watch"} <= set(CLASSES), CLASSES
    assert set(CLASSES) == set(ROWS), "give each class that takes sync_ranks a row in ROWS"
    for name, args in CLASSES.items():
        row = ROWS[name]
        shape = {a for covered, _, _ in row.shape.values() for a in covered}
        unsorted = set(args) - shape - set(row.not_shape)
        assert not unsorted, f"{name}: say in ROWS whether {sorted(unsorted)} is shape"
        stale = (shape | set(row.not_shape)) - set(args)
        assert not stale, f"{name}: ROWS names arguments it does not take: {sorted(stale)}"


def variations(name):
    """[(field, rank 0's [class, kwargs], rank 1's, text in rank 1's shape)],
    object i at index i; the control (made the same way on both ranks) last,
    with field None."""
    row = ROWS[name]
    fields = list(row.shape) + (["class"] if row.swap else [])
    out = []
    for i, field in enumerate(fields):
        base = row.base(i)
        if field == "class":
            out.append((field, [name, base], [row.swap, base], f"a {row.swap} with"))
            continue
        _, change, text = row.shape[field]
        change = json.loads(json.dumps(change).replace("{i}", str(i)))
        out.append((field, [name, base], [name, {**base, **change}], text.replace("{i}", str(i))))
    control = row.base(len(fields))
    out.append((None, [name, control], [name, control], None))
    return out


def windows_of(kwargs):
    """How many windows an object logs over the worker's steps."""
    return -(-worker.STEPS // kwargs["window_steps"])


def whats_of(name, i):
    """How the warnings name object i's synced parts: a capture's are its
    key's Stat and its gauges (the values read at each close)."""
    if name == "Watch":
        return [f"watch torch_monitor.Watch#{i}"]
    if name == "PytorchCounterCapture":
        return [f"Stat 'law{i}'", f"gauges torch_monitor.PytorchCounters#{i}"]
    return [f"Stat 'law{i}'"]


@pytest.mark.parametrize("name", sorted(ROWS))
def test_ranks_whose_objects_differ_in_shape_are_refused_and_log_their_own_windows(tmp_path, name):
    cases = variations(name)
    for r in (0, 1):
        (tmp_path / f"spec{r}.json").write_text(json.dumps([case[1 + r] for case in cases]))
    init = f"file://{tmp_path / 'store'}"
    isolated.run_ranks(
        [[sys.executable, "-P", str(WORKER), str(r), "2", init, str(tmp_path), str(tmp_path / f"spec{r}.json")]
         for r in (0, 1)],
        TIMEOUT_S,
    )
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    row = ROWS[name]
    refused = [w for w in results[0]["warnings"] if "is not the same on every rank" in w]
    for i, (field, *made, text) in enumerate(cases):
        for r in (0, 1):
            events = [e for e in results[r]["events"] if row.owns(i, e)]
            ranks = [e["data"].get(row.ranks_key(i)) for e in events]
            if field is None:  # the control: merged, on rank 0 only
                assert ranks == ([2] * windows_of(made[r][1]) if r == 0 else []), (r, events)
            else:  # each rank logs every window of its own, as a window of one rank
                assert ranks == [1] * windows_of(made[r][1]), (field, r, events)
        for what in whats_of(name, i):
            mine = [w for w in refused if f"{what} is not the same" in w]
            if field is None:
                assert mine == [], mine
                continue
            assert len(mine) == 1, (field, what, results[0]["warnings"])
            shapes = re.search(r"rank 0 has (.*), rank 1 (.*); rank 1's windows are not merged", mine[0])
            assert shapes and shapes.group(1) != shapes.group(2), mine[0]
            assert text in shapes.group(2) and text not in shapes.group(1), (field, text, mine[0])
            assert any(what in w and "refused" in w for w in results[1]["warnings"]), (field, results[1]["warnings"])
    differing = [i for i, case in enumerate(cases) if case[0] is not None]
    assert len(refused) == sum(len(whats_of(name, i)) for i in differing), refused
