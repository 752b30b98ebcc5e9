#!/usr/bin/env bash
# The device tool sends the working tree (tracked files, and untracked ones git does not ignore)
# with the paths it is told to carry, and refuses more than 64 MiB; models/ and tests/fixtures/
# alone are over 200 MB. A GPU run needs neither (bench/gpu_pack.sh packs the tokenizer), so:
#   slim     takes models/ and tests/fixtures/ out of git's index (the files stay where they
#            are) and ignores them in .git/info/exclude, and installs a pre-commit hook that
#            refuses to commit meanwhile (a commit then would delete them);
#   restore  puts both back as HEAD has them, removes the exclusion and the hook;
#   size     what a call carrying .gpu would send now (and after slim), against the limit;
#   copy DIR what a call carrying .gpu would send after slim, copied into DIR (a new folder): the
#            tree to rehearse a device run in (bash DIR/bench/gpu_device_run.sh --rehearse).
# Usage: bench/device_tree.sh slim|restore|size|copy DIR
set -euo pipefail
cd "$(dirname "$0")/.."
paths=(models tests/fixtures)
git_dir=$(git rev-parse --git-dir)
mark="$git_dir/qhx-slim"
exclude="$git_dir/info/exclude"
hook="$git_dir/hooks/pre-commit"
begin='# qhx device_tree.sh slim: begin'
end='# qhx device_tree.sh slim: end'

size() {  # what a call would send now, and (when not slim) after slim
  local limit=$((64 << 20)) untracked carried
  untracked=$(git ls-files -z --others --exclude-standard |
    xargs -0 -r stat -c %s -- | awk '{s += $1} END {print s + 0}')
  carried=$(du -sb .gpu 2>/dev/null | cut -f1 || echo 0)
  line() {  # label tracked
    local total=$(($2 + untracked + ${carried:-0}))
    printf '%s: tracked %.1f MiB + untracked %.1f MiB + .gpu %.1f MiB = %.1f MiB of %d MiB: %s\n' \
      "$1" "$(bc -l <<<"$2 / 1048576")" "$(bc -l <<<"$untracked / 1048576")" \
      "$(bc -l <<<"${carried:-0} / 1048576")" "$(bc -l <<<"$total / 1048576")" $((limit >> 20)) \
      "$([ "$total" -le "$limit" ] && echo 'fits' || echo 'TOO LARGE')"
  }
  tracked_bytes() { git ls-files -z -- "$@" | xargs -0 -r stat -c %s -- 2>/dev/null |
    awk '{s += $1} END {print s + 0}'; }
  line now "$(tracked_bytes .)"
  [ -e "$mark" ] || line "after slim" "$(tracked_bytes . "${paths[@]/#/:!}")"
}

case "${1:-}" in
  slim)
    if [ -e "$mark" ]; then echo "already slim (bench/device_tree.sh restore undoes it)"; exit 0; fi
    if [ -e "$hook" ]; then echo "device_tree.sh: $hook exists; not replacing it" >&2; exit 1; fi
    git rm -r -q --cached -- "${paths[@]}"
    mkdir -p "$(dirname "$exclude")" "$(dirname "$hook")"
    printf '%s\n' "$begin" "${paths[@]/#//}" "$end" >>"$exclude"
    printf '#!/bin/sh\necho "%s: the tree is slim for a device call; bench/device_tree.sh restore first" >&2\nexit 1\n' \
      "pre-commit" >"$hook"
    chmod +x "$hook"
    touch "$mark"
    size
    ;;
  restore)
    git reset -q -- "${paths[@]}"
    if [ -f "$exclude" ]; then sed -i "/^$begin\$/,/^$end\$/d" "$exclude"; fi
    if [ -e "$mark" ]; then rm -f "$hook" "$mark"; fi
    git status --short -- "${paths[@]}"
    ;;
  size) size ;;
  copy)
    dest=${2:?usage: bench/device_tree.sh copy DIR}
    if [ -e "$dest" ]; then echo "device_tree.sh: $dest exists" >&2; exit 1; fi
    mkdir -p "$dest"
    { git ls-files -z -- . "${paths[@]/#/:!}"; git ls-files -z --others --exclude-standard; } |
      tar -cf - --null -T - | tar -xf - -C "$dest"
    [ ! -d .gpu ] || cp -r .gpu "$dest/"
    du -sh "$dest"
    ;;
  *) echo "usage: bench/device_tree.sh slim|restore|size|copy DIR" >&2; exit 2 ;;
esac
