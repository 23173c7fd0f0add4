#!/usr/bin/env bash
# README command 2: installs what is missing, builds everything with the C++
# tests, then runs every test (ctest, ctest under ASan+UBSan and under TSan,
# then pytest against the wheel, installed into a fresh virtual
# environment). Exits non-zero if any fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install_deps.sh
source scripts/progress.sh
set +e
TORCH_MONITOR_CMAKE_ARGS="-DTORCH_MONITOR_BUILD_TESTS=ON -DTORCH_MONITOR_BUILD_BENCHMARKS=ON ${TORCH_MONITOR_CMAKE_ARGS:-}" \
  bash scripts/build.sh || exit 1

echo "== C++ tests (ctest)"
ctest --test-dir build/cmake --output-on-failure -j2
cpp_status=$?

# The sanitizer trees compile at -O1 with line tables only (-g1): what the
# sanitizers' reports need (a symbolised stack), at half the compile time of
# -O2 -g on the files that include ATen (46 s against 23 s for
# script/stat.cpp on two cores), which made the ASan tree the longest stage.
SANITIZER_FLAGS='-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1\ -g1\ -DNDEBUG'

echo "== C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer (ctest)"
# Progress shown; the whole output goes to build/sanitize.log.
with_progress build/sanitize.log bash -c "cmake -S . -B build/sanitize $SANITIZER_FLAGS \
    -DTORCH_MONITOR_BUILD_TESTS=ON -DTORCH_MONITOR_SANITIZE=address,undefined &&
  cmake --build build/sanitize -j2" &&
  ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build/sanitize --output-on-failure -j2
sanitize_status=$?

echo "== C++ tests again under ThreadSanitizer (ctest -L tsan)"
# Runs the executables labelled "tsan" in test/cpp/CMakeLists.txt: all but
# the Stat ones (see docs/design.md#sanitizers), so only they are built
# (target tsan_tests). Progress shown; the whole output goes to
# build/tsan.log. A report makes the test's process exit 66, so it fails;
# the deadlock detector's reports get the stack of both lock acquisitions.
with_progress build/tsan.log bash -c "cmake -S . -B build/tsan $SANITIZER_FLAGS \
    -DTORCH_MONITOR_BUILD_TESTS=ON -DTORCH_MONITOR_SANITIZE=thread &&
  cmake --build build/tsan --target tsan_tests -j2" &&
  TSAN_OPTIONS="second_deadlock_stack=1 suppressions=$PWD/test/cpp/tsan.supp" \
    ctest --test-dir build/tsan -L tsan --output-on-failure -j2
tsan_status=$?

# The Python suite runs against the wheel a user installs: built (reusing
# build/cmake), repaired by auditwheel and installed into a fresh virtual
# environment, where the tests run from outside the source tree.
bash scripts/build_wheel.sh && bash scripts/test_wheel.sh
py_status=$?

echo "== summary: ctest exit $cpp_status, ASan+UBSan ctest exit $sanitize_status," \
  "ThreadSanitizer ctest exit $tsan_status, pytest exit $py_status"
[ "$cpp_status" -eq 0 ] && [ "$sanitize_status" -eq 0 ] &&
  [ "$tsan_status" -eq 0 ] && [ "$py_status" -eq 0 ]
