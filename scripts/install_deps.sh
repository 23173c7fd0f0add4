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

# torch is pinned: an unpinned torch would pull several GB of CUDA packages.
# mypy: test_typing.py checks typed code using the package with it.
echo "== pip install (pinned)"
"$PYTHON" -m pip install -q --disable-pip-version-check \
  torch==2.13.0 numpy==2.4.6 tensorboard==2.21.0 pytest==9.0.3 mypy==2.4.1 \
  inferno-ai==0.0.5 einops==0.8.2 prometheus_client==0.26.0 \
  setuptools wheel 2>&1 | grep -v "Running pip as the 'root' user" || true
