#!/usr/bin/env bash
# README command 2: installs what is missing, builds everything with the C++
# tests, then runs every test (ctest, then pytest). Exits non-zero if any fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install_deps.sh
set +e
TORCH_MONITOR_CMAKE_ARGS="-DTORCH_MONITOR_BUILD_TESTS=ON -DTORCH_MONITOR_BUILD_BENCHMARKS=ON ${TORCH_MONITOR_CMAKE_ARGS:-}" \
  bash scripts/build.sh || exit 1

echo "== C++ tests (ctest)"
ctest --test-dir build/cmake --output-on-failure -j2
cpp_status=$?

echo "== C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer (ctest)"
# Compiler output goes to build/sanitize.log (its tail is shown on failure).
{ cmake -S . -B build/sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTORCH_MONITOR_BUILD_TESTS=ON -DTORCH_MONITOR_SANITIZE=address,undefined &&
  cmake --build build/sanitize -j2; } > build/sanitize.log 2>&1 ||
  { tail -40 build/sanitize.log; false; } &&
  ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build/sanitize --output-on-failure -j2
sanitize_status=$?

echo "== Python tests (pytest)"
# -P keeps the repo root off sys.path, so the installed package is imported,
# not the source folder (which has no compiled parts).
TORCH_MONITOR_REQUIRE=1 "$PYTHON" -P -m pytest -q -p no:cacheprovider test/python
py_status=$?

echo "== summary: ctest exit $cpp_status, sanitized ctest exit $sanitize_status, pytest exit $py_status"
[ "$cpp_status" -eq 0 ] && [ "$sanitize_status" -eq 0 ] && [ "$py_status" -eq 0 ]
