"""Every code block of README.md and docs/*.md runs or compiles, so the docs
cannot drift from the code.

* ```python blocks are executed, each in a fresh process in a scratch folder,
  exactly as a reader sees them: a block brings its own imports and model. A
  block whose first line is ``# Continues the block above.`` runs after the
  Python block above it in the same file (which may continue its own), as a
  reader runs them one after the other.
* ```bash blocks marked ``<!-- test-run: repository root -->`` run verbatim
  (bash -e) from the repository root, as their text says to run them.
* ```cpp blocks are compiled against the installed package, all in one
  translation unit (one compiler run): each block in a function of its own
  namespace, with `#line` pointing compiler errors at the Markdown line.
  They are compiled, not linked or run. As fragments of a training program,
  they may use names a prelude declares here: ``<!-- test-with: NAME -->``
  just before the block (``model``, ``trainStep``, ...).

A block that cannot run on its own says why: ``<!-- skip-test: REASON -->``;
test_skipped_blocks_are_few lists and counts them. Other languages (bash,
cmake, json) are not run.
"""

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from cpp_build import build_project, import_torch_monitor, requires_toolchain

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Skips are reviewed when this grows: a skipped block is a block that can drift.
MAX_SKIPPED = 12

# ------------------------------------------------------------ preludes (C++)

CPP_PRELUDES = {
    # Declared, not defined: the blocks are compiled, never linked.
    "training": """
        #include <torch/torch.h>
        extern torch::nn::Sequential model;
        extern torch::Tensor x;
        extern int64_t steps;
        double trainStep();
    """,
    "aoti": """
        #include <torch/csrc/inductor/aoti_package/model_package_loader.h>
    """,
    # A training program's process group and the Store it was made with.
    "distributed": """
        #include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
        #include <torch/csrc/distributed/c10d/Store.hpp>
        extern c10::intrusive_ptr<c10d::Store> store;
        extern c10::intrusive_ptr<c10d::ProcessGroup> pg;
        extern int64_t rank, world;
    """,
    "handler": """
        struct MyHandler : torch_monitor::EventHandler {
          void handle(const torch_monitor::Event&) override {}
        };
    """,
}

# ------------------------------------------------------------ the blocks

MARKER = re.compile(r"<!--\s*(skip-test|test-with|launch|test-run)\s*:\s*(.*?)\s*-->", re.S)


@dataclasses.dataclass
class Block:
    path: pathlib.Path
    line: int  # of the first line of code (1-based)
    language: str
    code: str
    skip: str = ""  # the reason, when skipped
    preludes: tuple = ()
    # The Python block this one continues (its first line says so).
    continues: "Block | None" = None
    # How the text says to run it, when not `python file.py` (a torchrun
    # command line without the file).
    launch: str = ""
    # A shell block run verbatim: where from ("repository root").
    run_from: str = ""

    @property
    def where(self):
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks_of(path):
    """The fenced code blocks of a Markdown file, with their markers."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence or not fence.group(1):
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        block = Block(path, i + 2, fence.group(1), "\n".join(lines[i + 1:end]) + "\n")
        # Markers: the comments right above the fence (blank lines between allowed).
        above = "\n".join(lines[max(0, i - 6):i])
        last_fence = above.rfind("```")
        for kind, value in MARKER.findall(above[last_fence + 1:] if last_fence >= 0 else above):
            if kind == "skip-test":
                block.skip = value
            elif kind == "launch":
                block.launch = value
            elif kind == "test-run":
                block.run_from = value
            else:
                block.preludes += tuple(value.split())
        blocks.append(block)
        i = end + 1
    return blocks


CONTINUES = "# Continues the block above."

ALL_BLOCKS = [b for path in DOC_FILES for b in blocks_of(path)]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.language == "python"]
for _before, _block in zip([None] + PYTHON_BLOCKS, PYTHON_BLOCKS):
    if _block.code.startswith(CONTINUES):
        assert _before is not None and _before.path == _block.path, (
            f"{_block.where} continues no Python block above it in its file")
        _block.continues = _before
CPP_BLOCKS = [b for b in ALL_BLOCKS if b.language == "cpp"]
# The Python blocks that run (test_typing.py also type-checks them).
RUNNABLE_PYTHON_BLOCKS = [b for b in PYTHON_BLOCKS if not b.skip]


def test_blocks_were_found():
    assert len(PYTHON_BLOCKS) >= 10 and len(CPP_BLOCKS) >= 5


def test_markers_name_known_preludes():
    for block in ALL_BLOCKS:
        if block.language == "python":
            # A reader sees no prelude: the block says what it needs.
            assert not block.preludes, (
                f"{block.where}: a Python block runs as shown; give it its imports "
                f"and model, or start it with {CONTINUES!r}")
            continue
        for name in block.preludes:
            assert name in CPP_PRELUDES, f"{block.where}: no prelude {name!r} for {block.language}"


def test_a_block_continues_only_a_block_that_runs():
    for block in RUNNABLE_PYTHON_BLOCKS:
        if block.continues is not None:
            assert not block.continues.skip, f"{block.where} continues a skipped block"


def test_skipped_blocks_are_few():
    skipped = [f"{b.where}: {b.skip}" for b in ALL_BLOCKS if b.skip]
    print(f"{len(skipped)} of {len(PYTHON_BLOCKS) + len(CPP_BLOCKS)} blocks skipped:")
    print("\n".join(skipped))
    assert len(skipped) <= MAX_SKIPPED, "\n".join(skipped)


# ------------------------------------------------------------ Python


# What every block's module runs first.
HEADER = "import warnings\nwarnings.simplefilter('ignore', DeprecationWarning)\n"


def module_name(block):
    return f"doc_block_{PYTHON_BLOCKS.index(block)}"


def block_source(block):
    """The code of a Python block as a module of its own, which star-imports
    the block it continues (or the header): its line numbers are the
    Markdown file's, so tracebacks (and test_typing.py's mypy errors) point
    at the doc."""
    base = module_name(block.continues) if block.continues else "doc_header"
    return f"from {base} import *  # noqa\n" + "\n" * (block.line - 2) + block.code


def write_chain(block, folder):
    """Writes the modules of `block` and of the blocks it continues, and the
    header, into `folder`; returns the block's file."""
    (folder / "doc_header.py").write_text(HEADER)
    chain = block
    while chain is not None:
        (folder / f"{module_name(chain)}.py").write_text(block_source(chain))
        chain = chain.continues
    return folder / f"{module_name(block)}.py"


@pytest.mark.parametrize(
    "block", RUNNABLE_PYTHON_BLOCKS, ids=lambda b: b.where
)
def test_python_block_runs(block, tmp_path):
    import_torch_monitor()
    # Real files: TorchScript reads the source of what it scripts.
    script = write_chain(block, tmp_path)
    command = [sys.executable, str(script)]  # its folder first: the chain's modules
    if block.launch:
        # The text says it, e.g. "torchrun --standalone --nproc-per-node 2".
        launcher, *options = block.launch.split()
        assert launcher == "torchrun", f"{block.where}: unknown launcher {launcher!r}"
        assert f"torchrun {' '.join(options)}" in block.path.read_text().replace(block.code, ""), (
            f"{block.where}: the text must show how it is launched: torchrun {' '.join(options)}")
        command = [sys.executable, "-m", "torch.distributed.run", *options, str(script)]
    proc = subprocess.run(
        command,
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONFAULTHANDLER="1"),
    )
    assert proc.returncode == 0, (
        f"{block.where} ({script.name}'s line numbers are the doc's):\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )


# ------------------------------------------------------------ shell

SHELL_BLOCKS = [b for b in ALL_BLOCKS if b.language == "bash" and b.run_from]


def test_shell_blocks_say_where_they_run():
    for block in SHELL_BLOCKS:
        assert block.run_from == "repository root", f"{block.where}: run from where? {block.run_from!r}"


@requires_toolchain
@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.where)
def test_shell_block_runs_as_written(block):
    run_shell_block(block)


def run_shell_block(block):
    """Runs a shell block verbatim (bash -e) from the repository root, as its
    text says; fails the test with its output's tail if it fails."""
    import_torch_monitor()
    proc = subprocess.run(
        ["bash", "-e", "-c", block.code], cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, f"{block.where}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


# ------------------------------------------------------------ C++


def cpp_translation_unit(blocks):
    """One source holding every block, each in a namespace and function of
    its own; the blocks' #includes come first."""
    includes, bodies = set(), []
    for n, block in enumerate(blocks):
        body = []
        for line in block.code.splitlines():
            if line.startswith("#include"):
                includes.add(line.split("//")[0].strip())
                body.append("")  # keeps the line numbers
            else:
                body.append(line)
        prelude = []
        for p in block.preludes:
            for line in textwrap.dedent(CPP_PRELUDES[p]).splitlines():
                if line.startswith("#include"):
                    includes.add(line)
                else:
                    prelude.append(line)
        prelude = "\n".join(prelude)
        bodies.append(
            f"namespace doc_block_{n} {{\n{prelude}\nvoid run() {{\n"
            f'#line {block.line} "{block.path.relative_to(ROOT)}"\n'
            + "\n".join(body)
            + "\n}\n}\n"
        )
    return "\n".join(sorted(includes)) + "\n#include <torch_monitor/torch_monitor.h>\n\n" + "\n".join(bodies)


CPP_PROJECT = """
cmake_minimum_required(VERSION 3.18)
project(DocBlocks LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(TorchMonitor REQUIRED)
add_library(doc_blocks OBJECT doc_blocks.cpp)
target_link_libraries(doc_blocks PRIVATE TorchMonitor::torch_monitor)
"""


@requires_toolchain
def test_cpp_blocks_compile(tmp_path):
    tmon = import_torch_monitor()
    source = tmp_path / "src"
    source.mkdir()
    (source / "CMakeLists.txt").write_text(CPP_PROJECT)
    (source / "doc_blocks.cpp").write_text(
        cpp_translation_unit([b for b in CPP_BLOCKS if not b.skip])
    )
    # Fails with the compiler's errors, which name the Markdown lines.
    build_project(source, tmp_path / "build", tmon, ())
