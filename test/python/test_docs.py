"""Every code block of README.md and docs/*.md runs or compiles, so the docs
cannot drift from the code.

* ```python blocks are executed, each in a fresh process in a scratch folder.
* ```cpp blocks are compiled against the installed package, all in one
  translation unit (one compiler run): each block in a function of its own
  namespace, with `#line` pointing compiler errors at the Markdown line.
  They are compiled, not linked or run.

Blocks are fragments of a training program, so a comment just before a block
may name a prelude defined here: ``<!-- test-with: NAME -->`` (its code comes
first: the names the block uses but does not define, such as ``model`` or
``train_step``). A block that cannot run on its own says why:
``<!-- skip-test: REASON -->``; test_skipped_blocks_are_few lists and counts
them. Other languages (bash, cmake, json) are not run.
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

# ------------------------------------------------------------ preludes

PYTHON_PRELUDES = {
    # A tiny model trained on random data: `model` (with `fc` and `bn`), the
    # data (`x`, `y`, `data`, `batches`), `train_step` (one SGD step; any
    # arguments, returns the loss as a tensor), and a scriptable `Net` whose
    # `block` holds a `state` tensor.
    "training": """
        import datetime
        from datetime import timedelta
        import torch
        import torch_monitor
        import torch_monitor as monitor
        torch.manual_seed(0)

        class _Block(torch.nn.Module):
            state: torch.Tensor

            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("state", torch.zeros(4))
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                self.state.add_(x.mean(0))
                return x

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc = torch.nn.Linear(4, 4)
                self.bn = torch.nn.BatchNorm1d(4)
                self.block = _Block()
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                out: torch.Tensor = self.block(self.bn(self.fc(x)))
                return out

        model: torch.nn.Module = Net()  # the "pt2" prelude makes it a Model
        x, y = torch.randn(8, 4), torch.randn(8, 4)
        data = [(torch.randn(8, 4), torch.randn(8, 4)) for _ in range(3)]
        batches = [torch.randn(8, 4) for _ in range(3)]

        def train_step(*args: object) -> torch.Tensor:
            loss: torch.Tensor = (model(x) - y).square().mean()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.sub_(0.01 * p.grad)
                        p.grad = None
            return loss.detach()
    """,
    # For torch.compile and torch.export: a `Model` whose forward() adds its
    # loss to a Stat and moves a BatchNorm's running mean; `model` is one.
    "pt2": """
        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.stat = torch_monitor.Stat("loss", [torch_monitor.MEAN], timedelta(seconds=60))
                self.bn = torch.nn.BatchNorm1d(4)
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                loss: torch.Tensor = self.bn(x).square().mean()
                self.stat.add(loss)
                return loss

        model = Model()
    """,
    # A process group of one rank (gloo, env://: the variables a launcher
    # sets), so that multi-rank code runs as rank 0 of a world of 1; `rank`,
    # `world_size`, `steps` and a `loader` for the loops.
    "distributed": """
        import os, socket
        import torch.distributed as dist
        with socket.socket() as _s:
            _s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_s.getsockname()[1]),
                              RANK="0", WORLD_SIZE="1")
        rank, world_size, steps = 0, 1, 3
        loader = data
    """,
}

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

MARKER = re.compile(r"<!--\s*(skip-test|test-with)\s*:\s*(.*?)\s*-->", re.S)


@dataclasses.dataclass
class Block:
    path: pathlib.Path
    line: int  # of the first line of code (1-based)
    language: str
    code: str
    skip: str = ""  # the reason, when skipped
    preludes: tuple = ()

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
            else:
                block.preludes += tuple(value.split())
        blocks.append(block)
        i = end + 1
    return blocks


ALL_BLOCKS = [b for path in DOC_FILES for b in blocks_of(path)]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.language == "python"]
CPP_BLOCKS = [b for b in ALL_BLOCKS if b.language == "cpp"]
# The Python blocks that run (test_typing.py also type-checks them).
RUNNABLE_PYTHON_BLOCKS = [b for b in PYTHON_BLOCKS if not b.skip]


def test_blocks_were_found():
    assert len(PYTHON_BLOCKS) >= 10 and len(CPP_BLOCKS) >= 5


def test_markers_name_known_preludes():
    for block in ALL_BLOCKS:
        known = PYTHON_PRELUDES if block.language == "python" else CPP_PRELUDES
        for name in block.preludes:
            assert name in known, f"{block.where}: no prelude {name!r} for {block.language}"


def test_skipped_blocks_are_few():
    skipped = [f"{b.where}: {b.skip}" for b in ALL_BLOCKS if b.skip]
    print(f"{len(skipped)} of {len(PYTHON_BLOCKS) + len(CPP_BLOCKS)} blocks skipped:")
    print("\n".join(skipped))
    assert len(skipped) <= MAX_SKIPPED, "\n".join(skipped)


# ------------------------------------------------------------ Python


def prelude_source(block):
    """The code of the module holding a Python block's preludes, in order."""
    return (
        "import warnings\nwarnings.simplefilter('ignore', DeprecationWarning)\n"
        + "".join(textwrap.dedent(PYTHON_PRELUDES[p]) for p in block.preludes)
    )


def block_source(block, prelude_module="doc_prelude"):
    """The code of a Python block as a module of its own, which star-imports
    its preludes from ``prelude_module``: its line numbers are the Markdown
    file's, so tracebacks (and test_typing.py's mypy errors) point at the doc."""
    return f"from {prelude_module} import *  # noqa\n" + "\n" * (block.line - 2) + block.code


@pytest.mark.parametrize(
    "block", RUNNABLE_PYTHON_BLOCKS, ids=lambda b: b.where
)
def test_python_block_runs(block, tmp_path):
    import_torch_monitor()
    (tmp_path / "doc_prelude.py").write_text(prelude_source(block))
    # A real file: TorchScript reads the source of what it scripts.
    script = tmp_path / "doc_block.py"
    script.write_text(block_source(block))
    proc = subprocess.run(
        [sys.executable, str(script)],  # its folder first: doc_prelude
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONFAULTHANDLER="1"),
    )
    assert proc.returncode == 0, (
        f"{block.where} (doc_block.py's line numbers are the doc's):\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )


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
