"""The one template that makes the Python face of every torch_monitor object.

Signatures are written once, in C++: each object's class in the core and its
TorchScript registration (``csrc/src/script``: method names, argument names,
defaults and doc strings). A face is derived from that schema here, as real
Python code with the same signature (so ``help()``, ``inspect.signature`` and
editors show it), on ``_C.Face``, a ``torch.ScriptObject`` subclass wrapping
the very object TorchScript, ``torch.compile`` and ``torch.export`` see. What
Python spells differently (properties, keyword-only arguments, timedeltas,
paths, process groups) is declared in ``_spellings.py``, the one table of
such differences; hand-written C++ serves only the measured hot paths.

Every argument is checked once, by its kind (``KINDS`` below: the schema's
type, or the table's Python-only kind), before C++ sees it, with the same
errors for every object: ``TypeError`` for a wrong type, ``ValueError`` for a
value out of range, both naming the call and the argument.
"""

from __future__ import annotations

import ast
import datetime
import inspect
import numbers
import operator
import os
import re
import sys
import types
import typing
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from . import _C

_INT64 = (-(2**63), 2**63 - 1)


# -- kinds of arguments ------------------------------------------------------


class Kind(NamedTuple):
    """How one kind of argument is checked and converted for C++."""

    annotation: str  # its type, as signatures and stubs show it
    convert: Callable[[Any, str], Any]  # (value, "Cls.method() argument 'x'")


def _type_error(where: str, expected: str, value: Any) -> TypeError:
    return TypeError(f"{where} must be {expected}, got {type(value).__name__} {value!r}")


def _int(value: Any, where: str) -> int:
    if type(value) is int and _INT64[0] <= value <= _INT64[1]:  # the usual case, first (fast)
        return value
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise _type_error(where, "an int", value)
    if isinstance(value, torch.Tensor) and torch.compiler.is_compiling():
        # Its value exists only when the graph runs; Dynamo would fail deep
        # in the op's schema check.
        raise TypeError(
            f"{where} must be a Python int in torch.compile'd code, got a tensor (its value "
            "is known only when the graph runs): pass int(value) before the compiled call"
        )
    value = operator.index(value)
    if not _INT64[0] <= value <= _INT64[1]:
        raise ValueError(f"{where} must be an int in [-2**63, 2**63-1], got {value}")
    return value


def _float(value: Any, where: str) -> float:
    # A float or an int skips the ABC check (~0.4 us, most of a face call).
    if type(value) not in (float, int) and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise _type_error(where, "a number", value)
    try:
        return float(value)
    except OverflowError:  # an int beyond the float range
        raise ValueError(f"{where} is too large for a float, got {value}") from None


def strict_bool(value: Any, where: str) -> bool:
    """``value`` when it is a bool, else a TypeError naming ``where``: every
    flag's check, the faces' and the nn side's (monitors, reducers, watch)."""
    # bool("no") is True: a flag given as a string or a number would silently
    # mean something else than the caller wrote.
    if not isinstance(value, bool):
        raise _type_error(where, "a bool (True or False)", value)
    return value


def setting(holder: str, method: str, annotation: type, doc: str, name: str = "") -> property:
    """A read-write property of an nn-side object (a monitor, a reducer)
    whose value lives on its C++ object ``self.<holder>``: read by the
    schema's ``<method>()``, written by ``set_<method>(value)``, a bool
    checked as ``name`` (default ``method``) or a float."""

    def get(self: Any) -> Any:
        return getattr(getattr(self, holder), method)()

    def set_(self: Any, value: Any) -> None:
        value = strict_bool(value, name or method) if annotation is bool else float(value)
        getattr(getattr(self, holder), "set_" + method)(value)

    get.__annotations__["return"] = set_.__annotations__["value"] = annotation
    return property(get, set_, doc=doc)


def _tensor(value: Any, where: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise _type_error(where, "a torch.Tensor", value)
    return value


def _device(value: Any, where: str) -> torch.device:
    if not isinstance(value, (torch.device, str, int)) or isinstance(value, bool):
        raise _type_error(where, "a torch.device (or its name)", value)
    try:
        return torch.device(value)
    except RuntimeError as e:
        raise ValueError(f"{where} is not a device: {e}") from None


def _dtype(value: Any, where: str) -> torch.dtype:
    if not isinstance(value, torch.dtype):
        raise _type_error(where, "a torch.dtype", value)
    return value


def _any(value: Any, where: str) -> Any:
    # A NumPy scalar (np.float32(loss), an np.int64 step), as SummaryWriter
    # takes them: TorchScript's Any has no type for one. NumPy is looked up,
    # not imported: a program that has one has imported it.
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return value.item()
    return value


def _optional(kind: Kind) -> Kind:
    def convert(value: Any, where: str) -> Any:
        return None if value is None else kind.convert(value, where)

    return Kind(f"Optional[{kind.annotation}]", convert)


def _list(kind: Kind) -> Kind:
    def convert(value: Any, where: str) -> List[Any]:
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise _type_error(where, f"a list of {kind.annotation}", value)
        return [kind.convert(item, f"{where} item") for item in value]

    return Kind(f"List[{kind.annotation}]", convert)


def _dict(key: Kind, item: Kind) -> Kind:
    def convert(value: Any, where: str) -> Dict[Any, Any]:
        if not hasattr(value, "items"):
            raise _type_error(where, f"a mapping of {key.annotation} to {item.annotation}", value)
        return {key.convert(k, f"{where} key"): item.convert(v, f"{where}[{k!r}]") for k, v in value.items()}

    return Kind(f"Dict[{key.annotation}, {item.annotation}]", convert)


KINDS_OF_SCHEMA = {
    "int": Kind("int", _int),
    "float": Kind("float", _float),
    "bool": Kind("bool", strict_bool),
    "str": Kind("str", _C._text),
    "Tensor": Kind("torch.Tensor", _tensor),
    "Device": Kind("Union[torch.device, str]", _device),
    "ScalarType": Kind("torch.dtype", _dtype),
    "Any": Kind("Any", _any),
    "NoneType": Kind("None", _any),
}


def kind_of(schema_type: Any) -> Kind:
    """The kind of a TorchScript type (``torch._C`` type object)."""
    if isinstance(schema_type, torch.OptionalType):
        return _optional(kind_of(schema_type.getElementType()))
    if isinstance(schema_type, torch.ListType):
        return _list(kind_of(schema_type.getElementType()))
    if isinstance(schema_type, torch.DictType):
        return _dict(kind_of(schema_type.getKeyType()), kind_of(schema_type.getValueType()))
    if isinstance(schema_type, torch.TupleType):
        return Kind("tuple", _any)
    if isinstance(schema_type, torch.ClassType):  # another face: a forward reference
        return Kind(repr(schema_type.name()), _any)
    return KINDS_OF_SCHEMA[str(schema_type)]


# Python-only kinds, named by the table (_spellings.py).


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return _float(value, where)


def _path(value: Any, where: str) -> str:
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise _type_error(where, "a path (str or os.PathLike)", value)
    return _C._text(os.fspath(value), where)


def _names(value: Any, where: str) -> List[str]:
    """None: every event (an empty list for C++); one str is one name."""
    if value is None:
        return []
    if isinstance(value, str):
        return [_C._text(value, where)]
    return _list(KINDS_OF_SCHEMA["str"]).convert(value, where)


def _labels(value: Any, where: str) -> Dict[str, str]:
    return {} if value is None else _dict(KINDS_OF_SCHEMA["str"], KINDS_OF_SCHEMA["str"]).convert(value, where)


KINDS: Dict[str, Kind] = {
    "seconds": Kind("Union[float, datetime.timedelta]", _seconds),
    "optional seconds": _optional(Kind("Union[float, datetime.timedelta]", _seconds)),
    "path": Kind("Union[str, os.PathLike[str]]", _path),
    "event names": Kind("Union[str, Iterable[str], None]", _names),
    "labels": Kind("Optional[Mapping[str, str]]", _labels),
}


# -- the template --------------------------------------------------------------


class Spelling(NamedTuple):
    """What the Python face of one class says differently from its schema
    (the entries of ``_spellings.FACES``)."""

    #: {argument name: kind name in KINDS or a Kind}, for every method.
    kinds: Dict[str, Any] = {}
    #: Constructor arguments after this many are keyword-only in Python.
    positional: Optional[int] = None
    #: Python defaults that differ from the schema's: {argument: value}.
    defaults: Dict[str, Any] = {}
    #: Argument-less TorchScript methods read as read-only properties of the
    #: same name (the method itself is then hidden).
    getters: Tuple[str, ...] = ()
    #: Other read-only properties: {property: (a function of the face, its
    #: annotation, its doc)}.
    properties: Dict[str, Tuple[Callable[[Any], Any], str, str]] = {}
    #: Results converted for Python: {method: (convert, its annotation)}.
    results: Dict[str, Tuple[Callable[[Any], Any], str]] = {}
    #: Methods written in Python or C++ rather than derived: {name: function}.
    methods: Dict[str, Any] = {}
    #: Runs before the constructor (e.g. refreshing the process rank).
    before_init: Optional[Callable[[], None]] = None
    #: Runs after the constructor with (self, {argument: value as given}).
    after_init: Optional[Callable[[Any, Dict[str, Any]], None]] = None
    #: Installs hand-written (hot path) methods on the new class.
    install: Optional[Callable[[type], None]] = None
    #: Signatures of the methods not derived from a schema, for stubs:
    #: {name: "(self, ...) -> T"}.
    signatures: Dict[str, str] = {}
    #: Overloads the stubs give a method instead of its one signature
    #: (which arguments go together): {name: ["(self, ...) -> T", ...]}.
    overloads: Dict[str, List[str]] = {}
    #: "state": a copy or unpickled object is made anew from the TorchScript
    #: state (its configuration); "share": a copy is the same object (it stands
    #: for an output), pickling is refused; "refuse": neither.
    copies: str = "state"
    #: Why pickling is refused (copies "share" or "refuse").
    no_pickle: str = ""
    #: repr(): a method returning the text, or None for Name(configuration).
    repr_method: Optional[str] = None


# What the annotations of generated signatures name.
_ANNOTATION_NAMES = {
    **{name: getattr(typing, name) for name in ("Any", "Dict", "Iterable", "List", "Mapping", "Optional", "Sequence", "Union")},
    "datetime": datetime,
    "os": os,
    "torch": torch,
    "Aggregation": _C.Aggregation,
    "Event": _C.Event,
}


def _signature_source(
    cls_name: str,
    method: str,
    arguments: List[Any],
    spelling: Spelling,
    namespace: Dict[str, Any],
    positional: Optional[int],
) -> Tuple[str, str]:
    """(parameter list, converted-argument tuple) source for one method."""
    params, values = ["self"], []
    where = f"{cls_name}()" if method in ("__init__", "") else f"{cls_name}.{method}()"
    keyword_only = False
    for index, argument in enumerate(arguments):
        name = argument.name
        if name.startswith("_"):
            raise AssertionError(
                f"{cls_name}.{method}: argument {index} has no name; name every argument "
                "of the TorchScript registration (torch::arg)"
            )
        kind = spelling.kinds.get(name)
        kind = KINDS[kind] if isinstance(kind, str) else kind or kind_of(argument.real_type)
        namespace[f"_kind_{name}"] = kind.convert
        if positional is not None and index == positional and not keyword_only:
            params.append("*")
            keyword_only = True
        param = f"{name}: {kind.annotation}"
        if name in spelling.defaults and method == "__init__":
            namespace[f"_default_{name}"] = spelling.defaults[name]
            param += f" = _default_{name}"
        elif argument.has_default_value():
            namespace[f"_default_{name}"] = argument.default_value
            param += f" = _default_{name}"
        params.append(param)
        values.append(f"_kind_{name}({name}, {where + ' argument ' + repr(name)!r})")
    return ", ".join(params), "(" + "".join(v + ", " for v in values) + ")"


def _function(owner: str, schema: Any, spelling: Spelling, namespace: Dict[str, Any], call: str) -> Callable[..., Any]:
    """The Python function of a method of class ``owner`` (its schema's
    arguments after self) or of an op (``owner`` ""): the schema's signature,
    every argument checked by its kind, then ``call`` (source, with
    ``{values}`` the tuple of checked arguments), its result converted."""
    name = schema.name.rpartition("::")[2]
    returns = kind_of(schema.returns[0].type).annotation if schema.returns else "None"
    convert, returns = spelling.results.get(name, (lambda result: result, returns))
    namespace.update({"_result": convert, **_ANNOTATION_NAMES})
    arguments = schema.arguments[1:] if owner else schema.arguments
    params, values = _signature_source(owner or name, name if owner else "", arguments, spelling, namespace, None)
    params = params if owner else params.partition(", ")[2]
    source = f"def {name}({params}) -> {returns}:\n    return _result({call.format(values=values)})\n"
    where = f"face {owner}.{name}" if owner else f"op {name}"
    exec(compile(source, f"<torch_monitor {where}>", "exec", dont_inherit=True), namespace)
    function = namespace[name]
    function.__face_signature__ = f"({params}) -> {returns}"
    return function


def _method(cls_name: str, schema: Any, doc: str, spelling: Spelling) -> Callable[..., Any]:
    function = _function(cls_name, schema, spelling, {}, f"self._call({schema.name!r}, {{values}}, {{{{}}}})")
    function.__doc__ = doc or None
    function.__qualname__ = f"{cls_name}.{schema.name}"
    return function


def _constructor(cls_name: str, schema: Any, spelling: Spelling) -> Callable[..., None]:
    namespace: Dict[str, Any] = {
        "_initialised": _C._face_initialised,
        "_init": _C._init_face,
        "_before": spelling.before_init,
        "_after": spelling.after_init,
        "_locals": locals,
        **_ANNOTATION_NAMES,
    }
    params, values = _signature_source(
        cls_name, "__init__", schema.arguments[1:], spelling, namespace, spelling.positional
    )
    source = (
        f"def __init__({params}) -> None:\n"
        # cls(...) runs __init__ twice: in __new__ (see _harden_face_class),
        # then as Python's protocol; the second call finds it done.
        f"    if _initialised(self):\n"
        f"        return\n"
        # The arguments as given, for after_init alone (locals() is a tenth
        # of a WaitCounter's construction).
        + (f"    given = _locals()\n" if spelling.after_init else "")
        + f"    try:\n"
        + (f"        _before()\n" if spelling.before_init else "")
        + f"        _init(self, {cls_name!r}, {values})\n"
        f"    except BaseException:\n"
        # The object was never made: no traceback frame may keep it, since
        # any use of it (a debugger's or pytest's repr of the frame's
        # locals) would read its missing C++ object.
        + (f"        del self, given\n" if spelling.after_init else f"        del self\n")
        + f"        raise\n"
        + (f"    _after(self, given)\n" if spelling.after_init else "")
    )
    exec(compile(source, f"<torch_monitor face {cls_name}.__init__>", "exec", dont_inherit=True), namespace)
    function = namespace["__init__"]
    function.__qualname__ = f"{cls_name}.__init__"
    function.__face_signature__ = f"({params}) -> None"
    return function


def _restore(cls: type, state: Any) -> Any:
    """Pickle's factory: a new object of ``cls`` from its TorchScript state."""
    return wrap(cls, _C._restore_script_object(cls._script_class, state))


def wrap(cls: type, script_object: Any) -> Any:
    """The face of class ``cls`` for an existing ``torch.classes`` object (one
    read back from a scripted module, or restored)."""
    expected = f"__torch__.torch.classes.torch_monitor.{cls._script_class}"
    if script_object._type().qualified_name() != expected:
        raise TypeError(f"{cls.__name__} cannot wrap a {script_object._type().qualified_name()}")
    return _C._wrap(cls, script_object)


def _copy_methods(cls_name: str, spelling: Spelling) -> Dict[str, Any]:
    if spelling.copies == "state":

        def reduce_ex(self: Any, protocol: Any) -> Any:
            return _restore, (type(self), self._call("__getstate__", (), {}))

        def copy(self: Any) -> Any:
            return _restore(type(self), self._call("__getstate__", (), {}))

        return {"__reduce_ex__": reduce_ex, "__copy__": copy, "__deepcopy__": lambda self, memo: copy(self)}

    def refuse(self: Any, *args: Any) -> Any:
        raise TypeError(f"a {cls_name} cannot be {'pickled' if args else 'copied'}: {spelling.no_pickle}")

    if spelling.copies == "share":
        return {"__reduce_ex__": refuse, "__copy__": lambda self: self, "__deepcopy__": lambda self, memo: self}
    return {"__reduce_ex__": refuse, "__copy__": refuse, "__deepcopy__": lambda self, memo: refuse(self)}


def _repr(cls_name: str, spelling: Spelling) -> Callable[[Any], str]:
    if spelling.repr_method is not None:
        method = spelling.repr_method
        return lambda self: self._call(method, (), {})

    def repr_(self: Any) -> str:
        config = self._call("__obj_flatten__", (), {})
        return f"{cls_name}(" + ", ".join(f"{k}={v!r}" for k, v in config) + ")"

    return repr_


def signature_from_doc(function: Any) -> inspect.Signature:
    """The signature of a pybind11 function, read from the first line of its
    docstring (``name(self: T, a: int, b: str = 'x') -> None``, as pybind11
    writes it from the C++ types), without ``self``: for help() and
    ``inspect.signature`` of the binding's classes, which pybind11 gives no
    ``__text_signature__``."""
    line = function.__doc__.splitlines()[0]
    tree = ast.parse(f"def _{line[line.index('('):]}: ...")
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    args = node.args.args[1:]  # self
    defaults = [None] * (len(args) - len(node.args.defaults)) + node.args.defaults
    parameters = [
        inspect.Parameter(
            arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=inspect.Parameter.empty if default is None else ast.literal_eval(default),
            annotation=ast.unparse(arg.annotation) if arg.annotation else inspect.Parameter.empty)
        for arg, default in zip(args, defaults)
    ]
    return inspect.Signature(
        parameters, return_annotation=ast.unparse(node.returns) if node.returns else inspect.Signature.empty)


# What help() says of the members every face gets from this module.
_MEMBER_DOCS = {
    "__getstate__": "The saved state: the object's TorchScript state, its version first.",
    "__reduce_ex__": "Pickles the object, or refuses to (docs/api.md, \"Copies\").",
    "__copy__": "copy.copy(): as pickling does (docs/api.md, \"Copies\").",
    "__deepcopy__": "copy.deepcopy(): as pickling does (docs/api.md, \"Copies\").",
    "__repr__": "The class and its configuration.",
    "__str__": "The class and its configuration.",
    "__init__": "Makes the object: the arguments are the class's (see its signature above).",
    "__obj_flatten__": "The configuration as (name, value) pairs, which PyTorch 2 makes its fake object of.",
    "__enter__": "Enters the ``with`` block; returns the object.",
    "__exit__": "Leaves the ``with`` block.",
}


def _as_member(cls_name: str, name: str, function: types.FunctionType) -> types.FunctionType:
    """``function`` as member ``name`` of a face class: a copy named so and
    documented, so that help() shows ``name(signature)`` and what it does,
    not a lambda, the helper it was made from, or a comment above it (one
    helper serves several members and classes, hence the copy). The helpers
    are annotated ``Any`` throughout: the copy shows no annotations."""
    member = types.FunctionType(
        function.__code__, function.__globals__, name, function.__defaults__, function.__closure__)
    member.__kwdefaults__ = function.__kwdefaults__
    member.__dict__.update(function.__dict__)
    member.__qualname__ = f"{cls_name}.{name}"
    member.__module__ = "torch_monitor"
    member.__doc__ = function.__doc__ or _MEMBER_DOCS.get(name)
    return member


class _FaceType(type(_C.Face)):  # type: ignore[misc]
    """The faces' metaclass: ``dir()`` (hence ``help()`` and completion)
    shows a face's own members, not ``torch.ScriptObject``'s operator methods
    (``__abs__``, ``__iadd__``, ...), which no face implements."""

    def __dir__(cls) -> List[str]:
        names = set()
        for klass in cls.__mro__:
            if klass is _C.Face:
                break
            names.update(vars(klass))
        return sorted(names | {"__eq__", "__hash__", "__ne__"})


#: The face of each ``torch.classes.torch_monitor`` class, by its name.
FACE_CLASSES: Dict[str, type] = {}


def make_face(cls_name: str, spelling: Spelling) -> type:
    """The Python class of ``torch.classes.torch_monitor.<cls_name>``."""
    namespace: Dict[str, Any] = {
        "_script_class": cls_name,
        "_spelling": spelling,
        "__module__": "torch_monitor",
        "__slots__": (),
    }
    methods = _C._script_methods(cls_name)
    for schema, doc in methods:
        name = schema.name
        if name == "__init__":
            namespace["__init__"] = _constructor(cls_name, schema, spelling)
            namespace["__doc__"] = doc
        elif (not name.startswith("__") or name == "__obj_flatten__") and name not in spelling.methods:
            namespace[name] = _method(cls_name, schema, doc, spelling)
    properties = dict(spelling.properties)
    for name in spelling.getters:
        getter = namespace.pop(name, None)
        if getter is None:
            raise AssertionError(f"{cls_name}.{name}: no TorchScript method {name}")
        properties[name] = (getter, getter.__face_signature__.rpartition(" -> ")[2], getter.__doc__)
    for prop, (getter, returns, doc) in properties.items():
        namespace[prop] = property(getter, doc=doc)
        namespace[prop].fget.__face_property__ = returns
    if any(schema.name == "__getstate__" for schema, _ in methods):
        # The TorchScript state (its version first), not torch.ScriptObject's.
        namespace["__getstate__"] = lambda self: self._call("__getstate__", (), {})
    namespace.update(_copy_methods(cls_name, spelling))
    namespace.update({"__repr__": _repr(cls_name, spelling), "__str__": _repr(cls_name, spelling)})
    namespace.update(spelling.methods)
    for name, value in namespace.items():
        if not isinstance(value, types.FunctionType):
            continue
        if value.__name__ != name:
            namespace[name] = _as_member(cls_name, name, value)
        elif not value.__doc__:
            value.__doc__ = _MEMBER_DOCS.get(name)
    cls = _FaceType(cls_name, (_C.Face,), namespace)
    _C._harden_face_class(cls)
    if spelling.install is not None:
        spelling.install(cls)
    FACE_CLASSES[cls_name] = cls
    return cls


def stub(cls: type) -> str:
    """The type stub of face class ``cls`` (scripts/gen_stubs.py writes them
    all to ``_spellings.pyi``): the same signatures its methods were made
    with."""
    spelling = cls._spelling
    lines = [f"class {cls.__name__}(Face):"]
    for name, value in sorted(vars(cls).items()):
        if isinstance(value, property):
            lines += ["    @property", f"    def {name}(self) -> {value.fget.__face_property__}: ..."]
        elif name in spelling.overloads:
            for signature in spelling.overloads[name]:
                lines += ["    @overload", f"    def {name}{signature}: ..."]
        elif name in spelling.signatures:
            lines.append(f"    def {name}{spelling.signatures[name]}: ...")
        elif hasattr(value, "__face_signature__"):
            signature = re.sub(r"= _default_\w+", "= ...", value.__face_signature__)
            lines.append(f"    def {name}{signature}: ...")
    return "\n".join(lines) + "\n"


def make_op_face(op_name: str, spelling: Spelling, doc: str) -> Callable[..., Any]:
    """The Python function of the op ``torch.ops.torch_monitor.<op_name>``:
    its schema's signature, every argument checked by its kind, then the op
    (so torch.compile and torch.export trace the same call)."""
    op = getattr(torch.ops.torch_monitor, op_name).default
    function = _function("", op._schema, spelling, {"_op": op}, "_op(*{values})")
    function.__doc__ = doc
    function.__module__ = "torch_monitor"
    return function
