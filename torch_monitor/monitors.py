"""Monitors: module hooks that feed reducers (inferno-compatible).

``DifferenceMonitor`` has the interface of ``inferno.observe.DifferenceMonitor``
(inferno-ai 0.0.5) and records, at every forward call of a module, how one of
its attributes changed across ``forward()``. The work happens in C++:

* The monitor's state is a ``torch.classes.torch_monitor.DifferenceMonitor``
  object (its face, made from the schema as every face is) holding the C++
  reducer and the Python ``filter_``/``map_``/``op_``.
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

import base64
import copy
import importlib
import inspect
import itertools
import json
import typing
import warnings
import weakref
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from . import _C, _faces, _internals, _spellings
from .reducers import VIEW_TOLERANCE
from ._faces import strict_bool

__all__ = [
    "DifferenceMonitor",
    "InputMonitor",
    "Monitor",
    "MonitorConstructor",
    "MultiStateMonitor",
    "OutputMonitor",
    "StateMonitor",
]

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


def _forward_types(module_class: Optional[type]):
    """(input, output) annotations of ``module_class.forward`` as hooks need them.

    TorchScript checks a pre-hook's ``input`` against ``Tuple[<forward's
    argument types>]`` and a post-hook's ``output`` against forward's return
    type. Unannotated arguments are Tensors (TorchScript's default); an
    unannotated return gives ``_UNKNOWN`` (TorchScript infers it from the body).
    """
    if module_class is None:
        return Tuple[()], _UNKNOWN
    forward = module_class.forward
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

_PRE_HOOK_SOURCE = '''\
def {name}_before(self, input: _Input) -> None:
    if _is_scripting():
        self.{key}.{method}({value}, self.training)
    elif _is_compiling():
        self.{key}.{method}({value}, self.training)
    else:
        {eager}
'''

_POST_HOOK_SOURCE = '''\
def {name}_after(self, input: _Input, output: _Output) -> _Output:
    if _is_scripting():
        self.{key}.{method}({value}, self.training)
    elif _is_compiling():
        self.{key}.{method}({value}, self.training)
    else:
        _after(self, output)
    return output
'''

# The eager body of a one-hook monitor's hook (Input/Output/State/
# MultiStateMonitor): the value expression evaluated in Python, then one call
# into C++. `arg` is the hook's own argument the expression may use.
_EAGER_OBSERVE_SOURCE = '''\
def {name}_eager_{arg}(self, {arg}):
    self.{key}.observe({value}, self.training)
'''


class _HookSide(typing.NamedTuple):
    """One forward hook of a monitor: which core method it calls with what it
    observes: ``"input"`` or ``"output"`` (the hook's argument), ``("path",
    p)`` (the attribute at path p) or ``("paths", (p, ...))`` (a tuple of
    them)."""

    method: str  # "before", "after" or "observe" of the monitor core
    what: Any

    @property
    def value(self) -> str:
        """TorchScript source of the value (``self``, ``input``, ``output`` in
        scope)."""
        if isinstance(self.what, str):
            return self.what
        kind, paths = self.what
        if kind == "path":
            return _path_expression(paths)
        return "(" + ", ".join(_path_expression(p) for p in paths) + ",)"

    @property
    def path(self) -> str:
        """The attribute path (a DifferenceMonitor's eager hooks resolve it in
        C++)."""
        return self.what[1]


# The hooks are found by name, so that a module holding a monitor pickles
# (pickle saves a function as a reference, `module.name`): each hook is named
# after everything it is made from, and this module gives that name back as
# the function, making it anew in a process that has not (unpickling). The
# live ones are kept here while they are on a module.
_HOOK_PREFIX = "_torch_monitor_hook_"
_HOOKS: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


def _hook_name(key: str, module_class: type, pre, post, side: str) -> str:
    spec = {
        "key": key,
        "class": [module_class.__module__, module_class.__qualname__],
        "pre": None if pre is None else [pre.method, pre.what],
        "post": None if post is None else [post.method, post.what],
        "side": side,
    }
    text = json.dumps(spec, separators=(",", ":"), sort_keys=True).encode()
    return _HOOK_PREFIX + base64.b32encode(zlib.compress(text, 9)).decode().rstrip("=")


def _hook_from_name(name: str):
    """The hook ``name`` describes, made in this process (unpickling a module
    whose monitor was made in another one)."""
    encoded = name[len(_HOOK_PREFIX):]
    try:
        spec = json.loads(zlib.decompress(base64.b32decode(encoded + "=" * (-len(encoded) % 8))))
        side = lambda entry: None if entry is None else _HookSide(entry[0], _side_what(entry[1]))  # noqa: E731
        pre, post = side(spec["pre"]), side(spec["post"])
        module_name, qualname = spec["class"]
        key, which = spec["key"], spec["side"]
    except Exception as e:
        raise AttributeError(f"{name!r} does not name a torch_monitor monitor hook ({e})") from None
    module_class = _importable(module_name, qualname)
    hooks = _make_hooks(key, module_class, pre, post)
    return hooks[0] if which == "before" else hooks[1]


def _side_what(what):
    if isinstance(what, str) and what in ("input", "output"):
        return what
    kind, paths = what
    if kind == "path" and isinstance(paths, str):
        return (kind, paths)
    if kind == "paths" and all(isinstance(p, str) for p in paths):
        return (kind, tuple(paths))
    raise ValueError(f"not a monitored value: {what!r}")


def _importable(module_name: str, qualname: str):
    """The module class a hook is typed after, or None when this process
    cannot import it (the hook is then typed as forward() returning a
    Tensor, which only matters for torch.jit.script)."""
    try:
        found = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
        return found
    except Exception:
        return None


def __getattr__(name: str):
    if name.startswith(_HOOK_PREFIX):
        hook = _HOOKS.get(name)
        return hook if hook is not None else _hook_from_name(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make_hooks(key: str, module_class: Optional[type], pre: Optional[_HookSide], post: Optional[_HookSide]):
    """The forward (pre-hook, hook) pair of the monitor stored as
    ``module.<key>``; either is None when that side is not observed.

    Plain Python functions with real source (registered in ``linecache``) so
    that ``torch.jit.script`` compiles them with the module. Scripted, and
    while torch.compile or torch.export traces them, they call the monitor
    object's TorchScript methods (two branches with the same line: TorchScript
    skips the eager branch only under a bare ``is_scripting()`` call); in
    eager mode a DifferenceMonitor calls the C functions of the binding
    (which resolve the path in C++), and a one-hook monitor a small generated
    function evaluating the same value expression. The post-hook returns its ``output``: TorchScript types a
    hook's ``output`` as the previous hook's return type, so returning None
    would break the next post-hook on the module.
    """
    names = {
        side: _hook_name(key, module_class, pre, post, side)
        for side, hook in (("before", pre), ("after", post))
        if hook is not None and module_class is not None
    }
    live = [_HOOKS.get(name) for name in names.values()]
    if names and all(hook is not None for hook in live):
        # Made already (for another module of this class): the same code.
        return tuple(_HOOKS.get(names[side]) if side in names else None for side in ("before", "after"))
    input_type, output_type = _forward_types(module_class)
    namespace = {
        "__name__": __name__,
        "_Input": input_type,
        "_Output": torch.Tensor if output_type is _UNKNOWN else output_type,
        "_is_scripting": _is_scripting,
        "_is_compiling": _is_compiling,
    }
    source = ""
    if pre is not None and pre.method == "before":  # DifferenceMonitor
        namespace["_before"], namespace["_after"] = _C._difference_monitor_hooks(key, pre.path)
        pre_eager = "_before(self)"
    else:
        for arg, side in (("input", pre), ("output", post)):
            if side is not None:
                source += _EAGER_OBSERVE_SOURCE.format(name=key, key=key, arg=arg, value=side.value)
        pre_eager = f"{key}_eager_input(self, input)"
        namespace["_after"] = None  # bound below, once the source has run
    if pre is not None:
        source += _PRE_HOOK_SOURCE.format(
            name=key, key=key, method=pre.method, value=pre.value, eager=pre_eager
        )
    if post is not None:
        source += _POST_HOOK_SOURCE.format(name=key, key=key, method=post.method, value=post.value)
    filename = f"<torch_monitor monitor hooks {key} #{next(_ids)}>"
    _internals.add_source_to_linecache(filename, source)
    exec(compile(source, filename, "exec"), namespace)
    if namespace["_after"] is None:
        namespace["_after"] = namespace.get(f"{key}_eager_output")
    if post is not None and output_type is _UNKNOWN:
        # forward() has no return annotation: type `output` after the first
        # value seen (TorchScript would infer the same from the body in the
        # usual cases; annotate forward() where it does not).
        after = namespace["_after"]

        def _after_first(module, output, _namespace=namespace, _after=after):
            annotation = _annotation_of_value(output)
            if annotation is not _UNKNOWN:
                _namespace["_Output"] = annotation
            _namespace["_after"] = _after
            return _after(module, output)

        namespace["_after"] = _after_first
    hooks = (namespace.get(f"{key}_before"), namespace.get(f"{key}_after"))
    anchor = hooks[1] if hooks[1] is not None else hooks[0]
    weakref.finalize(anchor, _internals.remove_source_from_linecache, filename)
    for side, hook in zip(("before", "after"), hooks):
        if side in names:
            hook.__qualname__ = names[side]  # what pickle saves
            _HOOKS[names[side]] = hook
    return hooks


def _detach(handles, module_ref, key):
    """Removes a monitor's hooks and its state attribute from the module."""
    for handle in handles:
        handle.remove()
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


# Inferno's defaults for the one-hook monitors, as named functions (so that a
# monitor pickles, and so that one given back to a constructor is recognised
# as the default and keeps the C++ path, which computes the same). The C++
# observe() also skips an empty tuple, which inferno would feed as no inputs
# (an error in every reducer).


def _truthy(inputs: Tuple[Any, ...]) -> bool:
    """InputMonitor's default ``filter_``: rejects an empty tuple of inputs."""
    return bool(inputs)


def _not_none(value: Any) -> bool:
    """Default ``filter_`` of OutputMonitor, StateMonitor and
    MultiStateMonitor: rejects None."""
    return value is not None


def _unchanged(values: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """Default ``map_`` of InputMonitor and MultiStateMonitor: the tuple's
    elements are the reducer's inputs."""
    return values


def _as_tuple(value: Any) -> Tuple[Any, ...]:
    """Default ``map_`` of OutputMonitor and StateMonitor: a tuple's elements,
    or the value as the one input."""
    return value if isinstance(value, tuple) else (value,)


# ----------------------------------------------------------------- monitor


# The arguments of the monitor object's constructor that each monitor sets
# itself; every other one is a keyword-only option of every monitor, taken
# by its constructor as the object's schema has it (so adding an option to
# the C++ monitor and its registration gives it to the monitors too).
_SET_BY_MONITORS = ("self", "reducer", "name", "train_update", "eval_update", "kind")


def _core_options() -> List[inspect.Parameter]:
    signature = inspect.signature(_spellings.DifferenceMonitor.__init__)
    return [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for name, p in signature.parameters.items()
        if name not in _SET_BY_MONITORS
    ]


def _takes_core_options(init):
    """Gives a monitor's ``__init__(..., **options)`` the signature that
    ``help()``, ``inspect`` and ``partialconstructor`` show: its own
    arguments, then the core's options."""
    own = inspect.signature(init)
    parameters = [p for p in own.parameters.values() if p.kind != p.VAR_KEYWORD]
    init.__signature__ = own.replace(parameters=parameters + _core_options())
    return init


def _monitor_core(owner: str, reducer, name: str, train_update, eval_update, kind: str = "DifferenceMonitor",
                  filter_=None, map_=None, op_=None, **options):
    """The object a monitor keeps on its module: the face of
    ``torch.classes.torch_monitor.DifferenceMonitor``, with the Python
    callables set on it (TorchScript cannot take them as arguments).
    ``owner`` names the monitor class in errors."""
    known = {p.name for p in _core_options()}
    for option in options:
        if option not in known:
            raise TypeError(f"{owner}() got an unexpected keyword argument {option!r}")
    core = _spellings.DifferenceMonitor(
        reducer,
        name,
        strict_bool(train_update, "train_update"),
        strict_bool(eval_update, "eval_update"),
        kind=kind,
        **options,
    )
    if filter_ is not None or map_ is not None or op_ is not None:
        _C._set_monitor_callables(core, filter_, map_, op_)
    return core


class _PartialConstructor:
    """``partialconstructor`` of the built-in monitors, derived from the
    class's ``__init__``: it takes every argument of ``__init__`` but
    ``attr`` and ``module``, in the same order, and returns
    ``constructor(attr, module)`` building a monitor registered on
    ``module`` (for monitors without an ``attr``, inferno's Input and Output
    monitors, on the submodule ``module.<attr>``). Monitors built by one
    constructor share ``reducer``, as in inferno. Its signature is the
    class's (``help()`` and ``inspect`` show it)."""

    def __get__(self, instance, cls):
        init = inspect.signature(cls.__init__)
        has_attr = "attr" in init.parameters
        signature = init.replace(
            parameters=[p for name, p in init.parameters.items() if name not in ("self", "attr", "module")],
            return_annotation=MonitorConstructor,
        )

        def partialconstructor(*args: Any, **kwargs: Any) -> MonitorConstructor:
            # Wrong arguments are a TypeError now, not when a model is built.
            given = signature.bind(*args, **kwargs).arguments

            def constructor(attr: str, module: nn.Module):
                if has_attr:
                    return cls(attr=attr, module=module, **given)
                return cls(module=_resolve(module, attr), **given)

            return constructor

        partialconstructor.__signature__ = signature  # type: ignore[attr-defined]
        partialconstructor.__doc__ = type(self).__doc__
        partialconstructor.__qualname__ = f"{cls.__qualname__}.partialconstructor"
        return partialconstructor


class _Monitor(nn.Module):
    """What every monitor shares: a C++ core (the face of
    ``torch.classes.torch_monitor.DifferenceMonitor``) feeding the reducer,
    stored on the monitored module as the attribute ``key``, and generated
    forward hooks that call it. Subclasses say what the hooks observe
    (``_hook_sides``) and how the core is built (``_new_core``).

    The core is one C++ monitor for all of them: a DifferenceMonitor's
    pre-hook calls ``before(value)`` (a copy is captured) and its post-hook
    ``after(value)`` (feeds ``map_(value, captured)``); the hook of a
    one-hook monitor calls ``observe(value)`` (feeds ``map_(value)``).
    """

    def _init_monitor(self, reducer, core, prepend, module) -> None:
        self.reducer_ = reducer
        self._core = core
        self._prepend = strict_bool(prepend, "prepend")
        self._key = None  # chosen by register()
        self._handles = None
        self._observed = None
        self._finalizer = None
        if module is not None:
            self.register(module)

    partialconstructor = _PartialConstructor()

    @classmethod
    def _key_prefix(cls) -> str:
        return f"_torch_monitor_{cls.__name__[:-len('Monitor')].lower()}_"

    def _free_key(self, module: nn.Module) -> str:
        """The first attribute name of this kind that ``module`` does not
        hold. Numbered per module, not per process: the monitors at one place
        in every instance of a model class get the same name, hence the same
        hook functions, and one compiled graph serves every instance (Dynamo
        guards on the hooks' code)."""
        prefix = self._key_prefix()
        number = 0
        while f"{prefix}{number}" in module.__dict__:
            number += 1
        return f"{prefix}{number}"

    def _hook_sides(self):
        """(pre, post): the _HookSide of each forward hook, or None."""
        raise NotImplementedError

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

    def view(self, time, tolerance: float = VIEW_TOLERANCE) -> Optional[torch.Tensor]:
        """The reducer's state ``time`` before the newest one."""
        return self.reducer_.view(time, tolerance)

    def dump(self, *args, **kwargs) -> Optional[torch.Tensor]:
        """Every state the reducer keeps, newest first."""
        return self.reducer_.dump(*args, **kwargs)

    def clear(self, **kwargs) -> None:
        """Forgets any value captured before forward() and clears the reducer
        (``kwargs`` go to the reducer's ``clear``, e.g. ``keepshape=True``)."""
        self._core.forget_all()
        return self.reducer_.clear(**kwargs)

    # ------------------------------------------------------- configuration

    @property
    def key(self) -> str:
        """Name of the attribute holding this monitor's state on the module
        (chosen when it is registered; the first free one of its kind there).

        Raises:
            RuntimeError: never registered to a module.
        """
        if self._key is None:
            raise RuntimeError(
                f"{type(self).__name__} was never registered to a module, so it has no attribute "
                "there yet; register(module) first")
        return self._key

    @property
    def core(self) -> "_spellings.DifferenceMonitor":
        """The ``torch.classes.torch_monitor.DifferenceMonitor`` object."""
        return self._core

    @property
    def prepend(self) -> bool:
        return self._prepend

    # Kept on the core: the C++ monitor reads them at every call.
    keep_graph = _faces.setting("_core", "keep_graph", bool, "Whether recorded values keep their autograd graph.")
    trainexec = _faces.setting(
        "_core", "train_update", bool, "Whether the hooks record while the module is in training mode.", "trainexec"
    )
    evalexec = _faces.setting(
        "_core", "eval_update", bool, "Whether the hooks record while the module is in evaluation mode.", "evalexec"
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
                # inferno's words (its tests match them), then what to do.
                raise RuntimeError(
                    f"{type(self).__name__}(Monitor) is already registered to a module "
                    "so register() was ignored; call deregister() before registering it again"
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
                f"cannot add a {type(self).__name__} to a ScriptModule: register "
                "it on the nn.Module, then call torch.jit.script (the scripted "
                "module keeps the hooks)"
            )
        self._check_module(module)
        if self._key is not None and module.__dict__.get(self._key) is self._core and self._adopt_hooks_of(module):
            return  # a deep copy of the module already carries our hooks
        self._key = self._free_key(module)
        pre, post, pre_kwargs, post_kwargs = self._hooks_for(module)
        module.__dict__[self._key] = self._core
        handles = []
        try:
            if pre is not None:
                handles.append(module.register_forward_pre_hook(pre, **pre_kwargs))
            if post is not None:
                handles.append(module.register_forward_hook(post, **post_kwargs))
        except BaseException:
            for handle in handles:
                handle.remove()
            module.__dict__.pop(self._key, None)
            raise
        self._own_hooks(module, tuple(handles))

    def _check_module(self, module: nn.Module) -> None:
        """Raises now what the first forward would find wrong with
        ``module`` (nothing by default)."""

    def _hooks_for(self, module: nn.Module):
        """(pre-hook, hook, pre-hook kwargs, hook kwargs) to register on
        ``module``; a hook is None when that side is not observed."""
        pre, post = _make_hooks(self._key, type(module), *self._hook_sides())
        kwargs = {"prepend": self._prepend}
        return pre, post, kwargs, kwargs

    def _own_hooks(self, module: nn.Module, handles) -> None:
        self._handles = handles
        self._observed = weakref.ref(module)
        # Removes the hooks when this monitor is garbage collected; holds
        # neither the monitor nor the module.
        self._finalizer = weakref.finalize(
            self, _detach, handles, weakref.ref(module), self._key
        )

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
        for name, value in self.__dict__.items():  # the subclass's settings
            if name not in _UNPICKLED and name not in new.__dict__:
                new.__dict__[name] = copy.deepcopy(value, memo)
        new._core = copy.deepcopy(self._core, memo)
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
        """Pickles the monitor's object (its configuration, Python callables
        and reducer: its face's pickle) and the module's own settings; the
        copy is unregistered (hooks are functions of the module, not of the
        monitor)."""
        return {k: v for k, v in self.__dict__.items() if k not in _UNPICKLED}

    def __setstate__(self, state):
        legacy = state.pop("_flags", None), state.pop("_config", None)
        self.__dict__.update(state)
        if legacy != (None, None):
            self._core = self._core_from_legacy_pickle(*legacy)
        self._key = None
        self._handles = None
        self._observed = None
        self._finalizer = None

    def _core_from_legacy_pickle(self, flags, config):
        """Pickles before issue 25 held the settings, not the object:
        ``_flags`` (train_update, eval_update, keep_graph); a
        DifferenceMonitor's ``_config`` (attr, train_update, eval_update,
        filter_, map_, op_[, keep_graph])."""
        if config is not None:
            attr, train_update, eval_update, filter_, map_, op_ = config[:6]
            keep_graph = config[6] if len(config) > 6 else False
            return _monitor_core(type(self).__name__, self.reducer_, attr, train_update, eval_update,
                                 filter_=filter_, map_=map_, op_=op_, keep_graph=keep_graph)
        train_update, eval_update, keep_graph = flags
        callables = (self.__dict__.pop("_filter", None), self.__dict__.pop("_map", None))
        return self._new_core(train_update, eval_update, callables, keep_graph=keep_graph)

    def _adopt_hooks_of(self, module: nn.Module) -> bool:
        """Takes over the hooks that a deep copy of the module carries."""
        pre, post = self._hook_sides()
        names = {}
        if pre is not None:
            names["pre"] = self._key + "_before"
        if post is not None:
            names["post"] = self._key + "_after"
        handles = _internals.forward_hook_handles(module, names)
        if handles is None:
            return False
        self._own_hooks(module, tuple(handles[side] for side in ("pre", "post") if side in handles))
        return True


_UNPICKLED = ("_key", "_handles", "_observed", "_finalizer")


class DifferenceMonitor(_Monitor):
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
        **options: Any,
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
        core = _monitor_core(
            type(self).__name__, reducer, attr, train_update, eval_update,
            filter_=filter_, map_=map_, op_=op_, **options,
        )
        self._init_monitor(reducer, core, prepend, module)

    @classmethod
    def _key_prefix(cls) -> str:
        return "_torch_monitor_difference_"

    def _check_module(self, module: nn.Module) -> None:
        # The path is resolved at every forward, as inferno does (a module
        # may get the attribute later, in its first forward say): one that
        # does not resolve now is worth a warning, not a refusal; the first
        # forward that cannot resolve it raises this error.
        try:
            _C._check_monitor_path(module, self.attr)
        except AttributeError as e:
            warnings.warn(
                f"{e}. The monitor is registered: its first forward() will raise this "
                "error unless the module has the attribute by then",
                RuntimeWarning,
                stacklevel=5,
            )

    def _hook_sides(self):
        what = ("path", self.attr)
        return _HookSide("before", what), _HookSide("after", what)

    @property
    def attr(self) -> str:
        """The monitored attribute path."""
        return self._core.name()

    @property
    def filter_(self):
        """The filter: the one given, else the default (a callable, as in
        inferno)."""
        filter_, _, _ = _C._monitor_callables(self._core)
        return _default_filter if filter_ is None else filter_

    @property
    def map_(self):
        """The map: the one given, else the default using ``op_`` (a
        callable, as in inferno)."""
        _, map_, op_ = _C._monitor_callables(self._core)
        return DefaultMap(op_) if map_ is None else map_

    @property
    def op_(self):
        """The custom op, or None for the default (subtraction)."""
        return _C._monitor_callables(self._core)[2]

    def extra_repr(self) -> str:
        return f"attr={self.attr!r}, registered={self.registered}"


# ------------------------------------------------------ one-hook monitors


def _resolve(module: nn.Module, attr: str):
    """``module.<attr>`` for a dotted path (the module itself for "")."""
    for part in attr.split(".") if attr else ():
        module = getattr(module, part)
    return module


class _ObservingMonitor(_Monitor):
    """A monitor with one hook that feeds ``map_(value)`` to the reducer when
    ``filter_(value)`` holds; subclasses say what ``value`` is
    (``_what_observed``), when (``_as_prehook``) and how the core names it
    in errors (``_core_name``). Defaults as in inferno (those of the core's
    ``observe``): ``filter_`` rejects None and empty tuples, ``map_`` feeds a
    tuple's elements as the reducer's inputs and any other value as its one
    input, as they are.
    """

    _as_prehook = False
    _kind = ""  # the class name monitors_of reports
    _defaults = (_not_none, _as_tuple)  # (filter_, map_) as read back
    _what = ""  # Input/OutputMonitor: the hook argument observed

    # Input/OutputMonitor's; the monitors of an attribute add `attr`.
    def __init__(
        self,
        reducer,
        module: Optional[nn.Module] = None,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Optional[Callable[[Any], bool]] = None,
        map_: Optional[Callable[[Any], Tuple[torch.Tensor, ...]]] = None,
        **options: Any,
    ):
        nn.Module.__init__(self)
        self._setup(reducer, module, train_update, eval_update, prepend, filter_, map_, options)

    def _setup(self, reducer, module, train_update, eval_update, prepend, filter_, map_, options):
        # A default read back from a monitor is the default again (the C++
        # path, saveable).
        default_filter, default_map = self._defaults
        filter_ = None if filter_ is default_filter else filter_
        map_ = None if map_ is default_map else map_
        self.reducer_ = reducer
        core = self._new_core(train_update, eval_update, (filter_, map_), **options)
        self._init_monitor(reducer, core, prepend, module)

    def _new_core(self, train_update, eval_update, callables=(None, None), **options):
        # The core calls a one-hook monitor's filter_ and map_ with the one
        # value observed.
        filter_, map_ = callables
        return _monitor_core(
            type(self).__name__, self.reducer_, self._core_name(), train_update, eval_update, self._kind,
            filter_=filter_, map_=map_, **options,
        )

    def _core_name(self) -> str:
        return self._what

    def _what_observed(self):
        """What the hook observes (see _HookSide.what)."""
        return self._what

    def _hook_sides(self):
        side = _HookSide("observe", self._what_observed())
        return (side, None) if self._as_prehook else (None, side)

    @property
    def filter_(self):
        """The filter: the one given, else the default (a callable, as in
        inferno)."""
        filter_ = _C._monitor_callables(self._core)[0]
        return self._defaults[0] if filter_ is None else filter_

    @property
    def map_(self):
        """The map: the one given, else the default (a callable, as in
        inferno)."""
        map_ = _C._monitor_callables(self._core)[1]
        return self._defaults[1] if map_ is None else map_

    @property
    def as_prehook(self) -> bool:
        """Whether the value is read before ``forward()`` (else after)."""
        return self._as_prehook

    def extra_repr(self) -> str:
        return f"{self._core_name()!r}, registered={self.registered}"


class InputMonitor(_ObservingMonitor):
    r"""Records the inputs of each forward call of a module (inferno's
    ``InputMonitor``).

    A forward pre-hook hands the tuple of positional inputs to
    ``filter_(inputs) -> bool`` (default: reject an empty tuple) and then to
    ``map_(inputs) -> tuple of tensors`` (default: the inputs themselves),
    unpacked as the reducer's inputs. Other arguments, gating, registration
    and saving as for :class:`DifferenceMonitor`. Unlike inferno 0.0.5 the
    history is detached from autograd unless ``keep_graph=True``.
    """

    _as_prehook = True
    _kind = "InputMonitor"
    _defaults = (_truthy, _unchanged)
    _what = "input"


class OutputMonitor(_ObservingMonitor):
    r"""Records the output of each forward call of a module (inferno's
    ``OutputMonitor``).

    A forward hook hands the output to ``filter_(output) -> bool`` (default:
    reject None) and ``map_(output) -> tuple of tensors`` (default: a
    tuple's elements, or the output itself as the one input). Other
    arguments as for :class:`InputMonitor`.
    """

    _kind = "OutputMonitor"
    _what = "output"


class StateMonitor(_ObservingMonitor):
    r"""Records an attribute of a module at each forward call (inferno's
    ``StateMonitor``): after ``forward()``, or before it with
    ``as_prehook=True``.

    ``attr`` is a dotted path resolved at every call as for
    :class:`DifferenceMonitor` (the hook is on ``module`` itself).
    ``filter_(value) -> bool`` (default: reject None) and
    ``map_(value) -> tuple of tensors`` (default: a tuple's elements, or the
    value itself) as for :class:`OutputMonitor`.
    """

    _kind = "StateMonitor"

    def __init__(
        self,
        reducer,
        attr: str,
        module: Optional[nn.Module] = None,
        as_prehook: bool = False,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Optional[Callable[[Any], bool]] = None,
        map_: Optional[Callable[[Any], Tuple[torch.Tensor, ...]]] = None,
        **options: Any,
    ):
        nn.Module.__init__(self)
        if not isinstance(attr, str):
            raise TypeError(f"attr must be a str, got {type(attr).__name__}")
        self._attr = attr
        self._as_prehook = strict_bool(as_prehook, "as_prehook")
        self._setup(reducer, module, train_update, eval_update, prepend, filter_, map_, options)

    @property
    def attr(self) -> str:
        """The monitored attribute path."""
        return self._attr

    def _core_name(self) -> str:
        return self._attr

    def _what_observed(self):
        return ("path", self._attr)


class MultiStateMonitor(_ObservingMonitor):
    r"""Records several attributes of a module at each forward call (inferno's
    ``MultiStateMonitor``): the tuple of ``<attr>.<subattr>`` for each of
    ``subattrs`` (or the subattrs themselves when ``attr`` is empty), read
    after ``forward()`` or before it with ``as_prehook=True``.

    ``filter_(values) -> bool`` (default: reject None, so accept) and
    ``map_(values) -> tuple of tensors`` (default: the values, in order, as
    the reducer's inputs).
    """

    _kind = "MultiStateMonitor"
    _defaults = (_not_none, _unchanged)

    def __init__(
        self,
        reducer,
        attr: str,
        subattrs: Tuple[str, ...],
        module: Optional[nn.Module] = None,
        as_prehook: bool = False,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Optional[Callable[[Tuple[Any, ...]], bool]] = None,
        map_: Optional[Callable[[Tuple[Any, ...]], Tuple[torch.Tensor, ...]]] = None,
        **options: Any,
    ):
        nn.Module.__init__(self)
        if not isinstance(attr, str):
            raise TypeError(f"attr must be a str, got {type(attr).__name__}")
        if isinstance(subattrs, str) or not all(isinstance(s, str) for s in subattrs):
            raise TypeError(
                "subattrs must be a tuple of attribute names (str), got "
                f"{subattrs!r}; write ('x',) for a single one"
            )
        if not subattrs:
            raise ValueError("subattrs is empty: name at least one attribute to monitor")
        self._attr = attr
        self._subattrs = tuple(subattrs)
        self._as_prehook = strict_bool(as_prehook, "as_prehook")
        self._setup(reducer, module, train_update, eval_update, prepend, filter_, map_, options)

    @property
    def attr(self) -> str:
        """The path the subattrs are relative to."""
        return self._attr

    @property
    def subattrs(self) -> Tuple[str, ...]:
        return self._subattrs

    @property
    def attrs(self) -> Tuple[str, ...]:
        """The full path of each monitored attribute, in order."""
        return tuple(f"{self._attr}.{s}" if self._attr else s for s in self._subattrs)

    def _core_name(self) -> str:
        return ",".join(self.attrs)

    def _what_observed(self):
        return ("paths", self.attrs)


for _cls in (DifferenceMonitor, _ObservingMonitor, StateMonitor, MultiStateMonitor):
    _takes_core_options(_cls.__init__)

# ------------------------------------------------- monitors in Python


def _method_hook(monitor_ref, name: str):
    """A forward (pre-)hook calling the monitor's method ``name`` with the
    hook's arguments, gated by its train/eval flags. Holds the monitor
    weakly, so that dropping the monitor still removes its hooks."""

    def hook(module, *args):
        monitor = monitor_ref()
        if monitor is None:
            return None
        if not (monitor.trainexec if module.training else monitor.evalexec):
            return None
        return getattr(monitor, name)(module, *args)

    return hook


class Monitor(_Monitor):
    r"""Base for monitors written in Python (inferno's ``Monitor``).

    ``prehook``/``posthook`` name methods of the subclass that run as the
    module's forward pre-hook ``(module, args)`` and forward hook
    ``(module, args, output)``, while ``module.training`` matches
    ``train_update``/``eval_update``; ``prehook_kwargs``/``posthook_kwargs``
    go to ``register_forward_pre_hook``/``register_forward_hook`` (e.g.
    ``{"prepend": True}``). Registration, reading the reducer, gating flags
    and deletion work as for the built-in monitors. The hooks are Python
    code: eager mode only (the built-in monitors also run scripted).
    Subclasses used with updaters implement ``partialconstructor``.
    """

    def __init__(
        self,
        reducer,
        module: Optional[nn.Module] = None,
        prehook: Optional[str] = None,
        posthook: Optional[str] = None,
        prehook_kwargs: Optional[Dict[str, Any]] = None,
        posthook_kwargs: Optional[Dict[str, Any]] = None,
        train_update: bool = True,
        eval_update: bool = True,
    ):
        nn.Module.__init__(self)
        for name in (prehook, posthook):
            if name is not None and not callable(getattr(self, name, None)):
                raise TypeError(f"{type(self).__name__} has no method {name!r} to run as a hook")
        self._hook_names = (prehook, posthook)
        self._hook_kwargs = (dict(prehook_kwargs or {}), dict(posthook_kwargs or {}))
        self.reducer_ = reducer
        core = self._new_core(train_update, eval_update)
        self._init_monitor(reducer, core, False, module)

    @classmethod
    def partialconstructor(cls, *args, **kwargs) -> MonitorConstructor:
        raise NotImplementedError(
            f"{cls.__name__}(Monitor) must implement the method `partialconstructor`."
        )

    def _new_core(self, train_update, eval_update, callables=(None, None), **options):
        # Holds the reducer and the gating flags (the methods feed the
        # reducer themselves).
        name = type(self).__name__
        return _monitor_core(name, self.reducer_, name, train_update, eval_update, "Monitor", **options)

    def _hooks_for(self, module: nn.Module):
        ref = weakref.ref(self)
        pre, post = (None if name is None else _method_hook(ref, name) for name in self._hook_names)
        return (pre, post) + self._hook_kwargs

    def _adopt_hooks_of(self, module: nn.Module) -> bool:
        return False  # a copied module's hooks call the original monitor
