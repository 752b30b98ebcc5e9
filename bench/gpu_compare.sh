#!/usr/bin/env bash
# The GPU table of bench/RESULTS.md in one run, on a machine with a GPU and a Vulkan driver:
# qhx and llama.cpp's Vulkan backend side by side (bench/compare_llama_cpp.py --vulkan) on the
# same random weights with the real shapes, Qwen3-0.6B W8 against Q8_0 and W4 against Q4_0,
# Qwen3.5-2B W8 against Q8_0, pp512, pp2048 and tg128, rounds interleaved; then qhx's per-op
# profile of each bundle with the same lengths (qhx bench --profile, text and JSON). Extra
# arguments go to compare_llama_cpp.py and win over these (e.g. -p 64 -n 8 --rounds 1 for a
# rehearsal, --cache DIR holding llama-cpp-python's sdist where PyPI cannot be reached,
# --qhx-decode-device cpu).
# QHX_BIN: a qhx binary to use (default: build it into ${QHX_BUILD:-build}); QHX_RESULTS: where
# the tables, records and profiles go (default: bench/results); QHX_GPU_PRESETS: which presets
# (default: "qwen3-0.6b qwen3.5-2b"). A lent machine that cannot build runs
# bench/gpu_device_run.sh, which unpacks what bench/gpu_pack.sh built and calls this.
# Usage: bench/gpu_compare.sh [compare_llama_cpp.py args...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${QHX_BUILD:-build}
qhx=${QHX_BIN:-$build/qhx}
results=${QHX_RESULTS:-bench/results}
presets=${QHX_GPU_PRESETS:-qwen3-0.6b qwen3.5-2b}
if [ -z "${QHX_BIN:-}" ] && [ ! -x "$qhx" ]; then tools/setup.sh "$build"; fi
"$qhx" devices
mkdir -p "$results"
for preset in $presets; do
  case $preset in
    qwen3.5-*) pairs=q8 ;;  # (llama.cpp's Q4_0 of the hybrid: not a target of the table)
    *) pairs=q8,q4 ;;
  esac
  python3 bench/compare_llama_cpp.py --vulkan --preset "$preset" --pairs "$pairs" -p 512,2048 \
    -n 128 --rounds 3 --qhx "$qhx" --json "$results/gpu-$preset.json" \
    --markdown "$results/gpu-$preset.md" --qhx-profile "$results" "$@"
done
for preset in $presets; do cat "$results/gpu-$preset.md"; done
