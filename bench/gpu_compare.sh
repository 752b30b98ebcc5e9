#!/usr/bin/env bash
# The GPU table of bench/RESULTS.md in one run, on a machine with a GPU and a Vulkan driver:
# qhx and llama.cpp's Vulkan backend side by side (bench/compare_llama_cpp.py --vulkan) on the
# same random weights with the real shapes, Qwen3-0.6B and Qwen3.5-2B, W8 against Q8_0, pp512
# and tg128, rounds interleaved. Extra arguments go to compare_llama_cpp.py (e.g. --cache DIR
# holding llama-cpp-python's sdist where PyPI cannot be reached, --qhx-decode-device cpu).
# QHX_BIN: a qhx binary to use (default: build it into ${QHX_BUILD:-build}); QHX_RESULTS: where
# the tables and records go (default: bench/results). A lent machine that cannot build runs
# bench/gpu_device_run.sh, which unpacks what bench/gpu_pack.sh built and calls this.
# Usage: bench/gpu_compare.sh [compare_llama_cpp.py args...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${QHX_BUILD:-build}
qhx=${QHX_BIN:-$build/qhx}
results=${QHX_RESULTS:-bench/results}
if [ -z "${QHX_BIN:-}" ] && [ ! -x "$qhx" ]; then tools/setup.sh "$build"; fi
"$qhx" devices
mkdir -p "$results"
for preset in qwen3-0.6b qwen3.5-2b; do
  python3 bench/compare_llama_cpp.py --vulkan --preset "$preset" --pairs q8 -p 512 -n 128 \
    --rounds 3 --qhx "$qhx" --json "$results/gpu-$preset.json" \
    --markdown "$results/gpu-$preset.md" "$@"
done
cat "$results/gpu-qwen3-0.6b.md" "$results/gpu-qwen3.5-2b.md"
