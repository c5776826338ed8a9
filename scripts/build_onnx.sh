#!/usr/bin/env bash
# Builds the official ONNX C++ library (protobuf types, checker, shape inference, schemas,
# parser, inliner, version converter) from the source distribution of the `onnx` version
# pinned in requirements.txt, against Debian's protobuf. Installs into .deps/onnx-<ver>/.
# Idempotent: a finished install (marked by .deps/onnx-<ver>/.done) is reused.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^onnx==\([0-9.]*\).*/\1/p' "$root/requirements.txt")
[ -n "$version" ] || { echo "build_onnx.sh: no 'onnx==X.Y.Z' pin in requirements.txt" >&2; exit 1; }
prefix="$root/.deps/onnx-$version"
[ -f "$prefix/.done" ] && { echo "ONNX $version C++ library already built in $prefix"; exit 0; }
py="$root/.venv/bin/python"
cmake_bin="$root/.venv/bin/cmake"   # recent ONNX sources need a newer CMake than Debian's
work="$root/.deps/src"
mkdir -p "$work"
if [ ! -d "$work/onnx-$version" ]; then
  # Fetch the sdist file itself (from the simple index, checking its sha256): `pip download
  # --no-binary` would also build the sdist's build dependencies from source.
  "$py" - "$version" "$work" <<'PY'
import hashlib, re, sys, urllib.request
version, dest = sys.argv[1], sys.argv[2]
index = urllib.request.urlopen("https://pypi.org/simple/onnx/").read().decode()
url, digest = re.search(rf'href="([^"#]*/onnx-{re.escape(version)}\.tar\.gz)#sha256=([0-9a-f]+)"', index).groups()
data = urllib.request.urlopen(url).read()
if hashlib.sha256(data).hexdigest() != digest:
    sys.exit(f"onnx-{version}.tar.gz: sha256 mismatch")
open(f"{dest}/onnx-{version}.tar.gz", "wb").write(data)
PY
  tar -xzf "$work/onnx-$version.tar.gz" -C "$work"
fi
"$cmake_bin" -S "$work/onnx-$version" -B "$work/build-$version" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DONNX_ML=ON -DONNX_USE_PROTOBUF_SHARED_LIBS=ON -DONNX_BUILD_TESTS=OFF \
  -DONNX_BUILD_PYTHON=OFF -DONNX_USE_LITE_PROTO=OFF -DBUILD_SHARED_LIBS=OFF \
  -DONNX_NAMESPACE=onnx -DPython3_EXECUTABLE="$py"
"$cmake_bin" --build "$work/build-$version" -j "$(nproc)"
"$cmake_bin" --install "$work/build-$version"
touch "$prefix/.done"
echo "ONNX $version C++ library installed in $prefix"
