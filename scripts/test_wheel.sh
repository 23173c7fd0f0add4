#!/usr/bin/env bash
# Installs the wheel in dist/ (scripts/build_wheel.sh) into a fresh virtual
# environment, with the pinned packages (torch among them) from the package
# index, and runs the Python suite there from outside the source tree, so
# that every test, the C++ consumer's build through
# torch_monitor.cmake_prefix_path included, uses the installed wheel.
# Extra arguments go to pytest, paths relative to the repository root
# (default: the whole of test/python).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
venv=$root/build/wheel-venv
wheel=$(ls "$root"/dist/torch_monitor-*manylinux*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "no wheel in dist/: run scripts/build_wheel.sh first"; exit 1; }

echo "== a fresh virtual environment with $(basename "$wheel") (build/wheel-venv)"
rm -rf "$venv"
"$PYTHON" -m venv "$venv" || exit 1
# (This machine's pip configuration names an extra index that may be
# absent: pip's warning about it is noise here.)
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  -r "$root/scripts/requirements.txt" "$wheel" 2>&1 |
  { grep -v "is ignored: it is neither a file nor a directory" || true; }
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
# Its python first on PATH: the tests' subprocesses and the docs' shell
# blocks (`python -P ...`) run the wheel's environment too.
export PATH="$venv/bin:$PATH"
scratch=$(mktemp -d)
cd "$scratch" || exit 1
# The suite must see the wheel, not the checkout nor another install.
python -P -c "
import pathlib, sys, torch_monitor
where = pathlib.Path(torch_monitor.__file__).resolve()
assert where.is_relative_to(pathlib.Path(sys.prefix).resolve()), where
print('   torch_monitor', torch_monitor.__version__, 'from', where.parent)
" || exit 1

echo "== Python tests (pytest) against the installed wheel, from $scratch"
# --durations names the slowest tests, to keep the whole run well under an hour.
args=()
for arg in "$@"; do
  case $arg in -* | /*) args+=("$arg") ;; *) args+=("$root/$arg") ;; esac
done
[ ${#args[@]} -eq 0 ] && args=("$root/test/python")
TORCH_MONITOR_REQUIRE=1 python -P -m pytest -q -p no:cacheprovider --rootdir "$root" \
  --durations=15 "${args[@]}"
status=$?
rm -rf "$scratch"
exit $status
