#!/usr/bin/env bash
# Installs what qhx needs to build (Debian packages) and builds it into build/ (or $1).
# Usage: tools/setup.sh [build-dir] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true

tools/install_packages.sh build-essential cmake pkg-config nlohmann-json3-dev libpcre2-dev \
  libicu-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libssl-dev libcpp-httplib-dev libmicrohttpd-dev \
  libpng-dev libjpeg-dev \
  libvulkan-dev glslc mesa-vulkan-drivers python3-pytest python3-venv \
  python3-jsonschema chromium chromium-driver python3-selenium tesseract-ocr tesseract-ocr-eng \
  fonts-dejavu-core

cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
