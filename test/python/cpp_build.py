"""Builds the stand-alone C++ projects of the repository (test/consumer,
examples/cpp/*) against the installed torch_monitor package, the way a user
would: ``find_package(TorchMonitor)`` with the package's CMake prefix.

Shared by test_cpp_consumer.py and test_cpp_example.py. Tests that build skip
when cmake or a C++ compiler is missing.
"""

import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def compiler():
    """The C++ compiler to use ($CXX, else c++, g++, clang++), or None."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def have_toolchain():
    return shutil.which("cmake") is not None and compiler() is not None


requires_toolchain = pytest.mark.skipif(
    not have_toolchain(),
    reason="needs cmake and a C++ compiler to build the C++ projects",
)


def import_torch_monitor():
    """torch_monitor, or a skip (a failure with TORCH_MONITOR_REQUIRE=1)."""
    try:
        import torch_monitor
    except Exception as exc:  # ImportError, or OSError loading the library
        if os.environ.get("TORCH_MONITOR_REQUIRE") == "1":
            raise
        pytest.skip(f"cannot import torch_monitor: {exc!r}")
    if getattr(torch_monitor, "__file__", None) is None:
        pytest.skip("torch_monitor is not built (namespace package only)")
    return torch_monitor


def run(cmd, timeout=180, **kwargs):
    return subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def build_project(source, build, tmon, executables, extra_configure=()):
    """Configures and builds the CMake project ``source`` in ``build``.

    Finds TorchMonitor through ``tmon.cmake_prefix_path`` (and Torch through
    torch's own prefix). Skips without a toolchain; fails the test with the
    tail of the build log when configuring or building fails, or when one of
    ``executables`` was not produced. Returns ``build``.
    """
    if not have_toolchain():
        pytest.skip("needs cmake and a C++ compiler")
    import torch.utils

    prefix = f"{tmon.cmake_prefix_path};{torch.utils.cmake_prefix_path}"
    configure = [
        "cmake",
        "-S",
        source,
        "-B",
        build,
        f"-DCMAKE_PREFIX_PATH={prefix}",
        f"-DCMAKE_CXX_COMPILER={compiler()}",
        "-DCMAKE_BUILD_TYPE=Release",
        *extra_configure,
    ]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    for cmd in (
        configure,
        ["cmake", "--build", build, "--parallel", str(min(4, os.cpu_count() or 1))],
    ):
        proc = run(cmd, timeout=900)
        assert proc.returncode == 0, (
            f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    for exe in executables:
        assert (build / exe).is_file(), f"{exe} was not built"
    return build
