#!/usr/bin/env bash
# Every benchmark, each printing figures against its reference measured in
# the same run: the C++ ones (Google Benchmark, vs torch::monitor), the Python
# harness (vs torch.monitor), the DifferenceMonitor (vs hand-written hooks and
# inferno), the lock on the monitor path, and the native
# TensorBoard writer. Needs the package installed (bash scripts/build.sh) and
# inferno-ai for the monitor comparison.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD_DIR="${BUILD_DIR:-$HERE/../build/benchmarks}"
PYTHON=${PYTHON:-python3}

BUILD_DIR="$BUILD_DIR" bash "$HERE/run_cpp.sh"
bash "$HERE/run_python.sh"
echo "== DifferenceMonitor per-forward overhead vs hand-written hooks and inferno"
(cd / && "$PYTHON" "$HERE/python/bench_difference_monitor.py")
echo "== what the monitor and reducer locks cost (C++)"
cmake --build "$BUILD_DIR" --target bench_monitor -j2 >/dev/null
"$BUILD_DIR/benchmarks/bench_monitor" --benchmark_repetitions=9 \
  --benchmark_report_aggregates_only=true
echo "== native TensorBoard writer"
cmake --build "$BUILD_DIR" --target bench_sinks -j2 >/dev/null
"$BUILD_DIR/benchmarks/bench_sinks" --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_filter='handle|end_to_end'
