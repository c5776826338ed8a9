#!/usr/bin/env bash
# One command for a fresh machine: system packages, the Python environment (.venv/), the
# build (protobuf and ONNX from pinned sources, then onnax), onnax installed into .venv/ in
# editable mode over that same build/, onnxruntime-web for `onnax validate --web` (when npm is
# present), and then the main job on a built-in example (vmap of the seed README's
# linear_loss model).
set -euo pipefail
root=$(cd "$(dirname "$0")" && pwd)
cd "$root"
./scripts/install_deps.sh
./build.sh
# scikit-build-core over build/ (already built): the package imports python/onnax/, whose
# extension ./build.sh keeps current.
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -Cbuild-dir=build -e .
# onnxruntime-web (pinned in web/package-lock.json) for `onnax validate --web`.
if command -v npm >/dev/null 2>&1; then
  (cd web && npm ci --no-audit --no-fund --loglevel=error)
else
  echo "setup: npm not found; skipping onnxruntime-web (onnax validate --web and its tests will be unavailable)"
fi
.venv/bin/python examples/linear_loss.py --out-dir out
