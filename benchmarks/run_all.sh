#!/usr/bin/env bash
# Every benchmark, each printing figures against its reference measured in
# the same run: the C++ ones (Google Benchmark, vs torch::monitor), the Python
# harness (vs torch.monitor), the DifferenceMonitor (vs inferno) and the native
# TensorBoard writer. Needs the package installed (bash scripts/build.sh) and
# inferno-ai for the monitor comparison.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD_DIR="${BUILD_DIR:-$HERE/../build/benchmarks}"
PYTHON=${PYTHON:-python3}

BUILD_DIR="$BUILD_DIR" bash "$HERE/run_cpp.sh"
bash "$HERE/run_python.sh"
echo "== DifferenceMonitor per-forward overhead vs inferno"
(cd / && "$PYTHON" "$HERE/python/bench_difference_monitor.py")
echo "== native TensorBoard writer"
cmake --build "$BUILD_DIR" --target bench_sinks -j2 >/dev/null
"$BUILD_DIR/benchmarks/bench_sinks" --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_filter='handle|end_to_end'
