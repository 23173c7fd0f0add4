"""What an installed torch_monitor says about itself: its version (one source,
torch_monitor/VERSION, for Python, the wheel and the C++ header), the exact
torch it needs, and a clear error when imported from an unbuilt source tree.
(The relocatable CMake package and the C++ version macros are checked by
test_cpp_consumer.py, which builds against them.)"""

import importlib.metadata
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

tm = pytest.importorskip("torch_monitor")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_version_is_the_distribution_version():
    assert tm.__version__ == importlib.metadata.version("torch_monitor")
    assert tm.__version__ == (ROOT / "torch_monitor" / "VERSION").read_text().strip()


def test_wheel_requires_the_torch_it_was_built_against():
    requires = importlib.metadata.requires("torch_monitor") or []
    torch_version = importlib.metadata.version("torch")
    assert f"torch=={torch_version}" in requires, requires


def test_installed_version_header_matches():
    header = pathlib.Path(tm.cmake_prefix_path).parents[1] / "include" / "torch_monitor" / "version.h"
    text = header.read_text()
    parts = [
        re.search(rf"#define TORCH_MONITOR_VERSION_{p} (\d+)", text).group(1)
        for p in ("MAJOR", "MINOR", "PATCH")
    ]
    assert ".".join(parts) == tm.__version__
    assert f'#define TORCH_MONITOR_VERSION "{tm.__version__}"' in text


def test_unbuilt_source_tree_import_says_what_to_do(tmp_path):
    """Python puts the current folder first: in a checkout, `import
    torch_monitor` finds the sources, which have no compiled library."""
    shutil.copytree(ROOT / "torch_monitor", tmp_path / "torch_monitor",
                    ignore=shutil.ignore_patterns("lib", "_C*.so", "__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-c", "import torch_monitor"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:"), proc.stderr[-2000:]
    assert "source tree" in last and "scripts/build.sh" in last, last


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("g++") is None, reason="needs cmake and g++")
def test_a_compiler_without_shared_libstdcxx_is_refused(tmp_path):
    # Such a GCC (the CUDA image's CXX) would copy libstdc++ into the library,
    # and that copy crashed every error message holding a number beside
    # torch's libstdc++: the configure step must stop and say what to do.
    wrapper = tmp_path / "g++"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-print-file-name=libstdc++.so" ]; then echo libstdc++.so; exit 0; fi\n'
        f'exec {shutil.which("g++")} "$@"\n'
    )
    wrapper.chmod(0o755)
    done = subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"), f"-DCMAKE_CXX_COMPILER={wrapper}"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode != 0
    message = " ".join(done.stderr.split())
    assert "has no shared libstdc++" in message and "CXX=/usr/bin/g++" in message, message


def test_import_leaves_the_pt2_machinery_for_later():
    # Dynamo and torch.export._trace cost seconds to import (issue 16): the
    # package sets up its PyTorch 2 support when they are first imported.
    done = subprocess.run(
        [sys.executable, "-P", "-c",
         "import sys, torch, torch_monitor; "
         "print(int('torch._dynamo' in sys.modules), int('torch.export._trace' in sys.modules))"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "0"], done.stdout
