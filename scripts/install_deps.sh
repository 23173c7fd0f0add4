#!/usr/bin/env bash
# Installs everything building, testing and running torch_monitor needs, and
# skips what is already there. Sourced by demo.sh and test.sh.
set -euo pipefail

PYTHON=${PYTHON:-python3}

# prometheus: the real server test/python/test_prometheus.py scrapes the
# exporter with (the test runs the binary itself; it needs no service).
apt_packages=(cmake g++ make libgtest-dev libbenchmark-dev libgloo-dev prometheus)
missing=()
for package in "${apt_packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "== apt-get install ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Pinned, one list (scripts/requirements.txt) for this Python and the
# wheel's test environment (scripts/test_wheel.sh).
echo "== pip install (pinned)"
"$PYTHON" -m pip install -q --disable-pip-version-check \
  -r "$(dirname "${BASH_SOURCE[0]}")/requirements.txt" 2>&1 | grep -v "Running pip as the 'root' user" || true
