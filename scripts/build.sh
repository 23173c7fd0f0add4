#!/usr/bin/env bash
# Builds and installs torch_monitor (the one CMake build, driven by setup.py)
# into the current Python. Extra CMake arguments: TORCH_MONITOR_CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/progress.sh
PYTHON=${PYTHON:-python3}
echo "== build and install torch_monitor (build folder: build/cmake)"
# pip -v passes CMake's and the compiler's output through; with_progress
# shows the progress lines of it.
with_progress build/pip-install.log \
  "$PYTHON" -m pip install -v --disable-pip-version-check --no-build-isolation .
"$PYTHON" -P -c "import torch_monitor" # fails loudly if the build did not land
