"""Every use of PyTorch's private internals in torch_monitor, in one place.

Each function here leans on something torch does not promise to keep; each
has a test in ``test/python/test_torch_internals.py`` that fails loudly
(naming the function) when a torch upgrade breaks it. Keep it that way: code
elsewhere in the package calls these functions, never ``torch._*`` itself.
"""

import linecache
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


def mark_ordered_effect(qualname: str) -> None:
    """Marks an op that returns nothing as an ordered side effect, so that
    compiled and exported graphs keep it (and in order) rather than remove
    it as dead code. ``torch.library._register_effectful_op`` is the only
    way to say so for an op defined in C++."""
    from torch._library.effects import EffectType

    torch.library._register_effectful_op(qualname, EffectType.ORDERED)


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


def add_source_to_linecache(filename: str, source: str) -> None:
    """Registers generated source so ``inspect.getsource`` (hence
    ``torch.jit.script``) can read it. ``linecache.cache`` is a documented
    module attribute but its entry layout is not; mtime None keeps
    ``linecache.checkcache()`` from dropping the entry."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def remove_source_from_linecache(filename: str) -> None:
    linecache.cache.pop(filename, None)
