"""Every use of private internals of torch or CPython in torch_monitor's Python code.

Each function here leans on something torch or Python does not promise to
keep; each has a test that fails loudly (naming the function) when an
upgrade breaks it, in ``test/python/test_internals.py`` unless its docstring
names another file. Code elsewhere in the
package calls these functions, never ``torch._*`` itself. (The C++ binding's
counterpart is ``csrc/python/pybind_internals.h``.)
"""

import linecache
import weakref
from typing import Dict, List

import torch


def custom_class_schemas(namespace: str) -> Dict[str, List["torch.FunctionSchema"]]:
    """{class name: [method schemas]} of the custom classes in ``namespace``.

    Uses ``torch._C._jit_get_custom_class_schemas`` (no public API lists a
    custom class's methods); the fake classes are built from it.
    """
    prefix = f"__torch__.torch.classes.{namespace}."
    out: Dict[str, List[torch.FunctionSchema]] = {}
    for schema in torch._C._jit_get_custom_class_schemas():
        self_type = str(schema.arguments[0].type) if schema.arguments else ""
        if self_type.startswith(prefix):
            out.setdefault(self_type[len(prefix):], []).append(schema)
    return out


def register_fake_class(qualname: str, fake_class: type) -> None:
    """``torch._library.register_fake_class`` (the documented way to make a
    custom class traceable, still under a private module)."""
    torch._library.register_fake_class(qualname, fake_class)


def run_torchbind_methods_on(face_types: tuple) -> None:
    """Lets compiled and exported graphs call methods of our Python faces.

    The faces are ScriptObject subclasses whose hot methods (``Stat.add``,
    14 ns) are raw C functions shadowing the TorchScript methods (a
    ``torch.ScriptMethod`` call costs about 1 us). PyTorch 2 expects
    ``getattr(obj, name)`` to be a ScriptMethod in two places, and for those
    types each is pointed at the TorchScript method here:

    * the eager kernel of ``call_torchbind`` (a traced method call, run by
      the compiled or exported graph) calls
      ``torch.ScriptMethod.__call__(getattr(obj, name), ...)``;
    * ``FakeScriptMethod`` takes the method's schema from it (AOTAutograd's
      effect tokens, hence inductor and strict export, need the schema).
    """
    from torch._C import DispatchKey
    from torch._higher_order_ops.torchbind import call_torchbind
    from torch._library.fake_class_registry import FakeScriptMethod

    if getattr(FakeScriptMethod, "_torch_monitor_faces", None) is not None:
        return
    FakeScriptMethod._torch_monitor_faces = face_types

    def script_method(obj, name):
        return torch.ScriptObject.__getattr__(obj, name)

    key = DispatchKey.CompositeExplicitAutograd
    original_kernel = call_torchbind.py_kernels[key]

    def kernel(obj, method, *args, **kwargs):
        if isinstance(obj, face_types):
            return script_method(obj, method)(*args, **kwargs)
        return original_kernel(obj, method, *args, **kwargs)

    call_torchbind.py_kernels[key] = kernel
    call_torchbind._dispatch_cache.clear()

    original_init = FakeScriptMethod.__init__

    def init(self, self_fake_obj, method_name, schema):
        if schema is None:
            real = object.__getattribute__(self_fake_obj, "real_obj")
            if isinstance(real, face_types):
                schema = script_method(real, method_name).schema
        original_init(self, self_fake_obj, method_name, schema)

    FakeScriptMethod.__init__ = init


def keep_real_objects_in_strict_export(namespace: str) -> None:
    """Makes ``torch.export.export(..., strict=True)`` keep our real objects.

    A module attribute holding one of our objects reaches the exported
    program's constants as the FakeScriptObject that Dynamo traced with (torch
    2.13: ``functional_export`` turns the captured graph input into a
    ``get_attr`` of its fake example value, and ``_strict_export``, unlike
    ``_non_strict_export``, never maps fakes back to real objects), so
    ``ep.module()`` fails with "FakeScriptObject should only exist during
    tracing". No method or flattened content of the class can avoid it; the
    only opt-out, ``tracing_mode() == "real"``, would run the real methods
    while tracing (a Stat would count values that were never added). So:

    * ``maybe_to_fake_obj`` (which Dynamo calls through the module
      attribute) remembers, weakly, the object each fake of ours stands for;
    * ``_strict_export`` then puts that object back in place of the fake in
      the constants, as the non-strict path does with its own map.

    Fakes of other libraries' classes are left alone. Tested (and checked to
    be still needed) in ``test/python/test_pt2_strict_export.py``.
    """
    from torch._library import fake_class_registry as registry
    from torch.export import _trace

    if getattr(_trace._strict_export, "_torch_monitor_real_objects", False):
        return
    prefix = f"__torch__.torch.classes.{namespace}."
    attribute = "_torch_monitor_real_object"

    def ours(fake) -> bool:
        return isinstance(fake, registry.FakeScriptObject) and object.__getattribute__(
            fake, "script_class_name"
        ).startswith(prefix)

    to_fake = registry.maybe_to_fake_obj

    def maybe_to_fake_obj(fake_mode, x):
        fake = to_fake(fake_mode, x)
        if ours(fake):
            # FakeScriptObject forbids setattr; its __deepcopy__ carries this over.
            object.__setattr__(fake, attribute, weakref.ref(x))
        return fake

    strict_export = _trace._strict_export

    def real_object(fake):
        ref = object.__getattribute__(fake, "__dict__").get(attribute)
        real = ref() if ref is not None else None
        if real is None:
            raise RuntimeError(
                "torch_monitor: strict torch.export produced a fake "
                f"{object.__getattribute__(fake, 'script_class_name')} whose real "
                "object is unknown or gone; export with strict=False instead."
            )
        return real

    def _strict_export(*args, **kwargs):
        artifact = strict_export(*args, **kwargs)
        constants = artifact.aten.constants
        for name, value in constants.items():
            if ours(value):
                constants[name] = real_object(value)
        return artifact

    _strict_export._torch_monitor_real_objects = True
    # The unpatched functions, for the test that checks torch still needs this.
    _strict_export._torch_monitor_unpatched = (strict_export, to_fake)
    registry.maybe_to_fake_obj = maybe_to_fake_obj
    _trace._strict_export = _strict_export


def add_source_to_linecache(filename: str, source: str) -> None:
    """Registers generated source so ``inspect.getsource`` (hence
    ``torch.jit.script``) can read it. ``linecache.cache`` is a documented
    module attribute but its entry layout is not; mtime None keeps
    ``linecache.checkcache()`` from dropping the entry."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def remove_source_from_linecache(filename: str) -> None:
    linecache.cache.pop(filename, None)
