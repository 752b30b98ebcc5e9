#!/usr/bin/env bash
# Speculative decoding (prompt lookup) on a copy-heavy task: a held-out KJV chapter's first
# twelve verses, then its heading and the first words of its first verse again, so that the
# model continues a passage the prompt already quotes. Greedy decode speed with and without
# drafts side by side (qhx bench --speculative), per model given.
# Usage: bench/speculative.sh MODEL_DIR... (e.g. W8 bundles of models/qwen3-kjv, qwen3.5-kjv)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${QHX_BUILD:-build}
task=$(mktemp --suffix=.txt)
trap 'rm -f "$task"' EXIT
python3 - "$task" <<'PY'
import sys
chapter = open("models/qwen3.5-kjv/held_out.txt", encoding="utf-8").read().split("<|endoftext|>")[0]
lines = chapter.split("\n")
heading, verses = lines[0], lines[1:13]
again = " ".join(verses[0].split()[:8])
open(sys.argv[1], "w", encoding="utf-8").write(
    heading + "\n" + "\n".join(verses) + "<|endoftext|>" + heading + "\n" + again)
PY
for model in "$@"; do
  "$build/qhx" bench "$model" --speculative ngram --draft-max "${DRAFT_MAX:-4}" \
    --prompt-file "$task" -n "${N_GEN:-128}" -r "${REPS:-3}" -t "${THREADS:-2}" ${JSON:+--json}
done
