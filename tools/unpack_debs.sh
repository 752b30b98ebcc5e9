#!/usr/bin/env bash
# Unpacks Debian packages of another suite (with everything they depend on, its C library
# included) under DIR/root without installing anything. DIR/run runs a program with that suite's
# loader and libraries, DIR/bin/NAME runs the suite's /usr/bin/NAME so: newer tools than the
# machine's Debian has, side by side with it. Where the packages hold Mesa's lavapipe,
# DIR/lvp_icd.json names it for the Vulkan loader (VK_ICD_FILENAMES=DIR/lvp_icd.json DIR/run ...).
#   tools/unpack_debs.sh SUITE DIR PACKAGE...   e.g. trixie /tmp/t glslc: /tmp/t/bin/glslc
# Used for what Debian 12 lacks: a glslc that compiles GL_KHR_cooperative_matrix (Debian 13's),
# and a lavapipe with cooperative matrices to test those shaders on (Mesa 26, Debian sid).
# QHX_DEBIAN_MIRROR: the archive (default http://deb.debian.org/debian).
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,10p' "$0"; exit 2; }
suite=$1
mkdir -p "$2"
dir=$(cd "$2" && pwd)
shift 2
lists=$dir/apt-lists
rm -rf "$dir/debs" "$dir/root" "$dir/bin"
mkdir -p "$lists/partial" "$dir/debs" "$dir/bin"
# apt-get clears its lists folder of what it did not fetch: the sources live beside it.
echo "deb ${QHX_DEBIAN_MIRROR:-http://deb.debian.org/debian} $suite main" >"$dir/sources.list"
apt=(-oDir::Etc::SourceList="$dir/sources.list" -oDir::Etc::SourceParts=/dev/null
  -oDir::State::Lists="$lists" -oDir::State::Status=/dev/null -oAPT::Architecture=amd64
  -oAPT::Architectures=amd64 -oAPT::Sandbox::User=root)
apt-get "${apt[@]}" update >/dev/null
# Every package the named ones need, as real package names (virtual ones are shown as <name>).
depends=$(apt-cache "${apt[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances "$@")
mapfile -t packages < <(grep -E '^[a-z0-9]' <<<"$depends" | sort -u)
for name in "$@"; do
  grep -Fqx "$name" <<<"$depends" || {
    echo "unpack_debs.sh: $suite has no package $name" >&2
    exit 1
  }
done
(cd "$dir/debs" && apt-get "${apt[@]}" download "${packages[@]}" >/dev/null)
for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$dir/root"; done

libs=$dir/root/usr/lib/x86_64-linux-gnu
printf '#!/bin/sh\nexec %q --library-path %q "$@"\n' "$libs/ld-linux-x86-64.so.2" "$libs" \
  >"$dir/run"
chmod +x "$dir/run"
for program in "$dir"/root/usr/bin/*; do
  [ -f "$program" ] && [ -x "$program" ] || continue
  printf '#!/bin/sh\nexec %q %q "$@"\n' "$dir/run" "$program" >"$dir/bin/${program##*/}"
  chmod +x "$dir/bin/${program##*/}"
done
if [[ " $* " == *" mesa-vulkan-drivers "* ]]; then
  icds=("$dir"/root/usr/share/vulkan/icd.d/lvp_icd*.json)
  [ -f "${icds[0]}" ] || { echo "unpack_debs.sh: no lavapipe ICD in mesa-vulkan-drivers" >&2; exit 1; }
  sed -E "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$libs/libvulkan_lvp.so\"#" \
    "${icds[0]}" >"$dir/lvp_icd.json"
fi
echo "unpacked ${#packages[@]} packages of $suite under $dir/root"
