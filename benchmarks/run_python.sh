#!/usr/bin/env bash
# Runs the Python benchmarks: torch_monitor against PyTorch's own
# torch.monitor in one process, repetitions interleaved, and prints a table of
# medians, ratios and the targets of the performance spec; then the memory per
# live Stat (bench_memory.py, fresh child processes); then a training step
# with the loss added as a tensor or as .item() (bench_training_step.py). Works from any cwd;
# uses the installed torch_monitor (pip install --no-build-isolation <repo>).
#
# Usage: benchmarks/run_python.sh [--reps N] [--min-time SECONDS]
#   PYTHON  interpreter to use (default: python)
# Exit status 0 even when a target is missed: look for MISSED in the table.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python}"
# Run from outside the repository, so `import torch_monitor` finds the
# installed package (with its built library) rather than the source folder.
cd /
"$PYTHON" "$ROOT/benchmarks/python/bench_python.py" "$@"
echo
"$PYTHON" "$ROOT/benchmarks/python/bench_memory.py"
echo
"$PYTHON" "$ROOT/benchmarks/python/bench_training_step.py"

echo
"$PYTHON" "$ROOT/benchmarks/python/bench_pytorch_counters.py"
