#!/usr/bin/env bash
# The command for a lent GPU machine (the device tool), which reaches no package registry and has
# nothing to build qhx or llama.cpp with: installs the Vulkan loader from .gpu/debs, unpacks
# what bench/gpu_pack.sh built into .gpu, finds NVIDIA's Vulkan driver and runs
# bench/gpu_compare.sh with the carried binaries. The log, tables and records go to $OUT (the
# device tool brings them back) or bench/results. --check stops after the devices and one
# short qhx run on the GPU. Extra arguments go to compare_llama_cpp.py.
#
# Here, before the call:  bench/gpu_pack.sh && bench/device_tree.sh slim
# The call:               run(command="bash bench/gpu_device_run.sh", carry=[".gpu"], timeout_s=600)
# Here, after it:         bench/device_tree.sh restore
set -euo pipefail
cd "$(dirname "$0")/.."
results=${OUT:-bench/results}
mkdir -p "$results"
exec > >(tee "$results/device-run.log") 2>&1
check_only=0
if [ "${1:-}" = --check ]; then check_only=1; shift; fi

start=$(date +%s)
# The Vulkan loader, and GLVND for NVIDIA's driver, where the machine lacks them (the device
# README's way: unpacked over /, then ldconfig).
if ! ldconfig -p | grep -q 'libvulkan\.so\.1 ' || ! ldconfig -p | grep -q 'libGLdispatch\.so\.0 '; then
  for f in .gpu/debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
root=/tmp/qhx-gpu
rm -rf "$root" && mkdir -p "$root/llama"
tar -xJf .gpu/qhx.tar.xz -C "$root"
tar -xJf .gpu/llama.tar.xz -C "$root/llama"
qhx=$root/bin/qhx
echo "qhx $(cat "$root/COMMIT"), unpacked in $(($(date +%s) - start)) s"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
  --format=csv || true

# The loader finds the driver through its ICD file; the machine keeps NVIDIA's in the driver's
# own folder, which the loader does not search unless told.
if ! "$qhx" devices | grep -q '^vulkan:[0-9]'; then
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  echo "no Vulkan device at first; with VK_DRIVER_FILES=$icd:"
fi
"$qhx" devices
"$qhx" devices | grep -q '^vulkan:[0-9]' || { echo "no Vulkan device: nothing to measure"; exit 1; }
llama_bench=$(echo "$root"/llama/build-*/bin/llama-bench)
"$llama_bench" --list-devices || true

export QHX_CACHE_DIR=/tmp/qhx-cache
work=/tmp/qhx-models
if [ "$check_only" = 1 ]; then  # one small model through every step the full run takes
  mkdir -p "$work"
  "$qhx" forge synth --preset qwen3-0.6b -o "$work/check"
  cp "$root"/tokenizer/tokenizer*.json "$work/check/"
  # (40 tokens: prompts of 16 or more take the cooperative-matrix matmuls where the GPU has them)
  "$qhx" generate --model "$work/check" --device vulkan --device-check always \
    --prompt-ids "$(seq -s, 1 40)" -n 8 --greedy --print-ids
  echo "check done in $(($(date +%s) - start)) s"
  exit 0
fi
QHX_COMMIT=$(cat "$root/COMMIT") QHX_BIN=$qhx QHX_RESULTS=$results bench/gpu_compare.sh --cache "$root/llama" --portable-cpu \
  --converter-python python3 --tokenizer "$root/tokenizer" --work "$work" -t "$(nproc)" "$@"
echo "done in $(($(date +%s) - start)) s"
