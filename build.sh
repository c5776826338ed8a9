#!/usr/bin/env bash
# Configures and builds the C++ core, the onnax command, the Python extension and the C++
# tests into build/. Needs scripts/install_deps.sh and scripts/build_onnx.sh to have run.
set -euo pipefail
root=$(cd "$(dirname "$0")" && pwd)
version=$(sed -n 's/^onnx==\([0-9.]*\).*/\1/p' "$root/requirements.txt")
"$root/.venv/bin/cmake" -S "$root" -B "$root/build" -G Ninja \
  -DONNX_PREFIX="$root/.deps/onnx-$version" \
  -DPython3_EXECUTABLE="$root/.venv/bin/python" \
  -Dpybind11_DIR="$("$root/.venv/bin/python" -m pybind11 --cmakedir)" >/dev/null
"$root/.venv/bin/cmake" --build "$root/build" -j "$(nproc)"
