"""Guards for torch_monitor/_internals.py: every private internal of torch or
CPython that the Python package relies on has a test here that fails loudly,
naming the function, when a torch or Python upgrade breaks it."""

import inspect
import linecache
import pathlib
import re
from datetime import timedelta

import pytest
import torch

tm = pytest.importorskip("torch_monitor")
import torch._dynamo  # noqa: E402,F401  (torch_monitor's PyTorch 2 set-up runs on its import)
from torch_monitor import _internals  # noqa: E402


def test_custom_class_schemas_lists_methods_with_types():
    schemas = _internals.custom_class_schemas("torch_monitor")
    assert {"Stat", "IntStat", "DifferenceMonitor", "Reducer"} <= set(schemas), (
        "_internals.custom_class_schemas: torch._C._jit_get_custom_class_schemas "
        "no longer lists torch_monitor's classes"
    )
    add = {s.name: s for s in schemas["Stat"]}["add"]
    assert [str(r.type) for r in add.returns] == ["NoneType"]
    assert str(add.arguments[0].type) == "__torch__.torch.classes.torch_monitor.Stat"


def test_register_fake_class_reaches_the_registry():
    from torch._library.fake_class_registry import find_fake_class

    fake = find_fake_class("__torch__.torch.classes.torch_monitor.Stat")
    assert fake is not None and fake.__name__ == "FakeStat", (
        "_internals.register_fake_class: torch._library.register_fake_class moved"
    )


def test_call_torchbind_kernel_runs_face_methods():
    from torch._C import DispatchKey
    from torch._higher_order_ops.torchbind import call_torchbind

    kernel = call_torchbind.py_kernels[DispatchKey.CompositeExplicitAutograd]
    assert kernel.__module__ == "torch_monitor._internals", (
        "_internals.run_torchbind_methods_on: call_torchbind's eager kernel is "
        "no longer in py_kernels[CompositeExplicitAutograd]"
    )
    stat = tm.Stat("internals.kernel", [tm.COUNT], timedelta(hours=1))
    call_torchbind(stat, "add", 2.0)  # what a compiled graph does
    assert stat.count == 1


def test_fake_script_method_gets_the_face_schema():
    from torch._library.fake_class_registry import FakeScriptMethod, maybe_to_fake_obj
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert "self_fake_obj" in inspect.signature(FakeScriptMethod.__init__).parameters
    stat = tm.Stat("internals.schema", [tm.COUNT], timedelta(hours=1))
    fake = maybe_to_fake_obj(FakeTensorMode(), stat)
    assert fake.add.schema is not None, (
        "_internals.run_torchbind_methods_on: FakeScriptMethod no longer takes "
        "the schema the patch fills in"
    )
    assert fake.add.schema.name == "add"


def test_linecache_entries_serve_inspect():
    filename = "<torch_monitor internals test>"
    source = "def generated():\n    return 1\n"
    _internals.add_source_to_linecache(filename, source)
    try:
        linecache.checkcache()  # must keep an entry with mtime None
        namespace = {}
        exec(compile(source, filename, "exec"), namespace)
        assert inspect.getsource(namespace["generated"]) == source, (
            "_internals.add_source_to_linecache: linecache's entry layout changed"
        )
    finally:
        _internals.remove_source_from_linecache(filename)
    assert filename not in linecache.cache


def test_library_op_schemas_lists_the_ops():
    names = {s.name for s in _internals.library_op_schemas("torch_monitor")}
    assert {"torch_monitor::log_event", "torch_monitor::log_event_values"} <= names, (
        "_internals.library_op_schemas: torch._C._jit_get_all_schemas no longer "
        "lists torch_monitor's ops"
    )


def test_a_failing_pt2_step_warns_instead_of_breaking_import():
    def broken():
        raise AttributeError("module 'torch' has no attribute '_gone'")

    step = _internals._pt2_support(broken)
    with pytest.warns(RuntimeWarning, match="broken failed on torch .* may not work"):
        assert step() is None


def test_importing_the_package_warns_nothing_on_this_torch():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-P", "-W", "error::RuntimeWarning", "-c", "import torch_monitor"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_group_store_finds_the_store_of_default_and_new_groups():
    # In a subprocess: a process group is process-wide state.
    from isolated import run_isolated

    run_isolated(
        """
        import os, tempfile
        import torch.distributed as dist
        from torch_monitor import _internals
        path = os.path.join(tempfile.mkdtemp(), "store")
        dist.init_process_group("gloo", init_method="file://" + path, rank=0, world_size=1)
        store = _internals.group_store(dist.group.WORLD)
        assert isinstance(store, dist.Store), (
            "_internals.group_store: distributed_c10d._world.pg_map no longer "
            "maps a group to (backend, store)")
        store.set("k", "v")
        sub = _internals.group_store(dist.new_group([0]))
        assert isinstance(sub, dist.Store) and not sub.check(["k"])  # a PrefixStore
        dist.destroy_process_group()
        """,
        timeout=60,
    )


# Names of torch's and nn.Module's private internals, and the bypass of
# ScriptObject's attribute lookup: only _internals.py may use them.
_PRIVATE = re.compile(
    r"torch\._(?!C\.(?:Argument|FunctionSchema)\b)[A-Za-z_]"
    r"|\._(?:forward_pre_hooks|forward_hooks|global_forward_\w+|parameters|buffers|modules|c)\b"
    r"|ScriptObject\.__getattr__"
)


def test_private_internals_appear_only_in_internals_py():
    package = pathlib.Path(tm.__file__).parent
    stragglers = []
    for path in sorted(package.glob("*.py")):
        if path.name == "_internals.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _PRIVATE.search(code) and not code.lstrip().startswith(("\"\"\"", "``")):
                stragglers.append(f"{path.name}:{number}: {line.strip()}")
    assert not stragglers, "private internals outside _internals.py:\n" + "\n".join(stragglers)


# In the C++ binding: pybind11's detail namespace, CPython's private names,
# type-slot assignments, raw method descriptors, nn.Module's private dicts.
_PRIVATE_CPP = re.compile(
    r"py::detail::|pybind11::detail::|\b_Py[A-Z]\w*|->tp_(?!name\b)\w+\s*=|PyDescr_New"
    r'|"_(?:parameters|buffers|modules|forward_hooks|forward_pre_hooks)"'
)


def test_cpp_internals_appear_only_in_internals_cpp():
    binding = pathlib.Path(__file__).resolve().parents[2] / "csrc" / "python"
    stragglers = []
    for path in sorted(binding.glob("*.[ch]*")):
        if path.stem == "internals":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if _PRIVATE_CPP.search(code):
                stragglers.append(f"{path.name}:{number}: {line.strip()}")
    assert not stragglers, "internals outside csrc/python/internals.*:\n" + "\n".join(stragglers)


def test_dynamo_reorders_hook_inputs_is_false_from_torch_2_12():
    # 2.11 lacks torch._higher_order_ops.register_hook; 2.13 has it. Should a
    # later torch move it, watch() would break the graph for nothing.
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 12):
        assert not _internals.dynamo_reorders_hook_inputs(), (
            "_internals.dynamo_reorders_hook_inputs: torch."
            "_higher_order_ops.register_hook is gone; see how Dynamo now "
            "traces hooks on intermediate tensors"
        )


def test_uncompiled_module_unwraps_dynamos_wrapper():
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model, backend="eager")
    assert _internals.uncompiled_module(compiled) is model, (
        "_internals.uncompiled_module: torch.compile's wrapper is no longer "
        "torch._dynamo.eval_frame.OptimizedModule with _orig_mod"
    )
    assert _internals.uncompiled_module(model) is model
