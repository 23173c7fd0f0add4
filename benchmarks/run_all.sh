#!/usr/bin/env bash
# Every benchmark, each printing ours/reference ratios measured in the same run:
# the C++ ones (Google Benchmark) and the Python harness. Needs the package
# installed (bash scripts/build.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bash run_cpp.sh
bash run_python.sh
