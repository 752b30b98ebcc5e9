#!/usr/bin/env bash
# Builds here what bench/gpu_device_run.sh needs on a lent GPU machine, which reaches no package
# registry and has neither glslc nor qhx's build dependencies. .gpu/ (git-ignored) then holds:
#   qhx.tar.xz    bin/qhx (a wrapper that points the loader at lib/), bin/qhx.bin, the shared
#                 libraries it needs beyond glibc and the Vulkan loader (ICU, ...), and the Qwen3
#                 tokenizer files the comparison copies into its checkpoints;
#   llama.tar.xz  llama.cpp's llama-bench and llama-quantize with its Vulkan backend, built for
#                 any x86-64 with AVX2 (compare_llama_cpp.py --portable-cpu), and the parts of its
#                 source tree the comparison reads (gguf-py, the converter's tables, llama-arch.h,
#                 the sdist's changelog, the licence);
#   fixtures.tar.xz  tests/fixtures' tiny Hugging Face checkpoints, without their golden
#                 outputs, for bench/gpu_check.sh (device_tree.sh slim takes tests/fixtures out
#                 of the tree the call sends);
#   debs/         the Vulkan loader and GLVND as Debian amd64 packages (the device README's list:
#                 the machine may have no loader, and NVIDIA's ICD needs GLVND).
# Then it prints what a device call would send (bench/device_tree.sh size).
# Usage: bench/gpu_pack.sh     (QHX_BUILD: qhx build directory, default build-gpu;
#                               QHX_LLAMA_CACHE: compare_llama_cpp.py's cache)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${QHX_BUILD:-build-gpu}  # its own: configured with a glslc from the cache
cache=${QHX_LLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qhx-llama-cpp}
version=$(sed -n 's/^DEFAULT_VERSION = "\([^"]*\)".*/\1/p' bench/compare_llama_cpp.py)
out=.gpu
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

tools/install_packages.sh xz-utils

# llama.cpp's Vulkan backend needs newer Vulkan headers than Debian 12's (VK_EXT_layer_settings),
# and its cooperative-matrix shaders (the tensor cores it uses on NVIDIA, AMD and Intel GPUs) a
# newer glslc: Debian 13's, unpacked under the cache. qhx's cooperative-matrix shaders need that
# glslc too.
toolchain=$cache/trixie
[ -x "$toolchain/bin/glslc" ] || tools/unpack_debs.sh trixie "$toolchain" glslc libvulkan-dev \
  spirv-headers
tools/setup.sh "$build" -DVulkan_GLSLC_EXECUTABLE="$toolchain/bin/glslc"

"$toolchain/bin/glslc" --version | head -1
python3 bench/compare_llama_cpp.py --vulkan --portable-cpu --setup-only --cache "$cache" \
  --llama-cmake-args "-DVulkan_GLSLC_EXECUTABLE=$toolchain/bin/glslc \
    -DVulkan_INCLUDE_DIR=$toolchain/root/usr/include \
    -DSPIRV-Headers_DIR=$toolchain/root/usr/share/cmake/SPIRV-Headers"
rm -rf "$out" && mkdir -p "$out/debs"

# qhx and the libraries it loads, but glibc's own (the machine's is newer than Debian 12's) and
# the Vulkan loader (from the packages, so that llama-bench finds the same one).
mkdir -p "$stage/qhx/bin" "$stage/qhx/lib" "$stage/qhx/tokenizer"
cp "$build/qhx" "$stage/qhx/bin/qhx.bin"
ldd "$build/qhx" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libvulkan)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/qhx/lib/"; done
cat >"$stage/qhx/bin/qhx" <<'EOF'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/qhx.bin" "$@"
EOF
chmod +x "$stage/qhx/bin/qhx"
cp tests/fixtures/tokenizer/qwen3/{tokenizer.json,tokenizer_config.json,LICENSE,NOTICE} \
  "$stage/qhx/tokenizer/"
echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- src tools include CMakeLists.txt || echo -dirty)" >"$stage/qhx/COMMIT"
tar -cJf "$out/qhx.tar.xz" -C "$stage/qhx" .

# llama.cpp: the portable Vulkan build and what compare_llama_cpp.py reads of its sources.
sdist=src/llama_cpp_python-$version
vendor=$sdist/vendor/llama.cpp
bin=build-$version-vulkan-portable/bin
(cd "$cache" && tar -cJf - "$bin/llama-bench" "$bin/llama-quantize" "$sdist/CHANGELOG.md" \
  "$vendor/CMakeLists.txt" "$vendor/LICENSE" "$vendor/convert_hf_to_gguf.py" "$vendor/conversion" \
  "$vendor/gguf-py" "$vendor/src/llama-arch.h") >"$out/llama.tar.xz"

# The checkpoints (config.json and weights) of the fixtures, by family.
(cd tests/fixtures && find qwen3 qwen3_5 -name config.json -printf '%h\n' | sort |
  while read -r ckpt; do
    find "$ckpt" -maxdepth 1 -type f \( -name 'config.json' -o -name 'generation_config.json' \
      -o -name 'model*.safetensors' -o -name 'model.safetensors.index.json' \)
  done | tar -cJf - -T -) >"$out/fixtures.tar.xz"

loader=(libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
tools/unpack_debs.sh bookworm "$stage/bookworm" "${loader[@]}"
for package in "${loader[@]}"; do cp "$stage/bookworm/debs/${package}_"*.deb "$out/debs/"; done

ls -l "$out" "$out/debs"
bench/device_tree.sh size
