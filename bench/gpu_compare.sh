#!/usr/bin/env bash
# The GPU table of bench/RESULTS.md in one run, on a machine with a GPU and a Vulkan driver:
# qhx and llama.cpp's Vulkan backend side by side (bench/compare_llama_cpp.py --vulkan) on the
# same random weights with the real shapes, Qwen3-0.6B and Qwen3.5-2B, W8 against Q8_0, pp512
# and tg128, rounds interleaved. Extra arguments go to compare_llama_cpp.py (e.g. --cache DIR
# holding llama-cpp-python's sdist where PyPI cannot be reached, --qhx-decode-device cpu).
# Usage: bench/gpu_compare.sh [compare_llama_cpp.py args...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${QHX_BUILD:-build}
[ -x "$build/qhx" ] || tools/setup.sh "$build"
"$build/qhx" devices
mkdir -p bench/results
for preset in qwen3-0.6b qwen3.5-2b; do
  python3 bench/compare_llama_cpp.py --vulkan --preset "$preset" --pairs q8 -p 512 -n 128 \
    --rounds 3 --qhx "$build/qhx" --json "bench/results/gpu-$preset.json" \
    --markdown "bench/results/gpu-$preset.md" "$@"
done
cat bench/results/gpu-qwen3-0.6b.md bench/results/gpu-qwen3.5-2b.md
