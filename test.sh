#!/usr/bin/env bash
# Runs every test: the C++ unit tests, then the Python suite (numerical checks against ONNX
# Runtime, the ONNX reference evaluator and per-example loops). Run ./setup.sh first.
set -euo pipefail
root=$(cd "$(dirname "$0")" && pwd)
cd "$root"
./build.sh
(cd build && ctest --output-on-failure -j "$(nproc)")
.venv/bin/python -m pytest -q -n auto "$@"
