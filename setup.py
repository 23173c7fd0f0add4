"""Builds torch_monitor through its one CMake build description.

    pip install --no-build-isolation .

--no-build-isolation matters: the extension must be built against the torch
already installed (an isolated build would download another, multi-GB torch).
Extra CMake arguments can be given in TORCH_MONITOR_CMAKE_ARGS, and the build
folder (default build/cmake, kept between builds) in TORCH_MONITOR_BUILD_DIR.
"""

import importlib.metadata
import os
import shlex
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))

# The one source of the version (CMake and torch_monitor.__version__ read it).
with open(os.path.join(ROOT, "torch_monitor", "VERSION")) as f:
    VERSION = f.read().strip()


def torch_requirement():
    """The compiled parts work only with the torch they were built against
    (C++ ABI, TorchScript schemas): the wheel requires exactly that one."""
    try:
        return [f"torch=={importlib.metadata.version('torch')}"]
    except importlib.metadata.PackageNotFoundError:
        return []  # the build itself stops with a clear message


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures, builds and installs the CMake project into the package."""

    def build_extension(self, ext):
        try:
            import torch.utils
        except ImportError:
            sys.exit(
                "torch_monitor builds against an installed torch: install torch "
                "first, then run `pip install --no-build-isolation .`"
            )
        package_dir = os.path.abspath(os.path.dirname(self.get_ext_fullpath(ext.name)))
        build_dir = os.environ.get(
            "TORCH_MONITOR_BUILD_DIR", os.path.join(ROOT, "build", "cmake")
        )
        configure = [
            "cmake",
            "-S", ROOT,
            "-B", build_dir,
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DCMAKE_INSTALL_LIBDIR=lib",
            "-DTORCH_MONITOR_BUILD_PYTHON=ON",
        ] + shlex.split(os.environ.get("TORCH_MONITOR_CMAKE_ARGS", ""))
        subprocess.check_call(configure)
        subprocess.check_call(
            ["cmake", "--build", build_dir, "-j", str(os.cpu_count() or 1)]
        )
        # The package gets _C, lib/libtorch_monitor.so, include/ and the CMake
        # package config (torch_monitor.cmake_prefix_path points there).
        subprocess.check_call(["cmake", "--install", build_dir, "--prefix", package_dir])


setup(
    name="torch_monitor",
    version=VERSION,
    description="torch.monitor's Stat, Event and handlers in C++ for Python, "
    "TorchScript and LibTorch",
    packages=["torch_monitor"],
    # py.typed: the package is typed (PEP 561); _C.pyi types the compiled module.
    package_data={"torch_monitor": ["py.typed", "_C.pyi", "VERSION"]},
    install_requires=torch_requirement(),
    ext_modules=[CMakeExtension("torch_monitor._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    zip_safe=False,
)
