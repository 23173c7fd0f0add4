"""``log_event(name, data)``: the form of log_event that PyTorch 2 can trace.

``torch_monitor.log_event(event)`` is a raw C function taking an ``Event``,
which traced code cannot build. Its other form, ``log_event(name, data)``,
turns ``data`` into the op ``torch.ops.torch_monitor.log_event_values``
(numbers and tensors become one-element tensors, read when the op runs;
strings pass as strings), so that it runs the same way in eager code, in a
``torch.compile`` graph (this function is traced in place of the C function)
and in a ``torch.export`` program (the op is recorded, and runs with the
program). The C function hands this module every form but the fast one.
"""

import torch

from . import _C, _faces, _internals

__all__ = ["log_event"]

_log_event_values = torch.ops.torch_monitor.log_event_values.default

# help() and inspect.signature() of the binding's classes: their bindings'
# signatures.
for _cls in (_C.Event, _C.Aggregation):
    _cls.__signature__ = _faces.signature_from_doc(_cls.__init__)


def _log_event_object(event):
    return _C.log_event(event)


def _as_tensor(value, key: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()  # read, never differentiated
    given = value
    if type(value) not in (bool, int, float):
        # NumPy scalars and other registered numbers, as an Event's data
        # takes them (never in traced code, where values are tensors).
        try:
            value = _C._event_value(key, value)
        except TypeError:
            value = None
    if type(value) is int and not -(2**63) <= value < 2**63:
        raise OverflowError(f"log_event: the value of {key!r} does not fit in a 64-bit signed integer")
    # bool before int: a bool is an int in Python, not in an Event.
    for kind, dtype in ((bool, torch.bool), (int, torch.int64), (float, torch.float64)):
        if isinstance(value, kind):
            return torch.tensor(value, dtype=dtype)
    raise TypeError(
        f"log_event: the value of {key!r} must be a number, a one-element "
        f"tensor or a str, got {type(given).__name__}"
    )


def log_event(event, data=None):
    """log_event(event) or log_event(name, data); see torch_monitor.log_event."""
    if isinstance(event, _C.Event):
        if data is not None:
            raise TypeError(
                "log_event() takes exactly one argument (an Event) or two (a "
                "name and a dict of values); got an Event and a "
                f"{type(data).__name__}"
            )
        return _log_event_object(event)
    if data is None:
        raise TypeError(
            f"log_event expects a torch_monitor.Event, got {type(event).__name__} "
            "(or a name and a dict of values: log_event(name, {'loss': loss}))"
        )
    if not isinstance(event, str):
        raise TypeError(
            f"log_event(name, data): name must be a str, got {type(event).__name__}"
        )
    if not isinstance(data, dict):
        raise TypeError(
            "log_event(name, data): data must be a dict such as {'loss': loss}, "
            f"got {type(data).__name__}"
        )
    keys, values, text_keys, texts = [], [], [], []
    for key, value in data.items():
        if not isinstance(key, str):
            raise TypeError(
                f"log_event: data keys must be str, got {type(key).__name__}"
            )
        if isinstance(value, str):
            text_keys.append(key)
            texts.append(value)
        else:
            keys.append(key)
            values.append(_as_tensor(value, key))
    _log_event_values(event, keys, values, text_keys, texts)


def _trace_log_event(dynamo) -> None:
    """Traced code reaches log_event (this module's) in place of the C
    function; an Event built outside the graph cannot be traced. Set up when
    Dynamo is first imported (importing it costs seconds)."""
    global _log_event_object
    _log_event_object = torch.compiler.disable(
        _log_event_object,
        reason="log_event(Event) cannot be traced: an Event is built outside "
        "the graph. In compiled or exported code use log_event(name, data).",
    )
    torch.compiler.substitute_in_graph(_C.log_event)(log_event)


_internals.after_dynamo_import(_trace_log_event)
# Eager calls of every form but log_event(Event) arrive here through the C function.
_C._set_log_event_other_forms(log_event)
