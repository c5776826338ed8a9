#!/usr/bin/env bash
# One command for a fresh machine: system packages, the Python environment (.venv/), the
# ONNX C++ library (built from the pinned onnx source distribution), onnax itself, and then
# the main job on a built-in example (vmap of the seed README's linear_loss model).
set -euo pipefail
root=$(cd "$(dirname "$0")" && pwd)
cd "$root"
./scripts/install_deps.sh
./scripts/build_onnx.sh
./build.sh
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
.venv/bin/python examples/linear_loss.py --out-dir out
