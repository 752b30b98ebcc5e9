#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) into build-dir (default build-fuzz; an
# existing build configured with -DQHX_FUZZ=ON is reused) and fuzzes each for N seconds
# (default 30), starting from the saved corpus (tests/fuzz/corpus/<target>/, replayed by every
# build's tests). A failing input is left in <build-dir>/crashes/ and fails the run: fix the bug,
# then add the input to tests/fuzz/corpus/<target>/ so it stays a regression test.
# Usage: tools/fuzz.sh [seconds] [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
build=${2:-build-fuzz}
if ! grep -q '^QHX_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQHX_FUZZ=ON \
    >/dev/null
fi
targets=(safetensors config tokenizer tokenizer_json manifest qhxt session_state chat_template
  request draft_vocab npu_pack embedding_config image)
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
mkdir -p "$build/crashes"
for t in "${targets[@]}"; do
  work=$build/corpus/$t
  mkdir -p "$work"
  echo "fuzzing $t for ${seconds}s"
  "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
    -rss_limit_mb=4096 -artifact_prefix="$build/crashes/$t-" -print_final_stats=1 \
    "$work" "tests/fuzz/corpus/$t" 2>&1 | grep -E '^(stat::number_of_executed_units|==|SUMMARY)' || true
  if ls "$build"/crashes/$t-* >/dev/null 2>&1; then
    echo "fuzz_$t found a failing input: $(ls "$build"/crashes/$t-*)"
    exit 1
  fi
done
