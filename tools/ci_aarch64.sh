#!/usr/bin/env bash
# Cross-builds the kernels and their tests for aarch64 (the NEON kernels) into build-aarch64 (or
# $1) and runs the tests under qemu-user. Debian packages only: the cross compiler, qemu, and
# GoogleTest's sources (built for the target).
# Usage: tools/ci_aarch64.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-aarch64}

tools/install_packages.sh cmake g++-aarch64-linux-gnu qemu-user googletest

cmake -S . -B "$build_dir" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
  -DQHX_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
# The toolchain file makes ctest run each test through qemu-aarch64.
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"
