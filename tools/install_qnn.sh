#!/usr/bin/env bash
# Installs Qualcomm's QNN libraries for x86_64 Linux (PyPI's onnxruntime-qnn wheel: the HTP
# simulator, libQnnHtp.so and libQnnSystem.so) into a virtual environment of their own, outside
# the repository, and prints the folder that holds them (for QHX_QNN_LIB or --qnn-lib). Only the
# libraries are used, so the wheel's Python dependencies are not installed.
# Usage: tools/install_qnn.sh [venv-dir]    (default: ~/.cache/qhx/qnn-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-$HOME/.cache/qhx/qnn-venv}
version=2.7.0  # QAIRT 2.51.0: QNN core API 2.40, HTP 5.51
tools/install_packages.sh python3-venv >&2
if [ ! -x "$venv/bin/pip" ]; then python3 -m venv "$venv" >&2; fi
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "onnxruntime-qnn==$version" >&2
lib=$("$venv/bin/python" -c 'import pathlib, sysconfig; print(pathlib.Path(sysconfig.get_paths()["purelib"]) / "onnxruntime_qnn")')
test -f "$lib/libQnnHtp.so" || { echo "install_qnn.sh: no libQnnHtp.so in $lib" >&2; exit 1; }
echo "$lib"
