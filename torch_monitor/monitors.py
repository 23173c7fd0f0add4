"""Monitors: module hooks that feed reducers (inferno-compatible).

``DifferenceMonitor`` has the interface of ``inferno.observe.DifferenceMonitor``
(inferno-ai 0.0.5) and records, at every forward call of a module, how one of
its attributes changed across ``forward()``. The work happens in C++:

* The monitor's state is a ``torch.classes.torch_monitor.DifferenceMonitor``
  object (``torch_monitor._C.DifferenceMonitorCore``) holding the C++ reducer.
  ``register()`` stores it on the monitored module as the attribute
  ``monitor.key``, so ``torch.jit.script`` carries it into the scripted module
  and ``torch.jit.save`` saves it with the model.
* The hooks are small generated Python functions, typed after the module's
  ``forward()``, which TorchScript compiles into a scripted module and which
  torch.compile / torch.export trace (calls of the object's TorchScript
  methods, recorded in the graph). In eager mode they make a single call into
  C++, which reads ``module.training``, resolves the attribute path and runs
  the monitor.
"""

import copy
import inspect
import itertools
import typing
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from . import _C, _internals
from ._checks import strict_bool

__all__ = ["DifferenceMonitor", "MonitorConstructor"]

#: ``constructor(attr, module) -> monitor``, as returned by ``partialconstructor``.
MonitorConstructor = Callable[[str, nn.Module], "DifferenceMonitor"]

_ids = itertools.count()
_UNKNOWN = object()  # a type that cannot be told


# ------------------------------------------------------------ hook sources


def _path_expression(path: str) -> str:
    """TorchScript source reading ``path`` from ``self``.

    The C++ parser (``nn::AttributePath``, shared with C++ modules and the
    eager hooks) splits the path and tells each part's kind."""
    expr = "self"
    for kind, part in _C._attribute_path_parts(path):
        if kind == "attribute":
            expr += f".{part}"
        elif kind == "index":
            expr += f"[{int(part)}]"  # ModuleList / Sequential
        else:
            expr += f"[{part!r}]"  # ModuleDict key
    return expr


def _annotation_of_value(value):
    """A typing annotation matching ``value`` as TorchScript would type it."""
    if isinstance(value, torch.Tensor):
        return torch.Tensor
    if value is None:
        return type(None)
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind
    if type(value) is tuple:
        elements = tuple(_annotation_of_value(v) for v in value)
        if any(e is _UNKNOWN for e in elements):
            return _UNKNOWN
        return Tuple[elements] if elements else Tuple[()]
    if type(value) is list and value:
        elements = {_annotation_of_value(v) for v in value}
        if len(elements) == 1 and _UNKNOWN not in elements:
            return List[elements.pop()]
    if type(value) is dict and value:
        keys = {_annotation_of_value(k) for k in value}
        values = {_annotation_of_value(v) for v in value.values()}
        if len(keys) == 1 and len(values) == 1 and _UNKNOWN not in keys | values:
            return Dict[keys.pop(), values.pop()]
    return _UNKNOWN


def _forward_types(module: nn.Module):
    """(input, output) annotations of ``module.forward`` as hooks need them.

    TorchScript checks a pre-hook's ``input`` against ``Tuple[<forward's
    argument types>]`` and a post-hook's ``output`` against forward's return
    type. Unannotated arguments are Tensors (TorchScript's default); an
    unannotated return gives ``_UNKNOWN`` (TorchScript infers it from the body).
    """
    forward = type(module).forward
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return Tuple[()], _UNKNOWN
    try:
        hints = typing.get_type_hints(forward)
    except Exception:  # unresolvable string annotations: use what is there
        hints = {}
    types = []
    for parameter in list(signature.parameters.values())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            # Such a forward cannot be scripted; the annotation is moot.
            return Tuple[()], _UNKNOWN
        annotation = hints.get(parameter.name, parameter.annotation)
        types.append(torch.Tensor if annotation is parameter.empty else annotation)
    output = hints.get("return", signature.return_annotation)
    if output is signature.empty:
        output = _UNKNOWN
    elif output is None:
        output = type(None)
    return (Tuple[tuple(types)] if types else Tuple[()]), output


# What the hooks' branches test. Module globals as well as the hooks' own:
# Dynamo's strict export resolves a hook's globals in this module. Bound once,
# since the eager hooks call both at every forward (torch.compiler.is_compiling
# through its attributes costs ~140 ns a call more).
_is_scripting = torch.jit.is_scripting
_is_compiling = torch.compiler.is_compiling

_HOOK_SOURCE = '''\
def {name}_before(self, input: _Input) -> None:
    if _is_scripting():
        self.{key}.before({value}, self.training)
    elif _is_compiling():
        self.{key}.before({value}, self.training)
    else:
        _before(self)


def {name}_after(self, input: _Input, output: _Output) -> _Output:
    if _is_scripting():
        self.{key}.after({value}, self.training)
    elif _is_compiling():
        self.{key}.after({value}, self.training)
    else:
        _after(self, output)
    return output
'''


def _make_hooks(key: str, path: str, module: nn.Module):
    """The (pre, post) forward hooks of the monitor stored as ``module.<key>``.

    Plain Python functions with real source (registered in ``linecache``) so
    that ``torch.jit.script`` compiles them with the module. Scripted, and
    while torch.compile or torch.export traces them, they call the monitor
    object's TorchScript methods (two branches with the same line: TorchScript
    skips the eager branch only under a bare ``is_scripting()`` call); in
    eager mode they call the C functions of the binding instead. The post-hook returns its ``output``: TorchScript types a
    hook's ``output`` as the previous hook's return type, so returning None
    would break the next post-hook on the module.
    """
    before, after = _C._difference_monitor_hooks(key)
    input_type, output_type = _forward_types(module)
    namespace = {
        "__name__": __name__,
        "_Input": input_type,
        "_Output": torch.Tensor if output_type is _UNKNOWN else output_type,
        "_is_scripting": _is_scripting,
        "_is_compiling": _is_compiling,
        "_before": before,
        "_after": after,
    }
    if output_type is _UNKNOWN:
        # forward() has no return annotation: type `output` after the first
        # value seen (TorchScript would infer the same from the body in the
        # usual cases; annotate forward() where it does not).
        def _after_first(module, output, _namespace=namespace, _after=after):
            annotation = _annotation_of_value(output)
            if annotation is not _UNKNOWN:
                _namespace["_Output"] = annotation
            _namespace["_after"] = _after
            return _after(module, output)

        namespace["_after"] = _after_first
    source = _HOOK_SOURCE.format(name=key, key=key, value=_path_expression(path))
    filename = f"<torch_monitor DifferenceMonitor hooks {key} #{next(_ids)}>"
    _internals.add_source_to_linecache(filename, source)
    exec(compile(source, filename, "exec"), namespace)
    pre, post = namespace[f"{key}_before"], namespace[f"{key}_after"]
    weakref.finalize(post, _internals.remove_source_from_linecache, filename)
    return pre, post


def _detach(pre_handle, post_handle, module_ref, key):
    """Removes a monitor's hooks and its state attribute from the module."""
    pre_handle.remove()
    post_handle.remove()
    module = module_ref()
    if module is not None:
        module.__dict__.pop(key, None)


# ------------------------------------------------- default filter_ and map_


def _default_filter(post: Any, pre: Any) -> bool:
    """DifferenceMonitor's default ``filter_``: rejects only two Nones."""
    return not (post is None and pre is None)


class DefaultMap:
    """DifferenceMonitor's default ``map_`` as a callable: ``op(post, pre)``
    (``op`` None: ``post - pre``) element-wise over tuples (zip) or once, a
    None side counting as zeros. Computed by the C++ monitor's own default."""

    def __init__(self, op: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None):
        self.op = op

    def __call__(self, post: Any, pre: Any) -> Tuple[torch.Tensor, ...]:
        return _C._difference_default_map(post, pre, self.op)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DefaultMap) and other.op is self.op

    def __hash__(self) -> int:
        return hash((DefaultMap, id(self.op)))

    def __repr__(self) -> str:
        return f"DefaultMap(op={self.op!r})"


# ----------------------------------------------------------------- monitor


def _core_flag(core_name: str, name: str, doc: str) -> property:
    """A bool setting of the monitor kept on its core (the C++ monitor reads
    it at every call), set as ``name`` only to a real bool."""

    def get(self) -> bool:
        return getattr(self._core, core_name)

    def set(self, value: bool) -> None:
        setattr(self._core, core_name, strict_bool(value, name))

    return property(get, set, doc=doc)


class DifferenceMonitor(nn.Module):
    r"""Records how an attribute of a module changes across each forward call.

    A forward pre-hook captures ``module.<attr>`` before ``forward()``, a
    forward hook reads it after and feeds the reducer with
    ``map_(after, before)``. Interface of inferno's ``DifferenceMonitor``.

    Args:
        reducer: a torch_monitor reducer (``torch_monitor.PassthroughReducer``
            and friends, or its ``torch.classes.torch_monitor.Reducer``).
        attr (str): attribute path with dots (``"block.state"``), resolved at
            every forward call through submodules, parameters, buffers and
            plain attributes. The hooks go on ``module`` itself.
        module (nn.Module | None): module to register to now.
        train_update (bool): record while ``module.training`` is True.
        eval_update (bool): record while ``module.training`` is False.
        prepend (bool): put both hooks before the module's other hooks.
        filter\_ (callable | None): ``filter_(after, before) -> bool``; default
            rejects only a pair of two Nones.
        map\_ (callable | None): ``map_(after, before) -> tuple of tensors``, the
            reducer's inputs; default applies ``op_`` element-wise over tuples
            (zip: the shorter wins) or once, a None side counting as zeros
            shaped like the other.
        op\_ (callable | None): ``op_(after, before) -> Tensor``; default
            ``after - before``. Used only without ``map_``.
        keep_graph (bool): keep the autograd graph of each recorded
            difference (off by default: the history is detached).

    Unlike inferno 0.0.5, the value before ``forward()`` is a copy, so
    in-place updates such as BatchNorm's ``running_mean`` are measured, and
    one None side counts as zeros instead of raising. The history is
    detached from autograd: inferno keeps every step's graph alive through
    it, so a monitor on a parameter grows memory with every optimizer step.
    ``keep_graph=True`` keeps the graphs (differentiable differences, at that
    cost). The hooks may run on several threads at once (a scripted model
    served from a thread pool): each forward call pairs its own values. Python ``filter_``/``map_``/``op_`` work in eager and scripted
    modules in this process, but a module holding such a monitor cannot be
    saved with ``torch.jit.save``.

    A module must be registered before ``torch.jit.script``: the scripted
    module then runs the hooks, and keeps them after ``torch.jit.save`` /
    ``torch.jit.load`` (``import torch_monitor`` first, or load the library;
    in C++ call ``module(inputs)``: ``module.forward(inputs)`` skips the
    module's own hooks). The state is the module attribute ``key``:
    ``getattr(loaded, key).peek()``. TorchScript's rules for hooks apply:

    * a scripted module called directly must get every argument of
      ``forward()`` (hooks are typed with all of them; defaults are not filled
      in), as with any scripted hook;
    * ``forward()`` should have a return annotation, or be called once in
      eager mode before scripting, so the post-hook's ``output`` gets its type;
    * post-hooks registered before this one must return their output
      (TorchScript types a hook's ``output`` by the previous hook's return).

    Deleting the monitor (garbage collection) removes its hooks, so keep a
    reference for as long as it should record.
    """

    def __init__(
        self,
        reducer,
        attr: str,
        module: Optional[nn.Module] = None,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Optional[Callable[[Any, Any], bool]] = None,
        map_: Optional[Callable[[Any, Any], Tuple[torch.Tensor, ...]]] = None,
        op_: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
        keep_graph: bool = False,
    ):
        nn.Module.__init__(self)
        if not isinstance(attr, str):
            raise TypeError(f"attr must be a str, got {type(attr).__name__}")
        # The defaults read back from a monitor are the defaults again (so a
        # monitor built from another's filter_/map_ can still be saved).
        if filter_ is _default_filter:
            filter_ = None
        if isinstance(map_, DefaultMap):
            map_, op_ = None, (map_.op if op_ is None else op_)
        core = _C.DifferenceMonitorCore(
            reducer,
            attr,
            strict_bool(train_update, "train_update"),
            strict_bool(eval_update, "eval_update"),
            filter_,
            map_,
            op_,
            strict_bool(keep_graph, "keep_graph"),
        )
        self.reducer_ = reducer
        self._core = core
        self._prepend = strict_bool(prepend, "prepend")
        self._key = f"_torch_monitor_difference_{next(_ids)}"
        self._handles = None
        self._observed = None
        self._finalizer = None
        if module is not None:
            self.register(module)

    @classmethod
    def partialconstructor(
        cls,
        reducer,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Optional[Callable[[Any, Any], bool]] = None,
        map_: Optional[Callable[[Any, Any], Tuple[torch.Tensor, ...]]] = None,
        op_: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
        keep_graph: bool = False,
    ) -> MonitorConstructor:
        """``constructor(attr, module)`` building registered monitors with these
        arguments (all of them: inferno 0.0.5 drops ``op_`` here). Monitors
        built by one constructor share ``reducer``, as in inferno."""

        def constructor(attr: str, module: nn.Module) -> "DifferenceMonitor":
            return cls(
                reducer=reducer,
                attr=attr,
                module=module,
                train_update=train_update,
                eval_update=eval_update,
                prepend=prepend,
                filter_=filter_,
                map_=map_,
                op_=op_,
                keep_graph=keep_graph,
            )

        return constructor

    # ------------------------------------------------------------- reading

    @property
    def reducer(self):
        """The reducer fed by this monitor."""
        return self.reducer_

    @property
    def latest(self) -> Optional[torch.Tensor]:
        """The reducer's newest state (``peek()``)."""
        latest = getattr(type(self.reducer_), "latest", None)
        return self.reducer_.latest if latest is not None else self.reducer_.peek()

    def peek(self, *args, **kwargs) -> Optional[torch.Tensor]:
        """The reducer's newest state; None before the first record."""
        return self.reducer_.peek(*args, **kwargs)

    def view(self, time, tolerance: float = 1e-7) -> Optional[torch.Tensor]:
        """The reducer's state ``time`` before the newest one."""
        return self.reducer_.view(time, tolerance)

    def dump(self, *args, **kwargs) -> Optional[torch.Tensor]:
        """Every state the reducer keeps, newest first."""
        return self.reducer_.dump(*args, **kwargs)

    def clear(self, **kwargs) -> None:
        """Forgets the value captured before forward() and clears the reducer
        (``kwargs`` go to the reducer's ``clear``, e.g. ``keepshape=True``)."""
        self._core.forget_all()
        return self.reducer_.clear(**kwargs)

    # ------------------------------------------------------- configuration

    @property
    def attr(self) -> str:
        """The monitored attribute path."""
        return self._core.attr

    @property
    def key(self) -> str:
        """Name of the attribute holding this monitor's state on the module."""
        return self._key

    @property
    def core(self) -> "_C.DifferenceMonitorCore":
        """The ``torch.classes.torch_monitor.DifferenceMonitor`` object."""
        return self._core

    @property
    def prepend(self) -> bool:
        return self._prepend

    @property
    def filter_(self):
        """The filter: the one given, else the default (a callable, as in
        inferno)."""
        return _default_filter if self._core.filter_ is None else self._core.filter_

    @property
    def map_(self):
        """The map: the one given, else the default using ``op_`` (a
        callable, as in inferno)."""
        return DefaultMap(self._core.op_) if self._core.map_ is None else self._core.map_

    @property
    def op_(self):
        """The custom op, or None for the default (subtraction)."""
        return self._core.op_

    keep_graph = _core_flag(
        "keep_graph",
        "keep_graph",
        "Whether recorded differences keep their autograd graph.",
    )
    trainexec = _core_flag(
        "train_update",
        "trainexec",
        "Whether the hooks record while the module is in training mode.",
    )
    evalexec = _core_flag(
        "eval_update",
        "evalexec",
        "Whether the hooks record while the module is in evaluation mode.",
    )

    # -------------------------------------------------------- registration

    @property
    def registered(self) -> bool:
        """Whether the hooks are on a module."""
        return self._handles is not None

    @property
    def module(self) -> Optional[nn.Module]:
        """The module registered to last (None if gone or never registered)."""
        return self._observed() if self._observed is not None else None

    def register(self, module: Optional[nn.Module] = None) -> None:
        """Adds the hooks to ``module``, or to the last module when None.

        Raises:
            RuntimeError: registered already (to ``module``), or no module
                given and the last one is gone or there was none.
        """
        if module is not None:
            if self.registered:
                raise RuntimeError(
                    f"{type(self).__name__} is already registered to a module; "
                    "call deregister() before registering it again"
                )
            self._attach(module)
        elif not self.registered:
            module = self.module
            if module is None:
                raise RuntimeError(
                    f"{type(self).__name__}.register() needs a module: this "
                    "monitor was never registered, or its last module was "
                    "garbage collected"
                )
            self._attach(module)

    def deregister(self) -> None:
        """Removes the hooks (and the state attribute) from the module; safe to
        call when not registered."""
        if self._finalizer is not None:
            self._finalizer()  # runs _detach once
        self._finalizer = None
        self._handles = None

    def _attach(self, module: nn.Module) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"module must be a torch.nn.Module, got {type(module).__name__}"
            )
        if isinstance(module, torch.jit.ScriptModule):
            raise TypeError(
                "cannot add a DifferenceMonitor to a ScriptModule: register it "
                "on the nn.Module, then call torch.jit.script (the scripted "
                "module keeps the hooks)"
            )
        existing = module.__dict__.get(self._key)
        if existing is self._core and self._adopt_hooks_of(module):
            return  # a deep copy of the module already carries our hooks
        if existing is not None:  # a copy of this monitor is on the module
            self._key = f"_torch_monitor_difference_{next(_ids)}"
        pre, post = _make_hooks(self._key, self.attr, module)
        module.__dict__[self._key] = self._core
        try:
            pre_handle = module.register_forward_pre_hook(pre, prepend=self._prepend)
            try:
                post_handle = module.register_forward_hook(post, prepend=self._prepend)
            except BaseException:
                pre_handle.remove()
                raise
        except BaseException:
            module.__dict__.pop(self._key, None)
            raise
        self._handles = (pre_handle, post_handle)
        self._observed = weakref.ref(module)
        # Removes the hooks when this monitor is garbage collected; holds
        # neither the monitor nor the module.
        self._finalizer = weakref.finalize(
            self, _detach, pre_handle, post_handle, weakref.ref(module), self._key
        )

    def extra_repr(self) -> str:
        return f"attr={self.attr!r}, registered={self.registered}"

    # ---------------------------------------------------- copies, pickling

    def __deepcopy__(self, memo):
        """A new monitor with a deep copy of the reducer.

        Copied together with its module (one ``deepcopy`` of an object holding
        both), the module's copy carries the hooks and, through ``memo``, the
        same copied state and reducer: the copy records that module's calls.
        It is registered to it (owns the hooks) when the module was copied
        first, else ``register(module_copy)`` takes the hooks over.
        Otherwise the copy is not registered.
        """
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        nn.Module.__init__(new)
        new.training = self.training
        new.reducer_ = copy.deepcopy(self.reducer_, memo)
        new._core = copy.deepcopy(self._core, memo)
        new._prepend = self._prepend
        new._key = self._key  # the attribute a copied module holds it in
        new._handles = None
        new._observed = None
        new._finalizer = None
        module = self.module
        copied = memo.get(id(module)) if self.registered and module is not None else None
        if copied is not None and copied.__dict__.get(self._key) is new._core:
            new._adopt_hooks_of(copied)
        return new

    def __getstate__(self):
        """Pickles the configuration and the reducer; the copy is unregistered
        (hooks are functions of the module, not of the monitor)."""
        state = {k: v for k, v in self.__dict__.items() if k not in _UNPICKLED}
        core = self._core
        state["_config"] = (
            self.attr, self.trainexec, self.evalexec, core.filter_, core.map_, core.op_,
            self.keep_graph,
        )
        return state

    def __setstate__(self, state):
        config = state.pop("_config")
        keep_graph = config[6] if len(config) > 6 else False
        attr, train_update, eval_update, filter_, map_, op_ = config[:6]
        self.__dict__.update(state)
        self._core = _C.DifferenceMonitorCore(
            self.reducer_, attr, train_update, eval_update, filter_, map_, op_, keep_graph
        )
        self._key = f"_torch_monitor_difference_{next(_ids)}"
        self._handles = None
        self._observed = None
        self._finalizer = None

    def _adopt_hooks_of(self, module: nn.Module) -> bool:
        """Takes over the hooks that a deep copy of the module carries."""
        ids = []
        for hooks, suffix in ((module._forward_pre_hooks, "_before"), (module._forward_hooks, "_after")):
            name = self._key + suffix
            found = [i for i, fn in hooks.items() if getattr(fn, "__name__", None) == name]
            if len(found) != 1:
                return False
            ids.append(found[0])
        pre_id, post_id = ids
        pre_handle = RemovableHandle(module._forward_pre_hooks)
        pre_handle.id = pre_id
        post_handle = RemovableHandle(module._forward_hooks)
        post_handle.id = post_id
        self._handles = (pre_handle, post_handle)
        self._observed = weakref.ref(module)
        self._finalizer = weakref.finalize(
            self, _detach, pre_handle, post_handle, weakref.ref(module), self._key
        )
        return True


_UNPICKLED = ("_core", "_key", "_handles", "_observed", "_finalizer")
