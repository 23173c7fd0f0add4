#!/usr/bin/env bash
# README command 1: installs what is missing, builds torch_monitor and runs the
# demo training job (TensorBoard files under runs/, a summary at the end).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install_deps.sh
bash scripts/build.sh
echo "== demo"
"$PYTHON" examples/demo_training.py "$@"
