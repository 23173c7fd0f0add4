"""Writes the type stubs of the compiled module and of the faces, from their definitions.

torch_monitor/_C.pyi types the compiled module; torch_monitor/_spellings.pyi
the Python faces of the C++ objects, with the very signatures
torch_monitor/_faces.py made them with from the TorchScript schemas.

Nothing in the stub is written by hand. Every class and function of
``torch_monitor._C`` states its signature where it is defined in C++ (pybind11
puts ``name(arg: type, ...) -> type`` first in each docstring; the raw CPython
fast methods spell their docstrings the same way), and the methods a face gets
from its TorchScript class are typed from the C++ schemas. Run after changing
the binding:

    python -P scripts/gen_stubs.py            # rewrites both stubs
    python -P scripts/gen_stubs.py --check    # exits 1 if a stub is stale

test/python/test_stubs.py runs the check.
"""

import argparse
import difflib
import inspect
import pathlib
import re
import sys

import torch
import torch_monitor
from torch_monitor import _C, _faces, _spellings

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "torch_monitor"

# pybind11 and schema spellings of types -> stub spellings
_PYBIND_TYPES = [
    (r"\btorch_monitor\._C\.", ""),
    (r"^handle$|^object$|^capsule$", "Any"),
    (r"^function$", "Callable[..., Any]"),
    # A C++ double or integer parameter: torch 2.13's pybind11 (3.0.4) names
    # it "typing.SupportsFloat | typing.SupportsIndex", torch 2.11's (3.0.1)
    # "typing.SupportsFloat" (likewise for int). One stub serves both: the
    # narrower spelling, which holds for both.
    (r"\btyping\.Supports(Float|Int) \| typing\.SupportsIndex\b", r"typing.Supports\1"),
]
_SCHEMA_TYPES = {
    "float": "float", "int": "int", "bool": "bool", "str": "str", "Any": "Any",
    "Tensor": "torch.Tensor", "NoneType": "None", "Device": "torch.device",
    "ScalarType": "torch.dtype",
}
_SIGNATURE = re.compile(r"^(\w*)\((.*)\)(?: -> (.+))?$")


def _pybind_type(text: str) -> str:
    for pattern, replacement in _PYBIND_TYPES:
        text = re.sub(pattern, replacement, text.strip())
    return text


def _split_top_level(text: str):
    """Splits ``a: T[x, y], b`` at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char in "[(" and 1 or (char in "])" and -1 or 0)
        if char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def _pybind_args(text: str) -> str:
    args = []
    for i, part in enumerate(_split_top_level(text)):
        name, _, rest = part.partition(":")
        if i == 0 and name.strip() == "self":
            args.append("self")
            continue
        if part.strip() in ("*", "/"):  # keyword-only / positional-only marker
            args.append(part.strip())
            continue
        if not rest:  # no type given: "name" or "name=default"
            name, equals, _default = part.partition("=")
            args.append(f"{name.strip()}: Any" + (" = ..." if equals else ""))
            continue
        kind, equals, _default = rest.partition("=")
        args.append(f"{name.strip()}: {_pybind_type(kind)}" + (" = ..." if equals else ""))
    return ", ".join(args)


def _schema_type(type_) -> str:
    if isinstance(type_, torch.OptionalType):  # str() gives "Optional[T]"
        return f"Optional[{_schema_type(type_.getElementType())}]"
    return _schema_type_text(str(type_))


def _schema_type_text(text: str) -> str:
    if text.endswith("[]"):
        return f"List[{_schema_type_text(text[:-2])}]"
    if text.startswith("Dict("):
        key, value = text[5:-1].split(", ", 1)
        return f"Dict[{_schema_type_text(key)}, {_schema_type_text(value)}]"
    if text.startswith("("):
        return "Tuple[Any, ...]"
    if text.startswith("__torch__.torch.classes."):
        return "torch.ScriptObject"
    return _SCHEMA_TYPES.get(text, "Any")


def _signatures(obj):
    """The ``name(args) -> ret`` lines heading a docstring (several when
    pybind11 lists overloads)."""
    lines = (getattr(obj, "__doc__", None) or "").splitlines()
    found = []
    for line in lines:
        line = re.sub(r"^\d+\. ", "", line.strip())
        match = _SIGNATURE.match(line)
        if match and "): " in match.group(2):
            continue  # prose such as "before(value, training): captures (...)"
        # a property getter's line has no name
        if match and match.group(1) in (getattr(obj, "__name__", ""), "__init__", ""):
            found.append(match)
    return [m for m in found if m.group(2) != "*args, **kwargs"]


def _def(name: str, args: str, returns: str, indent: str, overload: bool) -> str:
    args = _pybind_args(args)
    returns = _pybind_type(returns or "None")
    head = f"{indent}@overload\n" if overload else ""
    return f"{head}{indent}def {name}({args}) -> {returns}: ...\n"


def _function(name: str, obj, indent: str = "") -> str:
    matches = _signatures(obj)
    if not matches:
        return f"{indent}def {name}(*args: Any, **kwargs: Any) -> Any: ...\n"
    return "".join(
        _def(name, m.group(2), m.group(3), indent, len(matches) > 1) for m in matches
    )


def _schema_method(schema) -> str:
    args = ["self"]
    for argument in schema.arguments[1:]:
        default = " = ..." if argument.default_value is not None else ""
        args.append(f"{argument.name}: {_schema_type(argument.type)}{default}")
    returns = [_schema_type(r.type) for r in schema.returns]
    result = returns[0] if len(returns) == 1 else "None"
    return f"    def {schema.name}({', '.join(args)}) -> {result}: ...\n"


def _class(name: str, cls) -> str:
    bases = [b for b in cls.__bases__ if b is not object]
    base = ", ".join(
        "torch.ScriptObject" if b is torch.ScriptObject else b.__name__ for b in bases
        if b.__name__ != "pybind11_object"
    )
    out = [f"class {name}({base}):\n" if base else f"class {name}:\n"]
    script_class = vars(cls).get("_script_class")
    schemas = {s.name: s for s, _doc in (_C._script_methods(script_class) if script_class else [])}
    for attr, value in sorted(vars(cls).items()):
        if attr.startswith("__") and attr not in ("__init__", "__call__", "__enter__", "__exit__"):
            continue
        if attr == "_pybind11_conduit_v1_":  # pybind11's own, not ours
            continue
        if attr == "_script_class":
            out.append("    _script_class: str\n")
        elif isinstance(value, property):
            matches = _signatures(value.fget)
            returns = _pybind_type(matches[0].group(3)) if matches else "Any"
            out.append(f"    @property\n    def {attr}(self) -> {returns}: ...\n")
            if value.fset is not None:
                out.append(f"    @{attr}.setter\n    def {attr}(self, value: {returns}) -> None: ...\n")
        elif isinstance(value, type(_C.Aggregation.MEAN)):  # enum members
            out.append(f"    {attr}: {name}\n")
        elif attr in schemas and (
            getattr(value, "__module__", None) == "torch_monitor._faces"  # forwarded
            or not _signatures(value)  # a raw C method: typed as in TorchScript
        ):
            out.append(_schema_method(schemas[attr]))
        elif callable(value):
            out.append(_function(attr, value, "    "))
    if len(out) == 1:
        out.append("    ...\n")
    return "".join(out)


def render() -> str:
    parts = [
        '"""Type stub of torch_monitor._C, generated by scripts/gen_stubs.py: do not edit."""\n\n',
        "import collections.abc\nimport datetime\nimport typing\n",
        "from typing import Any, Callable, Dict, List, Optional, Tuple, Union, overload\n\n",
        "import torch\n",
    ]
    for name, value in sorted(vars(_C).items()):
        if name.startswith("__"):
            continue
        if isinstance(value, type):
            parts.append("\n\n" + _class(name, value))
        elif callable(value):
            parts.append("\n" + _function(name, value))
        else:
            parts.append(f"\n{name}: {type(value).__name__}\n")
    return "".join(parts)


def render_faces() -> str:
    parts = [
        '"""Type stub of the Python faces (torch_monitor/_faces.py), generated by '
        'scripts/gen_stubs.py: do not edit."""\n\n',
        "import datetime\nimport os\n",
        "from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, TypeVar, Union, overload\n\n",
        "import torch\n\n",
        "from ._C import Aggregation, Event, Face\n\n",
        '_Sink = TypeVar("_Sink")\n',
    ]
    for name, face in vars(_spellings).items():
        if isinstance(face, type) and "_script_class" in vars(face):
            parts.append("\n\n" + _faces.stub(face))
        elif callable(face) and hasattr(face, "__face_signature__"):  # an op's function
            parts.append(f"\n\ndef {name}{face.__face_signature__}: ...\n")
    return "".join(parts)


def _annotation(annotation) -> str:
    """An annotation (object or string) as stub text."""
    if annotation is inspect.Parameter.empty:
        return "Any"
    if isinstance(annotation, str):
        return annotation
    text = inspect.formatannotation(annotation)
    return re.sub(r"\b(?:torch\.nn\.modules\.module|typing)\.", "", text).replace("torch.Tensor", "Tensor")


def _stub_signature(function) -> str:
    signature = inspect.signature(function)
    params = []
    star = False
    for p in signature.parameters.values():
        text = p.name if p.name == "self" else f"{p.name}: {_annotation(p.annotation)}"
        if p.kind is p.VAR_POSITIONAL:
            text, star = f"*{p.name}: {_annotation(p.annotation)}", True
        elif p.kind is p.VAR_KEYWORD:
            text = f"**{p.name}: {_annotation(p.annotation)}"
        elif p.kind is p.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        if p.default is not p.empty:
            text += " = ..."
        params.append(text)
    returns = signature.return_annotation
    return f"({', '.join(params)}) -> {'None' if returns is inspect.Signature.empty and function.__name__ == '__init__' else _annotation(returns)}"


def render_module(module) -> str:
    """A stub of a Python module whose classes get signatures at run time
    (the reducers' constructors and parameter properties come from the C++
    table of kinds): the live signatures, written out."""
    parts = [
        f'"""Type stub of {module.__name__}, generated by scripts/gen_stubs.py from the live '
        'classes (their constructors come from the C++ table of reducer kinds): do not edit."""\n\n',
        "from typing import Any, Callable, Dict, List, Literal, Optional, Tuple, Union\n\n",
        "import torch\nfrom torch import Tensor, nn\n\n",
        f"__all__ = {module.__all__!r}\n",
    ]
    for name in module.__all__:
        cls = getattr(module, name)
        bases = ", ".join(b.__name__ if b.__module__ == module.__name__ else f"{b.__module__.replace('torch.nn.modules.module', 'nn')}.{b.__name__}" for b in cls.__bases__ if b is not object)
        lines = [f"class {name}({bases}):" if bases else f"class {name}:"]
        for attr, value in sorted(vars(cls).items()):
            if isinstance(value, property):
                returns = _annotation(inspect.signature(value.fget).return_annotation)
                lines += ["    @property", f"    def {attr}(self) -> {returns}: ..."]
                if value.fset is not None:
                    lines += [f"    @{attr}.setter", f"    def {attr}(self, value: {returns}) -> None: ..."]
            elif callable(value) and (not attr.startswith("_") or attr in ("__init__", "__call__")):
                lines.append(f"    def {attr}{_stub_signature(value)}: ...")
        if len(lines) == 1:
            lines.append("    ...")
        parts.append("\n\n" + "\n".join(lines) + "\n")
    return "".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a stub is stale")
    check = parser.parse_args().check
    stale = 0
    stubs = (
        (PACKAGE / "_C.pyi", render()),
        (PACKAGE / "_spellings.pyi", render_faces()),
        (PACKAGE / "reducers.pyi", render_module(torch_monitor.reducers)),
    )
    for stub, text in stubs:
        current = stub.read_text() if stub.exists() else ""
        if not check:
            stub.write_text(text)
            print(f"wrote {stub} ({len(text.splitlines())} lines)")
        elif text != current:
            sys.stdout.writelines(
                difflib.unified_diff(current.splitlines(True), text.splitlines(True), str(stub), "generated")
            )
            print(f"\n{stub} is stale: run python -P scripts/gen_stubs.py", file=sys.stderr)
            stale = 1
    return stale


if __name__ == "__main__":
    sys.exit(main())
