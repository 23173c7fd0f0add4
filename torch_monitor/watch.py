"""``watch(model)``: every layer's gradients, weights, updates and activations
as windowed statistics (docs/watch.md).

The work is in C++: ``torch.classes.torch_monitor.Watch`` (the recorder:
keys, a buffer of statistics slots on the model's device, windows, events)
and one op, ``torch.ops.torch_monitor.watch_observe_``, which every hook
below calls with the tensors it observes; the keys are chosen in C++ too
(``Watch.plan``, as for a C++ Watch). This module only lists the model's
parameters and modules and attaches the hooks: module forward hooks (traced into
``torch.compile`` graphs, where the op is one node that mutates the slots),
tensor hooks and the optimizer's step hooks.
"""

import datetime
import numbers
import re
import sys
import warnings as _warnings
import weakref
from typing import Callable, Iterable, List, Literal, Optional, Pattern, Sequence, Union, get_args

import torch

from . import _C, _internals, _spellings
from ._C import Event
from ._faces import strict_bool

__all__ = ["watch", "Watch", "WatchKind", "WATCH_EVENT", "NONFINITE_EVENT"]

#: Name of the event a watch logs when a window closes.
WATCH_EVENT = "torch_monitor.Watch"
#: Name of the event naming the keys that saw NaN or inf in that window.
NONFINITE_EVENT = "torch_monitor.NonFinite"

#: What a watch observes of a parameter ("grad", "weight", "update") or of a
#: module ("output", "output_grad"): the names the C++ watch takes
#: (``watch::kindName``; test_watch.py compares them), as a type that mypy
#: checks ``what=`` against.
WatchKind = Literal["grad", "weight", "update", "output", "output_grad"]
_KINDS = get_args(WatchKind)

#: The models watched now, each with its watch: a second watch of one would
#: log every statistic twice. Weak keys: a model's copy is another object,
#: and not watched.
_WATCHED: "weakref.WeakKeyDictionary[torch.nn.Module, Watch]" = weakref.WeakKeyDictionary()
_observe = torch.ops.torch_monitor.watch_observe_.default

def _observed_tensor(output):
    """The tensor a module's output stands for: the output itself, or the
    first element of a tuple or list (nn.LSTM, nn.MultiheadAttention), when
    it is a floating-point or complex tensor. The rule of C++'s watch::observedOutput
    (watch/plan.h), written here too because a hook that torch.compile
    traces cannot call into C++ (each world's test holds it to the same
    models)."""
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    if isinstance(output, torch.Tensor) and (output.is_floating_point() or output.is_complex()):
        return output
    return None


class _CopiedHook:
    """What a watch's hook becomes in a copy of the model (``copy.deepcopy``,
    ``pickle``, ``torch.save``): nothing. The copy (an EMA or teacher
    model, a checkpoint) is not watched, so nothing it computes reaches the
    original's windows; ``watch()`` the copy to watch it too."""

    def __call__(self, *args: object) -> None:
        return None

    @property
    def __name__(self) -> str:  # what torch.jit.script asks of a hook first
        raise RuntimeError(
            "torch.jit.script cannot compile the hooks of a model copied from a watched "
            "model (torch_monitor.watch's hooks are Python); script the model before "
            "watching it"
        )


class _WatchHook:
    """A hook of a watch. A copy of the model gets a _CopiedHook in its
    place, and torch.jit.script a clear error."""

    def __deepcopy__(self, memo: dict) -> _CopiedHook:
        return _CopiedHook()

    def __reduce__(self) -> tuple:
        return (_CopiedHook, ())

    @property
    def __name__(self) -> str:  # what torch.jit.script asks of a hook first
        raise RuntimeError(
            "torch.jit.script cannot compile torch_monitor.watch's hooks (they are "
            "Python): script the model first, then watch the scripted module, "
            "watch(torch.jit.script(model), optimizer) (its gradients, weights and "
            "updates; a scripted module takes no Python forward hooks, so not its "
            "outputs), or remove() the watch before scripting"
        )


class _OutputHook(_WatchHook):
    """Forward hook of one module: observes its output and, in backward,
    the gradient flowing into it. Traced by torch.compile into the graph."""

    def __init__(self, watch: "Watch", out_key: int, grad_key: int):
        self.watch = watch
        self.out_key = out_key
        self.grad_key = grad_key
        # Where Dynamo mis-orders hooks that share a tensor (torch 2.11:
        # _internals.dynamo_reorders_hook_inputs), the gradient hook is
        # registered outside the graph: one graph break, right statistics.
        self.register = _register_hook
        if grad_key >= 0 and _internals.dynamo_reorders_hook_inputs():
            self.register = torch.compiler.disable(_register_hook)

    def __call__(self, module, args, output):
        y = _observed_tensor(output)
        if y is None:
            return None
        w = self.watch
        if self.out_key >= 0:
            _observe(w._slots, w._gate, [y], [self.out_key], [], w._id)
        if self.grad_key >= 0 and y.requires_grad:
            self.register(y, _GradHook(w, self.grad_key))
        return None


def _register_hook(tensor: torch.Tensor, hook: "_GradHook") -> None:
    tensor.register_hook(hook)


class _GradHook(_WatchHook):
    """Tensor hook: observes the gradient it is called with."""

    def __init__(self, watch: "Watch", key: int):
        self.watch = watch
        self.key = key

    def __call__(self, grad):
        w = self.watch
        _observe(w._slots, w._gate, [grad], [self.key], [], w._id)
        return None


class _ShardGradHook(_GradHook):
    """Post-accumulate-grad hook of a sharded parameter (FSDP2 assigns its
    reduced gradient, which no tensor hook sees): observes this rank's shard."""

    def __call__(self, parameter):
        with torch.no_grad():
            return super().__call__(parameter.grad.to_local())


def _is_sharded(p) -> bool:
    """Whether ``p`` is a DTensor (FSDP2, tensor parallel), whose values are
    its local shard. No DTensor exists before torch.distributed.tensor is
    imported, so nothing is imported here."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(p, dtensor.DTensor)


class Watch:
    """What ``watch()`` returns: the hooks it added and the recorder that
    windows their statistics. ``remove()`` (or leaving a ``with`` block)
    logs the open window and removes every hook."""

    def __init__(self, recorder: "_spellings.Watch", keys: List[str], model: torch.nn.Module):
        self._recorder = recorder
        self._model = weakref.ref(model)
        self._keys = keys
        self._id = recorder.id()
        self._slots = recorder.slots()
        self._gate = recorder.gate()
        self._handles: list = []
        self._removed = False
        # (local view, DTensor parameter): the optimizer hooks observe a
        # sharded parameter's local shard, whose gradient (a DTensor's
        # too) reaches the view for the length of each step.
        self._shards: list = []

    @property
    def keys(self) -> List[str]:
        """``"<path>.<kind>"`` of every watched tensor, e.g. ``"fc1.weight.grad"``."""
        return list(self._keys)

    def close(self) -> None:
        """Logs the open window now (nothing when it saw nothing); the watch
        goes on."""
        if not self._removed:
            self._recorder.close()

    def remove(self) -> None:
        """Logs the open window and removes every hook the watch added.
        Idempotent."""
        if self._removed:
            return
        self._removed = True
        model = self._model()
        if model is not None and _WATCHED.get(model) is self:
            del _WATCHED[model]
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._recorder.remove()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self._removed else "watching"
        return f"<torch_monitor.Watch {len(self._keys)} keys, {state}>"

    # The optimizer's step hooks (eager Python: optimizer steps are not
    # compiled with the model).

    def _check_what_is_watched(self, optimizer) -> None:
        """Warns once of parameters the watch does not follow: added to the
        optimizer after watch() (add_param_group), or replaced in the model
        (the watch observes the tensors watch() was given). Each step checks
        the optimizer's size (a few len() calls); every 100th step checks the
        watched parameters are still the model's."""
        model = self._model()
        if model is None:
            return
        # An optimizer holds each parameter once: a new size is a change.
        if sum(len(group["params"]) for group in optimizer.param_groups) != len(self._optimized_ids):
            now = {id(p): p for group in optimizer.param_groups for p in group["params"]}
            paths = {id(p): path for path, p in model.named_parameters()}
            added = [paths.get(i, "a tensor that is not the model's") for i in now if i not in self._optimized_ids]
            self._optimized_ids = set(now)  # each warned of once
            if added:
                _warnings.warn(
                    f"torch_monitor.watch: {', '.join(map(repr, added))} joined the optimizer after "
                    "watch() and are not watched; remove() the watch and call watch() again to "
                    "watch them", stacklevel=3)
        self._steps_checked += 1
        if self._steps_checked % 100 == 1:
            # Looked up from the model: a module swapped in (model[2] = ...)
            # replaces the parameters under its path.
            replaced = [path for path, owner, name, p in self._parameter_places
                        if getattr(_submodule(model, owner), name, None) is not p]
            if replaced:
                self._parameter_places = [place for place in self._parameter_places
                                          if place[0] not in replaced]  # once each
                _warnings.warn(
                    f"torch_monitor.watch: {', '.join(map(repr, replaced))} were replaced in the "
                    "model after watch(); the watch observes the tensors it was given, no longer "
                    "the model's: remove() the watch and call watch() again", stacklevel=3)
            unfrozen = [path for path, p in self._frozen if p.requires_grad]
            if unfrozen:
                self._frozen = [(path, p) for path, p in self._frozen if not p.requires_grad]
                _warnings.warn(
                    f"torch_monitor.watch: {', '.join(map(repr, unfrozen))} were frozen at watch() "
                    "and are trainable now; they are not watched (nor in total.grad): remove() the "
                    "watch and call watch() again to watch them", stacklevel=3)

    def _before_step(self, optimizer, args, kwargs) -> None:
        self._check_what_is_watched(optimizer)
        # The gradients the step uses are those it leaves when it computes
        # them (a closure: LBFGS, Lightning's automatic optimization) or
        # unscales them (GradScaler's fused path sets grad_scale for the
        # step's kernel, which writes the unscaled gradients back).
        closure = args[0] if args else kwargs.get("closure")
        gradients_after = closure is not None or getattr(optimizer, "grad_scale", None) is not None
        if not gradients_after:
            self._share_gradients()
        self._recorder.before_step(gradients_after)
        self._gradients_after = gradients_after

    def _after_step(self, optimizer, args, kwargs) -> None:
        # GradScaler's fused path calls step() with found_inf set for the
        # kernel to skip an overflowed step; its other path does not call
        # step() then. Read only on the CPU: a device read would wait for it.
        found_inf = getattr(optimizer, "found_inf", None)
        skipped = isinstance(found_inf, torch.Tensor) and found_inf.device.type == "cpu" and bool(found_inf)
        if self._gradients_after and not skipped:
            self._share_gradients()
        self._recorder.after_step(skipped)
        for local, _ in self._shards:
            local.grad = None  # the gradient's memory is the optimizer's to free

    def _share_gradients(self) -> None:
        """The local shard of each sharded parameter's gradient, where the
        recorder reads it."""
        if self._shards:
            with torch.no_grad():
                for local, p in self._shards:
                    local.grad = None if p.grad is None else p.grad.to_local()


def _submodule(model, path):
    """The module at ``path`` in ``model`` now, or None."""
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def _pattern(value, name) -> Optional[str]:
    """include/exclude as C++ reads them: the pattern's text."""
    if value is None:
        return None
    if isinstance(value, re.Pattern):
        if value.flags & ~re.UNICODE:
            raise ValueError(
                f"torch_monitor.watch: {name} is read by its text, which drops the pattern's flags "
                f"({re.RegexFlag(value.flags & ~re.UNICODE)!r}): write it to match without them "
                "(e.g. [Bb]ias for re.IGNORECASE)")
        value = value.pattern
    if not isinstance(value, str):
        raise TypeError(f"torch_monitor.watch: {name} must be a regular expression (str), got {type(value).__name__}")
    return value


def _positive_int(value, name) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"torch_monitor.watch: {name} must be an int >= 1, got {value!r}")
    return int(value)


def _window(window_steps, window_size):
    if (window_steps is None) == (window_size is None):
        raise ValueError(
            "torch_monitor.watch: give exactly one window: window_steps=N (training steps, "
            "like Stat(window_steps=N)) or window_size=timedelta or seconds; got "
            + ("both" if window_steps is not None else "neither")
        )
    if window_steps is not None:
        return _positive_int(window_steps, "window_steps"), 0.0
    if isinstance(window_size, datetime.timedelta):
        seconds = window_size.total_seconds()
    elif isinstance(window_size, numbers.Real) and not isinstance(window_size, bool):
        seconds = float(window_size)
    else:
        raise TypeError(
            f"torch_monitor.watch: window_size must be a datetime.timedelta or a number of seconds, got {type(window_size).__name__}"
        )
    if not seconds >= 0.001:
        raise ValueError(f"torch_monitor.watch: window_size must be at least 1 ms, got {window_size!r}")
    return 0, seconds


def watch(
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    *,
    what: Union[WatchKind, Sequence[WatchKind]] = ("grad",),
    window_steps: Optional[int] = None,
    window_size: Union[None, float, datetime.timedelta] = None,
    close_on_time: bool = False,
    every: int = 1,
    include: Union[None, str, Pattern] = None,
    exclude: Union[None, str, Pattern] = None,
    histograms_every: Optional[int] = None,
    writer: Optional[_spellings.TensorBoardWriter] = None,
    memory: bool = False,
    sync_ranks: bool = False,
    on_nonfinite: Union[None, Literal["warn", "raise"], Callable[[Event], object]] = None,
) -> Watch:
    """Watches a model's tensors as windowed statistics, without waiting for
    the device (docs/watch.md).

    Every window (``window_steps`` training steps, or ``window_size`` of
    time: exactly one) logs one ``"torch_monitor.Watch"`` event, at the
    training step it closed at, with ``"<path>.<kind>.<statistic>"`` numbers
    (``rms``, ``mean``, ``min``, ``max``, ``abs_max``, ``norm``,
    ``norm_max``, ``nonfinite``, ``zero_frac``; ``ratio`` for updates), e.g.
    ``"fc1.weight.grad.rms"``, and the whole model's ``"total.grad.*"`` and
    ``"total.update.*"`` (a step's gradients or updates as one: the total
    norm, ``norm_max``, ``ratio``). NaN or inf logs
    ``"torch_monitor.NonFinite"``, mapping each such ``"<path>.<kind>"`` to
    the first step it did, once per window, at the step change after that
    step (on a GPU: once the device has copied the counts, never waiting
    for it). Every sink takes them (TensorBoard, JSON Lines, Prometheus).

    Args:
        model: the module; parameters by ``named_parameters()`` paths, module
            outputs by ``named_modules()`` paths (not the root's).
        optimizer: needed for ``"weight"`` and ``"update"``; with it,
            ``"grad"`` is the gradient the step uses (else each gradient a
            backward accumulates into ``.grad``).
        what: any of ``"grad"``, ``"weight"``, ``"update"``, ``"output"``,
            ``"output_grad"``; by default gradients only, the kind cheap
            enough to leave on (an update copies the weights before each
            step: docs/watch.md, "Cost").
        window_steps / window_size: the window (see ``Stat``).
        close_on_time: with ``window_size``, close each window when it
            ends, on the window timer's thread, even if no step comes (a
            stalled run still logs); as ``Stat(close_on_time=True)``.
        every: observe on training steps divisible by ``every`` only
            (decided on the device: compiled graphs do not recompile).
        include / exclude: regular expressions searched in the parameter
            and module paths, read by C++ (ECMAScript syntax, as a C++
            Watch reads them: Python-only syntax such as ``(?P<name>...)``
            is refused); each must match something.
        histograms_every, writer: a histogram per watched tensor, tag
            ``"<path>.<kind>"``, every ``histograms_every`` steps, written by
            ``writer`` (a ``torch_monitor.TensorBoardWriter``).
        memory: add ``cuda.memory.allocated``, ``.reserved``,
            ``.peak_allocated``, ``.alloc_retries``, ``.ooms`` to each event
            (the CUDA allocator's counters; absent without CUDA).
        sync_ranks: merge every rank's windows on rank 0 of
            torch.distributed's default group (docs/distributed.md).
        on_nonfinite: after each ``"torch_monitor.NonFinite"`` event,
            ``"warn"`` warns (a RuntimeWarning) and ``"raise"`` raises ``FloatingPointError``
            naming the keys and their first steps (from ``set_step()``, or
            the optimizer step when no step is set); a callable is called
            with the event (what it raises propagates the same way).

    The training step is ``torch_monitor.set_step``'s; a program that sets
    none steps by the optimizer's steps. Returns a :class:`Watch`: call
    ``remove()`` or use it as a context manager.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"torch_monitor.watch: model must be a torch.nn.Module, got {type(model).__name__}")
    # watch(torch.compile(model)) watches the model: its own paths (not
    # "_orig_mod.<path>") and its submodules' outputs, not the wrapper's one
    # output; the compiled wrapper runs (and traces) the model's hooks.
    model = _internals.uncompiled_module(model)
    if model in _WATCHED:
        raise ValueError(
            f"torch_monitor.watch: this model is already watched ({_WATCHED[model]!r}); remove() that watch "
            "first (or leave its with-block): two watches of one model would log every "
            "statistic twice"
        )
    what = [what] if isinstance(what, str) else list(what) if isinstance(what, Iterable) else None
    if what is None or not all(isinstance(kind, str) for kind in what):
        raise TypeError(f"torch_monitor.watch: what must be a kind or a sequence of kinds among {_KINDS}, got {what!r}")
    if isinstance(model, torch.jit.ScriptModule) and {"output", "output_grad"} & set(what):
        raise ValueError(
            'torch_monitor.watch: "output" and "output_grad" are observed by forward hooks, which a '
            "ScriptModule does not run; watch the eager model (torch.compile keeps the "
            'hooks), or watch "grad", "weight" and "update" of the scripted one'
        )
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"torch_monitor.watch: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    for kind in ("weight", "update"):
        if kind in what and optimizer is None:
            raise ValueError(
                f'torch_monitor.watch: "{kind}" is observed around optimizer steps: pass the '
                f"optimizer, watch(model, optimizer, what={tuple(what)!r})"
            )
    window_steps, window_seconds = _window(window_steps, window_size)
    every = _positive_int(every, "every")
    include_re = _pattern(include, "include")
    exclude_re = _pattern(exclude, "exclude")
    if histograms_every is not None:
        histograms_every = _positive_int(histograms_every, "histograms_every")
        if writer is None:
            raise ValueError(
                "torch_monitor.watch: histograms_every needs writer=, a torch_monitor.TensorBoardWriter to write them to"
            )
        if not isinstance(writer, torch.ScriptObject):
            raise TypeError(
                "torch_monitor.watch: writer must be a torch_monitor.TensorBoardWriter (histograms go to its "
                f"event file), got {type(writer).__name__}"
            )
    elif writer is not None:
        raise ValueError(
            "torch_monitor.watch: writer= is where histograms go: give histograms_every=k too "
            "(the statistics reach every registered handler without it)"
        )
    strict_bool(memory, "torch_monitor.watch: memory")
    strict_bool(close_on_time, "torch_monitor.watch: close_on_time")
    if not (on_nonfinite is None or isinstance(on_nonfinite, str) or callable(on_nonfinite)):
        raise TypeError(
            'torch_monitor.watch: on_nonfinite must be None, "warn", "raise" or a callable taking '
            f"the NonFinite event, got {type(on_nonfinite).__name__}"
        )
    if sync_ranks is not False:
        if sync_ranks is not True:
            raise TypeError(
                f"torch_monitor.watch: sync_ranks must be a bool (True: torch.distributed's default group), got {type(sync_ranks).__name__}"
            )
        from ._rank_sync import resolve

        # the default group; ValueError when none is initialised
        resolve(True, prefix="torch_monitor.watch: ", before="calling watch()")

    parameters = list(model.named_parameters())  # tied weights once
    modules = [(path, m) for path, m in model.named_modules() if path]
    in_optimizer = None
    if optimizer is not None:
        in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    # The selection and the keys, and what each observes: C++'s choice, the
    # same as a C++ Watch's (watch/plan.h).
    # Positional: the static method has no argument names on torch 2.11.
    key_paths, key_kinds, targets = torch.classes.torch_monitor.Watch.plan(
        what,
        [path for path, _ in parameters],  # parameters
        [p.requires_grad for _, p in parameters],  # trainable
        [in_optimizer is None or id(p) in in_optimizer for _, p in parameters],  # stepped
        [path for path, _ in modules],  # modules
        include_re,
        exclude_re,
    )
    by_kind: dict = {}
    for key, (kind, target) in enumerate(zip(key_kinds, targets)):
        if target < 0:
            continue  # total.grad, total.update: the recorder observes them
        objects = modules if kind.startswith("output") else parameters
        by_kind.setdefault(kind, []).append((key, objects[target][0], objects[target][1]))

    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    if device.type == "meta":
        raise ValueError(
            "torch_monitor.watch: the model is on the meta device (its parameters hold no values yet, and the "
            "watch keeps its statistics on the model's device): call watch() after materialising "
            "it, model.to_empty(device=...) and its initialisation"
        )
    recorder = _spellings.Watch(
        key_paths,
        key_kinds,
        window_steps,
        window_seconds,
        every,
        histograms_every or 0,
        writer,
        memory,
        bool(sync_ranks),
        str(device),
        on_nonfinite if isinstance(on_nonfinite, str) else "log",
        close_on_time,
    )
    if callable(on_nonfinite):
        _C._set_watch_nonfinite_handler(recorder, on_nonfinite)
    w = Watch(recorder, [f"{p}.{k}" for p, k in zip(key_paths, key_kinds)], model)
    handles = w._handles

    # Parameters: around the optimizer's steps (its step hooks, observed in
    # C++ as a C++ Watch's step() does), or by tensor hooks without one.
    if "grad" in by_kind and optimizer is None:
        for key, _, p in by_kind["grad"]:
            if _is_sharded(p):
                handles.append(p.register_post_accumulate_grad_hook(_ShardGradHook(w, key)))
            else:
                handles.append(p.register_hook(_GradHook(w, key)))
    if optimizer is not None:
        stepped = [(k, p) for kind in ("grad", "weight", "update") for k, _, p in by_kind.get(kind, ())]
        locals_ = {}  # one view per sharded parameter
        with torch.no_grad():
            for _, p in stepped:
                if _is_sharded(p) and id(p) not in locals_:
                    locals_[id(p)] = p.to_local()
                    w._shards.append((locals_[id(p)], p))
        recorder.watch_steps([k for k, _ in stepped], [locals_.get(id(p), p) for _, p in stepped])
        w._optimized_ids = in_optimizer
        watched = {id(p) for _, p in stepped}
        w._parameter_places = []  # a scripted module's cannot be replaced from Python
        w._frozen = []
        if not isinstance(model, torch.jit.ScriptModule):
            w._parameter_places = [(path, path.rpartition(".")[0], path.rpartition(".")[2], p)
                                   for path, p in parameters if id(p) in watched]
            # Frozen now, in the optimizer: trainable later (progressive
            # unfreezing) they would go unwatched.
            w._frozen = [(path, p) for path, p in parameters
                         if not p.requires_grad and id(p) in in_optimizer and id(p) not in watched]
        w._steps_checked = 0
        w._gradients_after = False
        handles.append(optimizer.register_step_pre_hook(w._before_step))
        handles.append(optimizer.register_step_post_hook(w._after_step))

    # Module outputs: one forward hook per module.
    out_keys = {path: key for key, path, _ in by_kind.get("output", ())}
    grad_keys = {path: key for key, path, _ in by_kind.get("output_grad", ())}
    for path, module in modules:
        if path in out_keys or path in grad_keys:
            hook = _OutputHook(w, out_keys.get(path, -1), grad_keys.get(path, -1))
            handles.append(module.register_forward_hook(hook))

    _WATCHED[model] = w
    return w
