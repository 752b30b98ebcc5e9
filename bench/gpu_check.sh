#!/usr/bin/env bash
# The correctness check before any GPU figure is believed: on each Hugging Face checkpoint under
# FIXTURES (tests/fixtures' tiny ones, which CI holds equal to transformers on the CPU), as it is
# and as W8 and W4 bundles, greedy ids from a short and a long prompt (past the 16 rows where
# the cooperative-matrix matmuls start and the 64-token chunks of the delta rule) with the prompt
# and the reply on the GPU and no device check, against the same on the CPU. The checkpoints'
# ids must be the same. A quantized bundle's may part where two tokens are nearly tied (a float
# rounding apart moves an int8 activation a step: random tiny models have such ties), so where
# they part qhx's device check (the gate's tolerances, its own prompts) must pass instead. One
# line per case; exits 1 if any fails.
# Usage: bench/gpu_check.sh QHX FIXTURES WORK     (QHX: the qhx binary; WORK: for the bundles)
set -euo pipefail
[ $# = 3 ] || { echo "usage: bench/gpu_check.sh QHX FIXTURES WORK" >&2; exit 2; }
qhx=$1 fixtures=$2 work=$3
mkdir -p "$work"
n_gen=24
failed=0 cases=0 gated=0
mapfile -t checkpoints < <(find "$fixtures" -name config.json -printf '%h\n' | sort)
[ ${#checkpoints[@]} -gt 0 ] || { echo "gpu_check: no checkpoint (config.json) under $fixtures" >&2; exit 1; }

errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
ids_on() {  # device model prompt-ids: the greedy reply's ids, or the error that stopped it
  "$qhx" generate --model "$2" --device "$1" --decode-device "$1" --device-check never \
    --prompt-ids "$3" -n "$n_gen" --greedy --print-ids 2>"$errors" ||
    echo "failed: $(tail -1 "$errors")"
}
device_check() {  # model: the device check's line (against the CPU, on the same model)
  "$qhx" generate --model "$1" --device vulkan --decode-device vulkan --device-check always \
    --prompt-ids 1,2,3 -n 1 --greedy --print-ids 2>&1 >/dev/null | awk '/with the CPU/ && !line {line = $0} END {print line}'
}
first_difference() {  # ids ids: the 0-based index of the first id they differ in
  paste -d' ' <(tr , '\n' <<<"$1") <(tr , '\n' <<<"$2") | awk '$1 != $2 {print NR - 1; exit}'
}

for ckpt in "${checkpoints[@]}"; do
  name=$(basename "$(dirname "$ckpt")")/$(basename "$ckpt")
  vocab=$(python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))
print(c.get("vocab_size") or c["text_config"]["vocab_size"])' "$ckpt/config.json")
  models=("$ckpt")
  for weights in w8 w4; do
    bundle=$work/$(echo "$name" | tr / _)-$weights
    "$qhx" forge convert "$ckpt" -o "$bundle" --weights "$weights" --no-gate --force 2>"$errors" ||
      { cat "$errors" >&2; exit 1; }
    models+=("$bundle")
  done
  for model in "${models[@]}"; do
    for n_prompt in 40 150; do
      ids=$(seq 7 13 $((13 * n_prompt + 6)) | awk -v v="$vocab" '{print $1 % v}' | paste -sd,)
      cpu=$(ids_on cpu "$model" "$ids")
      gpu=$(ids_on vulkan "$model" "$ids")
      what="$name $( [ "$model" = "$ckpt" ] && echo checkpoint || echo "${model##*-}") pp$n_prompt"
      cases=$((cases + 1)) gate=
      if [[ $cpu != failed:* ]] && [ "$cpu" = "$gpu" ]; then
        printf '%-52s same %d ids\n' "$what" "$n_gen"
      elif [ "$model" != "$ckpt" ] && [[ $cpu != failed:* ]] && [[ $gpu != failed:* ]] &&
        gate=$(device_check "$model") && [[ $gate == *" agrees with the CPU: gate passed"* ]]; then
        gated=$((gated + 1))
        printf '%-52s ids part at %d of %d; device check: %s\n' "$what" \
          "$(first_difference "$cpu" "$gpu")" "$n_gen" "$(sed -n 's/.*\(gate passed[^;]*\).*/\1/p' <<<"$gate")"
      else
        printf '%-52s DIFFERENT\n  cpu    %s\n  vulkan %s\n' "$what" "$cpu" "$gpu"
        [ -z "${gate:-}" ] || echo "  $gate"
        failed=$((failed + 1))
      fi
    done
  done
done
echo "gpu_check: of $cases cases, $((cases - failed - gated)) give the CPU's greedy ids on the GPU," \
  "$gated part from them where the device check passes, $failed fail"
[ "$failed" = 0 ]
