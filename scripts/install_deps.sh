#!/usr/bin/env bash
# System packages and the Python environment (.venv/) the project needs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# protobuf-compiler: protoc 3.21 for ONNX's generated code (the protobuf runtime itself is
# built from source by cmake/third_party.cmake, position-independent for the extension).
# clang and libclang-rt-dev (libFuzzer and the sanitizer runtimes): the fuzzing target that
# ./test.sh runs briefly (scripts/fuzz.sh).
apt_packages=(protobuf-compiler cmake ninja-build g++ libgtest-dev python3-venv clang-format clang libclang-rt-dev)
missing=()
for p in "${apt_packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${missing[@]}"
fi
[ -x "$root/.venv/bin/python" ] || python3 -m venv "$root/.venv"
"$root/.venv/bin/python" -m pip install -q --upgrade pip
"$root/.venv/bin/python" -m pip install -q -r "$root/requirements.txt"
