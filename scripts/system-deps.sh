#!/usr/bin/env bash
# Installs the Debian packages the project builds and runs with, and only those that are missing,
# so a second run makes no network call and returns at once.
#
# Usage: scripts/system-deps.sh            # build + runtime packages for pycaffe
#        scripts/system-deps.sh --browser  # also Chromium for the browser tests
set -euo pipefail

packages=(
  # toolchain for pycaffe's CMake build and the caffe binary's Makefile build (which applies patches)
  cmake g++ make pkg-config patch
  # libraries pycaffe links against (BVLC caffe, CPU-only)
  libboost-python-dev libboost-system-dev libboost-thread-dev libboost-filesystem-dev libboost-regex-dev
  libgoogle-glog-dev libgflags-dev libprotobuf-dev protobuf-compiler libopenblas-dev libhdf5-dev
  liblmdb-dev
  # net.cpp includes a gtest header
  libgtest-dev
  # the job watchdog reads a stuck training child's stack (jobs/watchdog.py)
  gdb
  # several web workers' message queue (docs/scale-out.md); tests/test_jobs_workers.py starts its own redis-server
  # on a free port and never uses the service this package may start on 6379
  redis-server
)
if [[ "${1:-}" == "--browser" ]]; then
  packages+=(chromium)
fi

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "system-deps: installing ${missing[*]}"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "system-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
