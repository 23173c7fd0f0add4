#!/usr/bin/env bash
# Builds and installs torch_monitor (the one CMake build, driven by setup.py)
# into the current Python. Extra CMake arguments: TORCH_MONITOR_CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
echo "== build and install torch_monitor (build folder: build/cmake)"
# pip's own status decides (the filter's would hide a failed build behind an
# older install that still imports).
"$PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation . \
  2>&1 | { grep -v "Running pip as the 'root' user" || true; }
"$PYTHON" -P -c "import torch_monitor" # fails loudly if the build did not land
