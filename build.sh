#!/usr/bin/env bash
# Configures and builds into build/: protobuf and ONNX from pinned sources (first time only;
# tarballs cached in .deps/downloads), the C++ core, the onnax command, the Python extension
# (into python/onnax/) and the C++ tests. Needs scripts/install_deps.sh to have run.
set -euo pipefail
root=$(cd "$(dirname "$0")" && pwd)
"$root/.venv/bin/cmake" -S "$root" -B "$root/build" -G Ninja \
  -DONNAX_BUILD_TESTS=ON \
  -DONNAX_DOWNLOAD_DIR="$root/.deps/downloads" \
  -DPython3_EXECUTABLE="$root/.venv/bin/python" \
  -Dpybind11_DIR="$("$root/.venv/bin/python" -m pybind11 --cmakedir)" >/dev/null
"$root/.venv/bin/cmake" --build "$root/build" -j "$(nproc)"
