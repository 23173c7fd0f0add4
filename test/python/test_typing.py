"""The package is typed for its users: mypy --strict checks code using it.

typing/typed_usage_ok.py (typical use, fully annotated) must pass
`mypy --strict` against the installed package (py.typed, the generated
_C.pyi); typing/typed_usage_bad.py must fail with exactly one error on each
line marked `# error:`. Both are checked from a scratch folder, so the
installed package is what mypy reads, not the source tree.

The docs are typed examples too: every Python block of README.md and
docs/*.md that test_docs.py runs passes `mypy --strict` (one mypy run over
all of them, each block a module whose line numbers are the Markdown
file's, importing the block it continues; the errors are reported at the
Markdown lines).
"""

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import test_docs

pytest.importorskip("mypy")
pytest.importorskip("torch_monitor")

TYPING = pathlib.Path(__file__).resolve().parent / "typing"


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    """One cache for the module's mypy runs: torch is analysed once."""
    return tmp_path_factory.mktemp("mypy_cache")


def mypy(cwd, cache, *args):
    """(exit status, output) of `mypy --strict ARGS` run in ``cwd``."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-color-output",
         "--cache-dir", str(cache), *args],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def mypy_results(tmp_path_factory, mypy_cache):
    """{file name: (exit status, output)} of one mypy run per file."""
    work = tmp_path_factory.mktemp("typing")
    results = {}
    for name in ("typed_usage_ok.py", "typed_usage_bad.py"):
        shutil.copy(TYPING / name, work / name)
        results[name] = mypy(work, mypy_cache, name)
    return results


def test_typical_use_passes_mypy_strict(mypy_results):
    status, output = mypy_results["typed_usage_ok.py"]
    assert status == 0, output


def test_mistakes_are_found(mypy_results):
    status, output = mypy_results["typed_usage_bad.py"]
    assert status == 1, output
    source = (TYPING / "typed_usage_bad.py").read_text().splitlines()
    expected = {i + 1 for i, line in enumerate(source) if "  # error:" in line}
    found = [
        int(m.group(1))
        for m in re.finditer(r"^typed_usage_bad\.py:(\d+): error:", output, re.M)
    ]
    assert sorted(found) == sorted(expected), output


# ------------------------------------------------------------ the docs

DOCS_MYPY_CONFIG = """
[mypy]
# torch.jit.load and Tensor.backward are not annotated in torch: calling
# them is an untyped call, which is torch's gap, not the docs'.
untyped_calls_exclude = torch.jit, torch._tensor.Tensor.backward
# torch.distributed re-exports TCPStore (and the other c10d classes) without
# saying so in a way mypy --strict accepts: torch's gap, not the docs'.
[mypy-torch.distributed]
implicit_reexport = True
# Optional dependencies the docs use, which ship no type information.
[mypy-tensorboard.*]
ignore_missing_imports = True
"""


def test_doc_blocks_pass_mypy_strict(tmp_path, mypy_cache):
    """One mypy run over every block test_docs.py runs, each in a module of
    its own (test_docs.block_source: doc_block_N.py, whose line numbers are
    the Markdown file's). The errors are listed at the Markdown lines."""
    blocks = test_docs.RUNNABLE_PYTHON_BLOCKS
    assert blocks
    (tmp_path / "mypy.ini").write_text(DOCS_MYPY_CONFIG)
    where = {"doc_header.py": {}}  # file written: {its line: "file:line" to report}
    for block in blocks:
        test_docs.write_chain(block, tmp_path)
        source = test_docs.block_source(block)
        doc = block.path.relative_to(test_docs.ROOT)
        where[f"{test_docs.module_name(block)}.py"] = {
            line: f"{doc}:{line}" for line in range(1, source.count("\n") + 2)
        }
    continued = sorted({test_docs.module_name(b.continues) for b in blocks if b.continues})
    if continued:
        # The names a block imports (torch, torch_monitor, ...) reach the
        # block that continues it through `from doc_block_N import *`, as
        # when the blocks run.
        with open(tmp_path / "mypy.ini", "a") as config:
            config.write(f"[mypy-{','.join(continued)}]\nimplicit_reexport = True\n")
    status, output = mypy(tmp_path, mypy_cache, "--config-file", "mypy.ini", *where)
    messages = []  # at the Markdown lines, each once
    for line in output.splitlines():
        m = re.match(r"([\w/]+\.py):(\d+):(.*)", line)
        if m and int(m.group(2)) in where.get(m.group(1), {}):
            line = where[m.group(1)][int(m.group(2))] + ":" + m.group(3)
        if line not in messages:
            messages.append(line)
    assert status == 0, (
        f"mypy --strict over the {len(blocks)} Python blocks test_docs.py runs:\n"
        + "\n".join(messages)
    )
