#!/usr/bin/env bash
# Runs every test: the C++ unit tests, then the Python suite (numerical checks against ONNX
# Runtime, the ONNX reference evaluator and per-example loops). Run ./setup.sh first.
set -euo pipefail
root=$(cd "$(dirname "$0")" && pwd)
cd "$root"
./build.sh
(cd build && ctest --output-on-failure -j "$(nproc)")
.venv/bin/python -m pytest -q -n auto "$@"
# Fuzzing (docs/untrusted.md): replays fuzz/regressions/ and fuzzes for a minute, when clang is
# installed (scripts/install_deps.sh installs it); ONNAX_FUZZ_SECONDS=0 only replays.
if command -v clang++ >/dev/null 2>&1; then
  scripts/fuzz.sh --ci --seconds "${ONNAX_FUZZ_SECONDS:-60}"
else
  echo "test.sh: clang++ not found; skipping the fuzzing run (scripts/install_deps.sh installs clang)"
fi
