#!/usr/bin/env bash
# Unpacks Debian packages of another suite (with everything they depend on, its C library
# included) under DIR/root without installing anything. DIR/run runs a program with that suite's
# loader and libraries, DIR/bin/NAME runs the suite's /usr/bin/NAME so: newer tools than the
# machine's Debian has, side by side with it. Where the packages hold Mesa's lavapipe,
# DIR/lvp_icd.json names it for the Vulkan loader (VK_ICD_FILENAMES=DIR/lvp_icd.json DIR/run ...).
#   tools/unpack_debs.sh SUITE DIR PACKAGE...   e.g. trixie /tmp/t glslc: /tmp/t/bin/glslc
# Used for what Debian 12 lacks: a glslc that compiles GL_KHR_cooperative_matrix (Debian 13's),
# and a lavapipe with cooperative matrices to test those shaders on (Mesa 26, Debian sid).
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,9p' "$0"; exit 2; }
suite=$1 dir=$2
shift 2
lists=$dir/apt-lists
mkdir -p "$lists/partial" "$dir/debs"
# apt-get clears its lists folder of what it did not fetch: the sources live beside it.
echo "deb http://deb.debian.org/debian $suite main" >"$dir/sources.list"
apt=(-oDir::Etc::SourceList="$dir/sources.list" -oDir::Etc::SourceParts=/dev/null
  -oDir::State::Lists="$lists" -oDir::State::Status=/dev/null -oAPT::Architecture=amd64
  -oAPT::Architectures=amd64 -oAPT::Sandbox::User=root)
apt-get "${apt[@]}" update >/dev/null
# Every package the named ones need, as real package names (virtual ones are shown as <name>).
mapfile -t packages < <(apt-cache "${apt[@]}" depends --recurse --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances "$@" | grep -E '^[a-z0-9]' | sort -u)
(cd "$dir/debs" && apt-get "${apt[@]}" download "${packages[@]}" >/dev/null)
rm -rf "$dir/root"
for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$dir/root"; done
libs=$dir/root/usr/lib/x86_64-linux-gnu
printf '#!/bin/sh\nexec %s --library-path %s "$@"\n' "$libs/ld-linux-x86-64.so.2" "$libs" \
  >"$dir/run"
chmod +x "$dir/run"
rm -rf "$dir/bin" && mkdir -p "$dir/bin"
for program in "$dir"/root/usr/bin/*; do
  [ -f "$program" ] && [ -x "$program" ] || continue
  printf '#!/bin/sh\nexec %s %s "$@"\n' "$dir/run" "$program" >"$dir/bin/${program##*/}"
  chmod +x "$dir/bin/${program##*/}"
done
icd=$dir/root/usr/share/vulkan/icd.d/lvp_icd.json
if [ -f "$icd" ]; then
  sed "s#\"libvulkan_lvp.so\"#\"$libs/libvulkan_lvp.so\"#" "$icd" >"$dir/lvp_icd.json"
fi
echo "unpacked ${#packages[@]} packages of $suite under $dir/root"
