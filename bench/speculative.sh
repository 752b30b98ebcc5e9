#!/usr/bin/env bash
# Speculative decoding on KJV text, greedy decode speed with and without drafts side by side
# (qhx bench --speculative), per model given. Two tasks (TASK):
#   copy      (default) a held-out chapter's first twelve verses, then its heading and the first
#             words of its first verse again: the model continues a passage the prompt quotes
#   continue  the same chapter's heading and first three verses: the model goes on in its own words
# Drafts: SPECULATIVE=ngram (default), mtp or draft:DIR; DRAFT_MAX (4), DRAFT_VOCAB (mtp: 0 the
# model's whole draft_vocab.json, -1 the whole vocabulary).
# Usage: bench/speculative.sh MODEL_DIR... (e.g. W8 bundles of models/qwen3-kjv, qwen3.5-kjv)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${QHX_BUILD:-build}
task=$(mktemp --suffix=.txt)
trap 'rm -f "$task"' EXIT
python3 - "$task" "${TASK:-copy}" <<'PY'
import sys
chapter = open("models/qwen3.5-kjv/held_out.txt", encoding="utf-8").read().split("<|endoftext|>")[0]
lines = chapter.split("\n")
heading, verses = lines[0], lines[1:13]
if sys.argv[2] == "copy":
    again = " ".join(verses[0].split()[:8])
    text = heading + "\n" + "\n".join(verses) + "<|endoftext|>" + heading + "\n" + again
elif sys.argv[2] == "continue":
    text = heading + "\n" + "\n".join(verses[:3]) + "\n"
else:
    sys.exit(f"TASK={sys.argv[2]}: expected copy or continue")
open(sys.argv[1], "w", encoding="utf-8").write(text)
PY
for model in "$@"; do
  "$build/qhx" bench "$model" --speculative "${SPECULATIVE:-ngram}" --draft-max "${DRAFT_MAX:-4}" \
    --draft-vocab "${DRAFT_VOCAB:-0}" --prompt-file "$task" -n "${N_GEN:-128}" -r "${REPS:-3}" \
    -t "${THREADS:-2}" ${JSON:+--json}
done
