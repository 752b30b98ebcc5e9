#!/usr/bin/env bash
# The command for a lent GPU machine (the device tool), which reaches no package registry and has
# nothing to build qhx or llama.cpp with: installs the Vulkan loader from .gpu/debs, unpacks
# what bench/gpu_pack.sh built into .gpu, finds NVIDIA's Vulkan driver, then
#   1. the check: bench/gpu_check.sh on the fixtures .gpu carries (greedy ids on the GPU against
#      the CPU's) and a synthetic Qwen3-0.6B through the device check; a failure ends the run,
#      as no figure from a device that computes something else means anything;
#   2. bench/gpu_compare.sh with the carried binaries: the side-by-side table and qhx's per-op
#      profile of each bundle.
# The log, the check, the tables, the records and the profiles go to $OUT (the device tool
# brings them back) or bench/results. --check stops after the check. --rehearse runs it all
# with short lengths (-p 32,64 -n 8, one round), for a run here on lavapipe that proves every
# file is there; its Python for the GGUF conversion is $QHX_CONVERTER_PYTHON (one with numpy,
# pyyaml and tqdm; the GPU machine's python3 has them). Extra arguments go to
# compare_llama_cpp.py; QHX_GPU_PRESETS picks the presets (gpu_compare.sh).
#
# Here, before the call:  bench/gpu_pack.sh && bench/device_tree.sh slim
# The call:               run(command="bash bench/gpu_device_run.sh", carry=[".gpu"], timeout_s=600)
# Here, after it:         bench/device_tree.sh restore
set -euo pipefail
cd "$(dirname "$0")/.."
results=${OUT:-bench/results}
mkdir -p "$results"
exec > >(tee "$results/device-run.log") 2>&1
mode=run
case "${1:-}" in
  --check) mode=check; shift ;;
  --rehearse) mode=rehearse; shift ;;
esac
converter_python=${QHX_CONVERTER_PYTHON:-python3}

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
mkdir -p "$root/fixtures" && tar -xJf .gpu/fixtures.tar.xz -C "$root/fixtures"
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
rm -rf "$work/check" && mkdir -p "$work/check"
echo "== the check: greedy ids on the GPU against the CPU's"
bench/gpu_check.sh "$qhx" "$root/fixtures" "$work/check" | tee "$results/gpu-check.txt" ||
  { echo "the GPU's ids are not the CPU's: nothing to measure"; exit 1; }
# A model with the real shapes through the device check (40 tokens: prompts of 16 or more take
# the cooperative-matrix matmuls where the GPU has them).
"$qhx" forge synth --preset qwen3-0.6b -o "$work/check/qwen3-0.6b"
cp "$root"/tokenizer/tokenizer*.json "$work/check/qwen3-0.6b/"
synth=$("$qhx" generate --model "$work/check/qwen3-0.6b" --device vulkan --device-check always \
  --prompt-ids "$(seq -s, 1 40)" -n 8 --greedy --print-ids 2>&1)
echo "$synth" | tee -a "$results/gpu-check.txt"
grep -q ' agrees with the CPU: gate passed' <<<"$synth" ||
  { echo "the device check failed on qwen3-0.6b: nothing to measure"; exit 1; }
echo "check done in $(($(date +%s) - start)) s"
[ "$mode" = check ] && exit 0

echo "== the table and the profiles"
short=()
[ "$mode" = rehearse ] && short=(-p 32,64 -n 8 -r 1 --rounds 1)
# The device passed the check above; the timed runs skip qhx's own check, which random weights
# at the hybrid's real shapes can fail where trained ones pass (the 2B W8 on lavapipe: Pearson r
# 0.9915 with int8 activations, KL 1.4e-10 with f32 ones).
QHX_COMMIT=$(cat "$root/COMMIT") QHX_BIN=$qhx QHX_RESULTS=$results bench/gpu_compare.sh \
  --cache "$root/llama" --portable-cpu --converter-python "$converter_python" \
  --qhx-device-check never \
  --tokenizer "$root/tokenizer" --work "$work" -t "$(nproc)" "${short[@]}" "$@"
echo "done in $(($(date +%s) - start)) s"
