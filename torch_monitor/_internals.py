"""Every use of private internals of torch or CPython in torch_monitor's Python code.

Each function here leans on something torch or Python does not promise to
keep; each has a test that fails loudly (naming the function) when an
upgrade breaks it, in ``test/python/test_internals.py`` unless its docstring
names another file. Code elsewhere in the
package calls these functions, never ``torch._*`` itself. (The C++ binding's
counterpart is ``csrc/python/internals.h``.)
"""

import copy
import functools
import importlib.abc
import importlib.util
import inspect
import linecache
import sys
import threading
import types
import warnings
import weakref
from typing import Callable, Dict, List, Optional

import torch


def _pt2_support(function):
    """Marks a step of the PyTorch 2 set-up done at import.

    These steps rest on torch internals as they are in the torch the package
    is tested with (2.13). On a torch whose internals differ, importing
    torch_monitor must still work (eager Python, TorchScript and C++ do not
    need any of this): a failing step becomes one RuntimeWarning naming it,
    and returns None. The tests of this module fail loudly instead.
    """

    @functools.wraps(function)
    def step(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as error:  # any torch-internal change
            warnings.warn(
                f"torch_monitor: {function.__name__} failed on torch "
                f"{torch.__version__} ({error!r}); torch.compile and "
                "torch.export of torch_monitor objects may not work",
                RuntimeWarning,
                stacklevel=2,
            )
            return None

    return step


@_pt2_support
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


@_pt2_support
def library_op_schemas(namespace: str) -> List["torch.FunctionSchema"]:
    """The schemas of the ops registered in ``namespace`` (``ns::name``).

    Uses ``torch._C._jit_get_all_schemas`` (no public API lists a library's
    ops); their fakes are derived from it."""
    prefix = f"{namespace}::"
    return [s for s in torch._C._jit_get_all_schemas() if s.name.startswith(prefix)]


@_pt2_support
def register_fake_class(qualname: str, fake_class: type) -> None:
    """``torch._library.register_fake_class`` (the documented way to make a
    custom class traceable, still under a private module)."""
    torch._library.register_fake_class(qualname, fake_class)


@_pt2_support
def mark_ordered_effect(qualname: str) -> None:
    """Marks an op that returns nothing as an ordered side effect, so that
    compiled and exported graphs keep it (and in order) rather than remove
    it as dead code. ``torch.library._register_effectful_op`` is the only
    way to say so for an op defined in C++."""
    from torch._library.effects import EffectType

    torch.library._register_effectful_op(qualname, EffectType.ORDERED)


@_pt2_support
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


def _is_our_fake(value, namespace: str) -> bool:
    """Whether ``value`` is the FakeScriptObject of a class of ``namespace``."""
    from torch._library.fake_class_registry import FakeScriptObject

    return isinstance(value, FakeScriptObject) and object.__getattribute__(
        value, "script_class_name"
    ).startswith(f"__torch__.torch.classes.{namespace}.")


@_pt2_support
def keep_captured_objects_in_strict_export(namespace: str) -> None:
    """Lets strict ``torch.export`` capture our objects held by the module.

    Dynamo makes each custom-class object it meets (a module attribute) a
    graph input. Torch 2.11's strict export (``_dynamo_graph_capture_for_export``
    in ``torch/_dynamo/functional_export.py``) asserts that every graph input
    is one of the user's arguments, so it fails on any module holding such an
    object, with an ``AssertionError`` naming the attribute's ``AttrSource``.
    Torch 2.13 skips such inputs there and its ``DynamoGraphTransformer``
    turns them into ``get_attr`` nodes of their fake (it takes their sources
    as ``graph_inputs``; upstream: pull request 173268, "Handle
    non-GetItemSource inputs in functional export", and its stack). On a
    torch without that parameter, this does the same for our objects only:

    * the captured graph's input-source map loses our objects' entries (the
      ordering that asserts sees only the user's arguments);
    * ``DynamoGraphTransformer.placeholder`` turns the placeholder of such
      an object into a ``get_attr`` of its fake, named as torch 2.13 names it.

    ``keep_real_objects_in_strict_export`` then swaps the real object in, as
    on torch 2.13. Tested (and checked to be still needed) in
    ``test/python/test_pt2_strict_export.py``.
    """
    from torch._dynamo import functional_export
    from torch._dynamo.source import GetItemSource

    transformer = functional_export.DynamoGraphTransformer
    if "graph_inputs" in inspect.signature(transformer.__init__).parameters:
        return  # this torch captures them itself
    if hasattr(transformer.placeholder, "_torch_monitor_unpatched"):
        return

    def example(node):
        return node.meta.get("val", node.meta.get("example_value"))

    capture = functional_export.fullgraph_capture

    def fullgraph_capture(*args, **kwargs):
        out = capture(*args, **kwargs)
        if out.backend_input is not None:
            graph = out.backend_input.graph_module.graph
            placeholders = graph.find_nodes(op="placeholder")
            metadata = out.graph_capture_output.output_graph.export_metadata
            sources = metadata.graph_input_idx_to_local_source
            for index in [
                i for i, source in sources.items()
                if not isinstance(source, GetItemSource)
                and _is_our_fake(example(placeholders[i]), namespace)
            ]:
                del sources[index]
        return out

    placeholder = transformer.placeholder

    def captured_placeholder(self, target, args, kwargs):
        node = self.current_node
        value = example(node)
        if node in self.old_to_new_mapping or not _is_our_fake(value, namespace):
            return placeholder(self, target, args, kwargs)
        name = f"_captured_{self.placeholders.index(node)}"
        setattr(self.module, name, value)
        proxy = self.tracer.create_proxy("get_attr", name, (), {})
        proxy.node.meta = dict(node.meta, val=value)
        return proxy

    # The unpatched functions, for the test that checks torch still needs this.
    captured_placeholder._torch_monitor_unpatched = (capture, placeholder)
    functional_export.fullgraph_capture = fullgraph_capture
    transformer.placeholder = captured_placeholder


@_pt2_support
def keep_real_objects_in_strict_export(namespace: str) -> None:
    """Makes ``torch.export.export(..., strict=True)`` keep our real objects.

    A module attribute holding one of our objects reaches the exported
    program's constants as the FakeScriptObject that Dynamo traced with (torch
    2.13: ``functional_export`` turns the captured graph input into a
    ``get_attr`` of its fake example value, and ``_strict_export``, unlike
    ``_non_strict_export``, never maps fakes back to real objects; torch 2.11
    after ``keep_captured_objects_in_strict_export``), so
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
    after_import("torch.export._trace", _pt2_support(lambda trace: _keep_real_objects(namespace, trace)))


def _keep_real_objects(namespace: str, _trace) -> None:
    from torch._library import fake_class_registry as registry

    if getattr(_trace._strict_export, "_torch_monitor_real_objects", False):
        return
    attribute = "_torch_monitor_real_object"

    to_fake = registry.maybe_to_fake_obj

    def maybe_to_fake_obj(fake_mode, x):
        fake = to_fake(fake_mode, x)
        if _is_our_fake(fake, namespace):
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
            if _is_our_fake(value, namespace):
                constants[name] = real_object(value)
        return artifact

    _strict_export._torch_monitor_real_objects = True
    # The unpatched functions, for the test that checks torch still needs this.
    _strict_export._torch_monitor_unpatched = (strict_export, to_fake)
    registry.maybe_to_fake_obj = maybe_to_fake_obj
    _trace._strict_export = _strict_export


@_pt2_support
def skip_discarded_pickles_in_export_save(namespace: str) -> None:
    """Lets torch 2.11's ``torch.export.save`` save a program holding a sink
    (below), checked and done at its first call: Dynamo, whose import runs
    this, may be imported halfway through serde's own import
    (``torch.export.load`` does that), when serde has no ``serialize`` yet."""
    save = torch.export.save
    if getattr(save, "_torch_monitor", False):
        return

    @functools.wraps(save)
    def save_once_patched(*args, **kwargs):
        _skip_discarded_pickles(namespace)
        return save(*args, **kwargs)

    save_once_patched._torch_monitor = True
    torch.export.save = save_once_patched


@_pt2_support
def _skip_discarded_pickles(namespace: str) -> None:
    """Lets torch 2.11's ``torch.export.save`` save a program holding a sink.

    The archive keeps a program's custom objects apart
    (``pt2_archive._package._package_constants`` saves them with
    ``torch._C._pickle_save``, the TorchScript pickle, which holds our
    objects' configuration). Torch 2.11's ``_package_exported_programs``
    then serializes the program with ``serde.serialize.serialize``, which
    also Python-pickles the constants and the state dict, and drops those
    bytes. Our sinks refuse Python pickling (a pickled sink would be a
    second writer of its files), so the save fails with their TypeError.
    Torch 2.13 passes ``serialize_constants=False`` (and
    ``serialize_state_dict=False``) there. On a torch whose ``serialize``
    lacks that parameter, that call skips pickling a dict holding one of
    our objects. Tested (and checked to be still needed) in
    ``test/python/test_pt2_sinks.py``.
    """
    from torch._export.serde import serialize as serde
    from torch.export.pt2_archive import _package

    if "serialize_constants" in inspect.signature(serde.serialize).parameters:
        return  # this torch does not pickle them
    if hasattr(_package.serialize, "_torch_monitor_unpatched"):
        return
    prefix = f"__torch__.torch.classes.{namespace}."
    packaging = threading.local()

    def holds_ours(artifact) -> bool:
        return isinstance(artifact, dict) and any(
            isinstance(value, torch.ScriptObject)
            and value._type().qualified_name().startswith(prefix)
            for value in artifact.values()
        )

    to_bytes = serde.serialize_torch_artifact

    def serialize_torch_artifact(artifact, *args, **kwargs):
        if getattr(packaging, "active", False) and holds_ours(artifact):
            return b""  # what _package_exported_programs drops
        return to_bytes(artifact, *args, **kwargs)

    package_serialize = _package.serialize

    def serialize(*args, **kwargs):
        outer = getattr(packaging, "active", False)
        packaging.active = True
        try:
            return package_serialize(*args, **kwargs)
        finally:
            packaging.active = outer

    # The unpatched functions, for the test that checks torch still needs this.
    serialize._torch_monitor_unpatched = (package_serialize, to_bytes)
    serde.serialize_torch_artifact = serialize_torch_artifact
    _package.serialize = serialize


_CPP_WRAPPER = "torch._inductor.codegen.cpp_wrapper_cpu"
_OUR_CLASSES = "__torch__.torch.classes.torch_monitor."


@_pt2_support
def pass_any_arguments_to_aoti_proxy_executor() -> None:
    """Makes AOTInductor pass tensors and ints given to our ``Any`` parameters.

    ``Stat.add(value)`` and ``DifferenceMonitor.before/after(value, ...)``
    take ``Any`` (a number or a tensor). AOTInductor's C++ wrapper codegen
    (``CppWrapperCpu.generate_extern_kernel_args_decl_if_needed``, torch
    2.13) treats an ``Any`` argument as static and passes nothing at run
    time, while the proxy executor that runs the call reads a tensor or an
    int given to ``Any`` from the run-time arrays: it reads past an empty
    array and the process crashes. Here the codegen sees ``Tensor`` or
    ``int`` for such an argument of a torch_monitor method, as the executor
    expects. Importing that codegen module costs seconds, so the patch waits
    for the first import of it.
    """
    after_import(_CPP_WRAPPER, _patch_cpp_wrapper)


_SCHEDULER = "torch._inductor.scheduler"


@_pt2_support
def keep_effectful_ops_in_order() -> None:
    """Makes inductor run ordered side effects (``Stat.add``, ``log_event``,
    the monitors' hooks) in program order.

    Inductor's lowering of ``with_effects`` (torch 2.13) chains each
    effectful op to the one before through ``V.graph.additional_star_deps``,
    keyed by the new op's buffer name (``buf3``); the scheduler looks the
    chain up by its node's operation name (``op3``), finds nothing, and runs
    the ops as their inputs come ready: ``stat.add(h[0, 0]); stat.add(x.sum())``
    compiled added ``x.sum()`` first, so VALUE was the wrong sample. Here
    the chain is keyed by operation name before the scheduler reads it (a
    torch that keys it so already is left alone). Importing the scheduler
    costs seconds, so the patch waits for its first import.
    """
    after_import(_SCHEDULER, _patch_scheduler)


def _patch_scheduler(module) -> None:
    from torch._inductor.virtualized import V

    original = module.Scheduler.compute_dependencies
    if getattr(original, "_torch_monitor", False):
        return

    def compute_dependencies(self):
        chained = getattr(V.graph, "additional_star_deps", None)
        if chained:
            for node in self.nodes:
                name = node.get_name()
                for buffer in node.get_outputs():
                    if buffer.get_name() != name and buffer.get_name() in chained:
                        chained[name].update(chained.pop(buffer.get_name()))
        return original(self)

    compute_dependencies._torch_monitor = True
    # For the test that checks torch still needs this.
    compute_dependencies._torch_monitor_unpatched = original
    module.Scheduler.compute_dependencies = compute_dependencies


@_pt2_support
def call_script_methods_across_graph_breaks() -> None:
    """Lets Dynamo call a script object's method that was looked up before a
    graph break: ``stat.add(loss.item())`` in a compiled step.

    ``.item()`` breaks the graph inside the call's arguments, so the bound
    method (``stat.add``, a builtin method: the hot path; a face's Python
    method, ``writer.add_scalar``) reaches the resumed frame as a local.
    Dynamo (torch 2.13) calls a builtin one through
    ``TorchScriptObjectVariable.call_method``, which takes only
    ``__setattr__``-like calls ("Weird method call on TorchScript object"),
    and inlines a Python one, whose body the fake object cannot run. The same
    call written without the break goes through ``var_getattr`` (one
    ``call_torchbind``), as this makes the resumed one go too.
    """
    after_dynamo_import(_patch_bound_method_calls)


def _patch_bound_method_calls(dynamo) -> None:
    from torch._dynamo.source import AttrSource
    from torch._dynamo.variables import functions
    from torch._dynamo.variables.base import VariableTracker
    from torch._dynamo.variables.script_object import TorchScriptObjectVariable
    from torch._dynamo.variables.user_defined import UserDefinedObjectVariable

    def builtin(self, tx):  # the script object and the method's name, or Nones
        if not isinstance(self.obj, TorchScriptObjectVariable):
            return None, None
        return self.obj, self.descriptor.__name__

    def python(self, tx):
        method = self.value
        if not (isinstance(method, types.MethodType) and isinstance(method.__self__, torch.ScriptObject)
                and self.source is not None):
            return None, None
        obj = VariableTracker.build(tx, method.__self__, AttrSource(self.source, "__self__"))
        return obj, method.__func__.__name__

    # An older Dynamo has no variable of its own for a bound builtin method.
    builtin_methods = getattr(functions, "BoundBuiltinMethodVariable", None)
    for cls, bound in ((builtin_methods, builtin), (UserDefinedObjectVariable, python)):
        if cls is None:
            continue
        original = cls.call_function
        if getattr(original, "_torch_monitor", False):
            continue

        def call_function(self, tx, args, kwargs, original=original, bound=bound):
            obj, name = bound(self, tx)
            if isinstance(obj, TorchScriptObjectVariable) and obj.source is not None:
                return obj.var_getattr(tx, name).call_function(tx, args, kwargs)
            return original(self, tx, args, kwargs)

        call_function._torch_monitor = True
        # For the test that checks torch still needs this.
        call_function._torch_monitor_unpatched = original
        cls.call_function = call_function


def after_import(name: str, set_up: "Callable[[object], None]") -> None:
    """Runs ``set_up(module)`` once module ``name`` is imported: now if it is,
    else right after its first import. PyTorch 2's machinery (Dynamo,
    ``torch.export._trace``, inductor's codegen) costs seconds to import,
    so what torch_monitor patches or registers there waits for the user to
    reach for it. Uses ``importlib``'s documented finder protocol; the
    loader's ``exec_module`` is wrapped."""
    module = sys.modules.get(name)
    if module is not None:
        set_up(module)
        return
    sys.meta_path.insert(0, _AfterImport(name, set_up))


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, set_up: "Callable[[object], None]") -> None:
        self.name, self.set_up = name, set_up

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module
        set_up = self.set_up

        def exec_module(module):
            execute(module)
            set_up(module)

        spec.loader.exec_module = exec_module
        return spec


def _patch_cpp_wrapper(module) -> None:
    from torch._higher_order_ops.torchbind import CallTorchBind

    wrapper = module.CppWrapperCpu
    original = wrapper.generate_extern_kernel_args_decl_if_needed
    if getattr(original, "_torch_monitor", False):
        return

    def generate(self, op_overload, raw_args, output_args, raw_outputs):
        if isinstance(op_overload, CallTorchBind):
            op_overload = _with_dynamic_any_arguments(op_overload, raw_args)
        return original(self, op_overload, raw_args, output_args, raw_outputs)

    generate._torch_monitor = True
    wrapper.generate_extern_kernel_args_decl_if_needed = generate


def _with_dynamic_any_arguments(call_torchbind, raw_args):
    """``call_torchbind`` whose schema for these arguments says ``Tensor`` or
    ``int`` where our method says ``Any`` and gets a buffer or an int."""
    from torch._inductor import ir

    schema = call_torchbind.schema(raw_args[0], raw_args[1])
    if not str(schema.arguments[0].type).startswith(_OUR_CLASSES):
        return call_torchbind
    arguments = []
    for argument, value in zip(schema.arguments, raw_args):
        kind = None
        if str(argument.type) == "Any":
            if isinstance(value, (ir.Buffer, ir.ReinterpretView)):
                kind = torch.TensorType.get()
            elif isinstance(value, int) and not isinstance(value, bool):
                kind = torch.IntType.get()
        if kind is not None:
            argument = torch._C.Argument(
                argument.name, kind, argument.N, argument.default_value,
                argument.kwarg_only, argument.alias_info,
            )
        arguments.append(argument)
    arguments += schema.arguments[len(arguments):]
    # Methods of custom classes take no varargs and return no varret.
    typed = torch._C.FunctionSchema(
        schema.name, schema.overload_name, arguments, schema.returns, False, False
    )
    # A copy: the shared operator keeps its own schema for every other call.
    patched = copy.copy(call_torchbind)
    patched.schema = lambda obj, method: typed
    return patched


def add_source_to_linecache(filename: str, source: str) -> None:
    """Registers generated source so ``inspect.getsource`` (hence
    ``torch.jit.script``) can read it. ``linecache.cache`` is a documented
    module attribute but its entry layout is not; mtime None keeps
    ``linecache.checkcache()`` from dropping the entry."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def remove_source_from_linecache(filename: str) -> None:
    linecache.cache.pop(filename, None)


def group_store(group) -> "torch.distributed.Store":
    """The c10d Store of a torch.distributed process group.

    torch keeps it in the private ``distributed_c10d._world.pg_map`` (group ->
    (backend name, store)); for a group other than the default one it is a
    PrefixStore, so keys of different groups never meet.
    """
    from torch.distributed import distributed_c10d

    return distributed_c10d._world.pg_map[group][1]


def script_method(obj: "torch.ScriptObject", name: str):
    """The TorchScript method ``name`` of a face, bound. The faces look their
    attributes up on their own class only (fast ``Stat.add``), so
    ``torch.ScriptObject``'s own ``__getattr__``, which finds TorchScript
    methods by name, is called directly."""
    return torch.ScriptObject.__getattr__(obj, name)


def forward_hooks_would_run(module: "torch.nn.Module") -> bool:
    """Whether calling ``module`` would run forward hooks (its own, or the
    global ones of ``torch.nn.modules.module``): nn.Module keeps them in
    private dicts, and offers no public way to ask."""
    from torch.nn.modules import module as nn_module

    return bool(
        module._forward_pre_hooks
        or module._forward_hooks
        or nn_module._global_forward_pre_hooks
        or nn_module._global_forward_hooks
    )


def forward_hook_handles(module: "torch.nn.Module", names: Dict[str, str]) -> "Optional[Dict[str, object]]":
    """Removable handles of the forward hooks of ``module`` whose functions
    have the given ``__name__``s: {"pre": name, "post": name} -> handles by
    side, or None unless each name matches exactly one hook. A deep copy of
    a module carries its hooks but no handles; nn.Module keeps the hooks in
    private dicts by id, and ``RemovableHandle`` has no public constructor
    for an existing id."""
    from torch.utils.hooks import RemovableHandle

    handles = {}
    for side, hooks in (("pre", module._forward_pre_hooks), ("post", module._forward_hooks)):
        if side not in names:
            continue
        found = [i for i, fn in hooks.items() if getattr(fn, "__name__", None) == names[side]]
        if len(found) != 1:
            return None
        handle = RemovableHandle(hooks)
        handle.id = found[0]
        handles[side] = handle
    return handles


def script_module_object(module: "torch.jit.ScriptModule"):
    """The C++ ``torch::jit::Module`` (a ``torch._C.ScriptModule``) under a
    Python ScriptModule: ``module._c``, what C++ functions taking a module
    need."""
    return module._c


def after_dynamo_import(set_up: "Callable[[object], None]") -> None:
    """``after_import`` for Dynamo (``torch._dynamo``), which torch.compile
    and torch.export import on first use."""
    after_import("torch._dynamo", _pt2_support(set_up))


def uncompiled_module(model: "torch.nn.Module") -> "torch.nn.Module":
    """The module a ``torch.compile(module)`` wrapper (Dynamo's
    ``OptimizedModule``) compiles, ``wrapper._orig_mod``; any other module
    as it is. Dynamo is loaded whenever such a wrapper exists, so this
    imports nothing. watch() watches the model under its own paths."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is not None and isinstance(model, eval_frame.OptimizedModule):
        return model._orig_mod
    return model


@functools.lru_cache(maxsize=None)  # a file-system lookup; watch() asks once per module
def dynamo_reorders_hook_inputs() -> bool:
    """Whether torch.compile breaks the graph's order when hooks on
    intermediate tensors capture one tensor (torch 2.11 and older).

    There Dynamo rewrites ``y.register_hook(hook)`` into an autograd.Function
    applied right after ``y`` and moves the Function's inputs along; a tensor
    that two such hooks capture (a watch's slots) lands below the first
    Function that uses it, and the compiled graph fails to run. Newer torch
    traces the hook as ``torch._higher_order_ops.register_hook``, which
    this looks for (without importing it: the package is imported with torch).
    """
    return importlib.util.find_spec("torch._higher_order_ops.register_hook") is None
