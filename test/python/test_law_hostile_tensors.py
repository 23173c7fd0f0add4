"""The law of hostile tensors (issue 25), for every op of the torch_monitor
library: the ops are enumerated from the registry
(``_internals.library_op_schemas``), so an op is covered by being registered;
what a new op adds here is its entry in VALID_CALLS (valid example
arguments), and in ACCEPTS the hostile variants it legitimately accepts.

For each op: ``torch.library.opcheck`` with its valid calls (the checks that
cannot apply skipped, each with its reason in OPCHECK_SKIPS); then, for each
Tensor or Tensor[] argument (of a list, its first element), hostile variants
of it: expanded (stride 0), transposed, a non-contiguous slice, empty, on the
meta device, of the wrong dtype. Each must be refused with a ValueError or
TypeError, never a crash: they run in a child process with a time limit, so
a segfault fails the op's test and names the variant. A variant listed in
ACCEPTS may be accepted instead, if it gives what the same values give as a
plain contiguous tensor. test/cpp/test_op_laws.cpp is the C++ side (through
the dispatcher, also under ASan + UBSan).
"""

import json
import pathlib
import sys

import pytest
import torch

tm = pytest.importorskip("torch_monitor")
from torch_monitor import _internals  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from isolated import run_isolated  # noqa: E402


class Call:
    """One valid call of an op: its arguments, and ``result()``: what it did,
    printed (read after the call). ``close()`` drops its state."""

    def __init__(self, args, result, close=lambda: None):
        self.args = args
        self.result = result
        self._close = close

    def close(self):
        close, self._close = self._close, lambda: None
        close()


def _watch_call(update):
    def make():
        kind = "update" if update else "output"
        w = torch.classes.torch_monitor.Watch(["a", "b"], [kind, kind], window_steps=100)
        gen = torch.Generator().manual_seed(0)
        values = [torch.randn(3, 5, generator=gen), torch.randn(4, generator=gen)]
        before = [torch.randn(3, 5, generator=gen), torch.randn(4, generator=gen)] if update else []
        return Call(
            (w.slots(), w.gate(), values, [0, 1], before, w.id()),
            lambda: repr(w.slots().tolist()),
            w.remove,
        )

    return make


def _event_call(args):
    def make():
        seen = []
        handle = tm.register_event_handler(
            lambda e: seen.append((e.name, sorted((k, type(v).__name__, v) for k, v in e.data.items())))
        )
        return Call(args(), lambda: repr(seen), lambda: tm.unregister_event_handler(handle))

    return make


def _step_call(args, result):
    def make():
        return Call(args, result, lambda: tm.set_step(None))

    return make


#: Valid calls of every op, by qualified name: each makes fresh state.
VALID_CALLS = {
    "torch_monitor::watch_observe_": [_watch_call(False), _watch_call(True)],
    "torch_monitor::log_event_values": [
        _event_call(lambda: ("law", ["x", "y"], [torch.full((1, 1), 2.5), torch.tensor(3)], ["note"], ["text"]))
    ],
    "torch_monitor::log_event": [
        _event_call(lambda: (torch.classes.torch_monitor.Event("law"),))
    ],
    "torch_monitor::set_step": [_step_call((7,), lambda: repr(tm.get_step()))],
    "torch_monitor::get_step": [_step_call((), lambda: "")],
    "torch_monitor::live_stat_names": [lambda: Call((), lambda: "")],
}

_COPIED = "read through a contiguous copy"

#: The hostile variants an op accepts, by op, argument and variant, with the
#: reason; any other variant must be refused.
ACCEPTS = {
    "torch_monitor::watch_observe_": {
        "values": {
            "expanded": _COPIED,
            "transposed": _COPIED,
            "sliced": _COPIED,
            "empty": "nothing to observe: skipped (docs/watch.md)",
            "wrong dtype": "not floating point: skipped, as an integer output is (docs/watch.md)",
        },
        "before": {"expanded": _COPIED, "transposed": _COPIED, "sliced": _COPIED},
    },
    "torch_monitor::log_event_values": {
        "values": {
            "transposed": "one element, read with item()",
            "sliced": "one element, read with item()",
            "wrong dtype": "an integer tensor logs an int (docs/events)",
        },
    },
}

#: opcheck's checks that cannot apply to an op, with the reason.
OPCHECK_SKIPS = {
    "torch_monitor::log_event": {
        "test_schema": "its schema check cannot read a TorchScript object argument (it calls len() "
        "on the Event); the op takes no tensor, so no tensor aliasing or mutation is left to check",
    },
    "torch_monitor::get_step": {
        "test_faketensor": "its result is known only when the graph runs: its fake raises on purpose",
        "test_aot_dispatch_dynamic": "its result is known only when the graph runs: it cannot be traced",
    },
    "torch_monitor::live_stat_names": {
        "test_faketensor": "its result is known only when the graph runs: its fake raises on purpose",
        "test_aot_dispatch_dynamic": "its result is known only when the graph runs: it cannot be traced",
    },
}

OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def registered_ops():
    return sorted({s.name for s in _internals.library_op_schemas("torch_monitor")})


def _schema(name):
    (schema,) = [s for s in _internals.library_op_schemas("torch_monitor") if s.name == name]
    return schema


def _op(name):
    schema = _schema(name)
    packet = getattr(torch.ops.torch_monitor, name.split("::", 1)[1])
    return getattr(packet, schema.overload_name or "default")


def _tensor_arguments(name):
    """(position, argument name, is a list) of the op's Tensor and Tensor[]
    arguments."""
    out = []
    for i, a in enumerate(_schema(name).arguments):
        t = str(a.type)
        if t in ("Tensor", "Tensor?"):
            out.append((i, a.name, False))
        elif t in ("List[Tensor]", "Tensor[]"):
            out.append((i, a.name, True))
    return out


def hostile_variants(t):
    """(name, tensor or None, why not) of each hostile variant of ``t``."""
    out = []
    if t.numel() > 1:
        out.append(("expanded", t.flatten()[0].expand(t.shape), ""))  # every stride 0
    elif t.numel() == 1:
        out.append(("expanded", t.reshape(1).expand(2), ""))
    else:
        out.append(("expanded", None, "no element to repeat"))
    if t.dim() >= 2:
        out.append(("transposed", t.transpose(-1, -2).contiguous().transpose(-1, -2), ""))
    else:
        out.append(("transposed", None, "fewer than 2 dimensions: no transpose"))
    if t.dim() >= 1:
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)[..., ::2]
        wide.copy_(t)
        out.append(("sliced", wide, ""))
        out.append(("empty", t[..., :0], ""))
    else:
        out.append(("sliced", None, "0-d: nothing to slice"))
        out.append(("empty", t.reshape(1)[:0], ""))
    out.append(("meta", torch.empty_like(t, device="meta"), ""))
    out.append(("wrong dtype", t.to(torch.int64 if t.is_floating_point() else torch.float64), ""))
    return out


def _replaced(call, position, is_list, tensor):
    args = list(call.args)
    if is_list:
        args[position] = [tensor] + list(args[position][1:])
    else:
        args[position] = tensor
    call.args = tuple(args)
    return call


def run_hostile_variants(name):
    """The child's side: every hostile variant of every tensor argument of
    op ``name``, one JSON line each (a line naming it is printed before the
    call, so that a crash names the variant)."""
    op = _op(name)
    for example, make in enumerate(VALID_CALLS[name]):
        for position, argument, is_list in _tensor_arguments(name):
            probe = make()
            valid = probe.args[position]
            probe.close()
            if is_list:
                if not valid:
                    continue  # this call passes no tensor there
                valid = valid[0]
            for variant, tensor, why_not in hostile_variants(valid):
                record = {"example": example, "argument": argument, "variant": variant}
                if tensor is None:
                    print(json.dumps(dict(record, outcome="not made", why=why_not)), flush=True)
                    continue
                print(f"trying {record}", flush=True)
                call = _replaced(make(), position, is_list, tensor)
                try:
                    op(*call.args)
                except Exception as e:  # judged by the parent
                    record.update(outcome="refused", error=type(e).__name__, message=str(e).split("\n")[0])
                else:
                    got = call.result()
                    call.close()
                    plain = _replaced(make(), position, is_list, tensor.contiguous().clone())
                    try:
                        op(*plain.args)
                        want = plain.result()
                    except Exception as e:
                        want = f"the plain call raised {e!r}"
                    record.update(outcome="accepted", same=got == want, got=got[:300], want=want[:300])
                    plain.close()
                finally:
                    call.close()
                print(json.dumps(record), flush=True)


def test_every_registered_op_has_valid_calls():
    ops = registered_ops()
    assert "torch_monitor::watch_observe_" in ops  # the enumeration sees the registry
    missing = [op for op in ops if op not in VALID_CALLS]
    assert not missing, f"add valid calls to VALID_CALLS (and ACCEPTS, if any) for {missing}"
    stale = [op for op in VALID_CALLS if op not in ops]
    assert not stale, f"VALID_CALLS names ops that are not registered: {stale}"


@pytest.mark.parametrize("name", registered_ops())
def test_opcheck_with_valid_calls(name):
    if name not in VALID_CALLS:
        pytest.fail(f"{name} has no valid calls in VALID_CALLS")
    skips = OPCHECK_SKIPS.get(name, {})
    utils = tuple(u for u in OPCHECK_UTILS if u not in skips)
    for make in VALID_CALLS[name]:
        call = make()
        try:
            torch.library.opcheck(_op(name), call.args, test_utils=utils)
        finally:
            call.close()


@pytest.mark.parametrize("name", registered_ops())
def test_hostile_tensors_are_refused_or_read_right(name):
    if name not in VALID_CALLS:
        pytest.fail(f"{name} has no valid calls in VALID_CALLS")
    if not _tensor_arguments(name):
        return  # no Tensor argument: nothing hostile to pass
    here = pathlib.Path(__file__).parent
    out = run_isolated(
        f"""
        import sys
        sys.path.insert(0, {str(here)!r})
        import test_law_hostile_tensors as law
        law.run_hostile_variants({name!r})
        """,
        timeout=120,
    )
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert records, out.stdout
    accepts = ACCEPTS.get(name, {})
    problems = []
    for r in records:
        where = f"{r['argument']} {r['variant']} (valid call {r['example']})"
        if r["outcome"] == "refused":
            if r["error"] not in ("ValueError", "TypeError"):
                problems.append(f"{where}: refused with {r['error']}, not a ValueError/TypeError: {r['message']}")
            elif len(r["message"]) < 20:
                problems.append(f"{where}: refused without saying what to pass: {r['message']!r}")
        elif r["outcome"] == "accepted":
            reason = accepts.get(r["argument"], {}).get(r["variant"])
            if reason is None or r["variant"] == "meta":
                problems.append(f"{where}: accepted without an error")
            elif not r["same"]:
                problems.append(f"{where}: accepted ({reason}) but read wrongly: {r['got']} != {r['want']}")
    assert not problems, "\n".join(problems)
