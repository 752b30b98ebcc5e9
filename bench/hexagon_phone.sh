#!/usr/bin/env bash
# qhx on a Snapdragon phone's Hexagon NPU, over adb: pushes an aarch64 qhx, a bundle, its NPU pack
# (qhx forge npu) and the QNN libraries you supply, then runs qhx bench with prompts on the NPU and
# on the CPU alone, side by side, and pulls the JSON records back. Nothing here was run on a phone
# when it was written (no phone was at hand): it is ready for one.
#
# Figures to compare against (other runtimes, their own phones; not measured by qhx):
#   - the QHexRT / TokForge model cards: Qwen3-0.6B W8A16 on v81 (SM8850):
#     38.7 tok/s decode, 43.1 tok/s prefill;
#   - ExecuTorch, Qwen3-0.6B 16a4w on SM8850: prefill 862 tok/s on a 94-token prompt
#     (pytorch/executorch #18933);
#   - llama.cpp's ggml-hexagon, Llama-3.2-1B Q4_0 on v79: pp128 169, tg64 51.5 tok/s.
#
# What you supply (the x86 onnxruntime-qnn wheel has no device libraries): from Qualcomm's QAIRT
# SDK for your chip, in one folder: libQnnHtp.so, libQnnSystem.so (aarch64-android),
# libQnnHtpV<NN>Stub.so and libQnnHtpV<NN>Skel.so (hexagon-v<NN>).
#
# Usage: bench/hexagon_phone.sh QHX_AARCH64_BINARY BUNDLE PACK QNN_LIB_DIR v75|v81 [out-dir]
#   QHX_AARCH64_BINARY: qhx built for Android/aarch64 (cmake -DCMAKE_TOOLCHAIN_FILE=<NDK>/build/
#   cmake/android.toolchain.cmake -DANDROID_ABI=arm64-v8a -DQHX_VULKAN=OFF, or a static build
#   from cmake/aarch64-linux-gnu.cmake)
set -euo pipefail
if [ $# -lt 5 ]; then sed -n '2,21p' "$0"; exit 2; fi
qhx=$1 bundle=$2 pack=$3 qnn=$4 chip=$5 out=${6:-hexagon-phone-$(date +%Y%m%d-%H%M%S)}
arch=${chip#v}
for f in libQnnHtp.so libQnnSystem.so "libQnnHtpV${arch}Stub.so" "libQnnHtpV${arch}Skel.so"; do
  test -f "$qnn/$f" || { echo "hexagon_phone.sh: $qnn/$f is missing" >&2; exit 1; }
done
adb get-state >/dev/null || { echo "hexagon_phone.sh: no phone over adb" >&2; exit 1; }
remote=/data/local/tmp/qhx
adb shell "rm -rf $remote && mkdir -p $remote/lib"
adb push "$qhx" "$remote/qhx" >/dev/null
adb push "$bundle" "$remote/bundle" >/dev/null
# Only the chip's folder of the pack, as a phone downloads it.
adb shell "mkdir -p $remote/pack"
adb push "$pack/MANIFEST.json" "$remote/pack/" >/dev/null
adb push "$pack/$chip" "$remote/pack/$chip" >/dev/null
adb push "$qnn/." "$remote/lib" >/dev/null
adb shell "chmod +x $remote/qhx"
env="cd $remote && LD_LIBRARY_PATH=$remote/lib ADSP_LIBRARY_PATH=$remote/lib QHX_QNN_LIB=$remote/lib"
mkdir -p "$out"
adb shell "$env ./qhx devices" | tee "$out/devices.txt"
adb shell "$env ./qhx verify pack" | tee "$out/verify.txt"
# The NPU (checked against the CPU first), then the CPU alone, in alternating rounds.
for round in 1 2 3; do
  adb shell "$env ./qhx bench bundle --device hexagon:$chip --npu-pack pack --device-check once \
    -p 128,512,2048 -n 64 -r 3 -t 4 --json" >>"$out/npu.jsonl"
  adb shell "$env ./qhx bench bundle -p 128,512,2048 -n 64 -r 3 -t 4 --json" >>"$out/cpu.jsonl"
done
python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = {}
for kind in ("npu", "cpu"):
    for line in (out / f"{kind}.jsonl").read_text().splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows.setdefault((r["n_prompt"], kind), []).append(r)
print(f"{'n_prompt':>8} {'NPU prefill':>12} {'CPU prefill':>12} {'NPU TTFT ms':>12} {'decode':>8}")
for n in sorted({k[0] for k in rows}):
    npu, cpu = rows.get((n, "npu"), []), rows.get((n, "cpu"), [])
    m = lambda rs, k: statistics.mean(r[k] for r in rs) if rs else float("nan")
    print(f"{n:>8} {m(npu, 'prefill_tok_s'):>12.1f} {m(cpu, 'prefill_tok_s'):>12.1f} "
          f"{m(npu, 'ttft_ms'):>12.1f} {m(npu, 'decode_tok_s'):>8.1f}")
PY
echo "records in $out/"
