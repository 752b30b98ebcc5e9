#!/usr/bin/env bash
# Cross-builds the kernels and their tests for aarch64 (the NEON kernels) into build-aarch64 (or
# $1) and runs the tests under qemu-user, on CPUs with and without the dot-product instructions.
# Debian packages only: the cross compiler, qemu, and GoogleTest's sources (built for the target).
# Usage: tools/ci_aarch64.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-aarch64}

tools/install_packages.sh cmake g++-aarch64-linux-gnu qemu-user googletest

cmake -S . -B "$build_dir" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
  -DQHX_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
# The toolchain file makes ctest run each test through qemu-aarch64. Its "max" CPU has the
# dot-product instructions, which matmul_int8_test then requires its kernels to use (the neon.*
# copies of its tests run the baseline kernels, QHX_KERNELS=neon).
QEMU_CPU=max QHX_TEST_REQUIRE_DOTPROD=1 ctest --test-dir "$build_dir" --output-on-failure \
  -j "$(nproc)"
# Again on an ARMv8.0 CPU without them: the run-time check must pick the baseline kernels, and
# nothing else may need a newer instruction.
QEMU_CPU=cortex-a53 ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"
