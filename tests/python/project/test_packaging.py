"""onnax as a library: the wheel in an empty virtual environment, the C++ package from
``cmake --install`` in a consumer project, and the sdist.

The wheel and the C++ package are made from this checkout's ``build/`` (``pip wheel
-Cbuild-dir=build`` and ``cmake --install build``), which ``./test.sh`` has just built, so they
cost seconds. The wheel goes into a new virtual environment that has nothing but the wheel's
declared dependencies (from PyPI), and runs there from a directory outside the checkout: the
seed README's example (from README.md) and the ``onnax`` command. Every result is checked in
this process with ONNX Runtime against closed forms for ``loss = sum((x * w) ** 2)``:
``dloss/dw = 2 x^2 w`` per example.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "build"
CMAKE = str(ROOT / ".venv/bin/cmake") if (ROOT / ".venv/bin/cmake").exists() else "cmake"
RNG = np.random.default_rng(7)

pytestmark = pytest.mark.skipif(
    not (BUILD / "CMakeCache.txt").exists(), reason="build/ is not configured (run ./setup.sh)"
)


@contextlib.contextmanager
def build_dir_lock() -> Iterator[None]:
    """Serialises the tests that reconfigure or install from build/ (xdist runs them in
    parallel workers)."""
    with open(BUILD / ".packaging-test.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 1200) -> str:
    result = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{cmd} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


def clean_env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH into the checkout, no active venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    return env


def linear_loss(path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    w = helper.make_tensor_value_info("weight", TensorProto.FLOAT, [2])
    loss = helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])
    nodes = [
        helper.make_node("Mul", ["x", "weight"], ["prediction"]),
        helper.make_node("Mul", ["prediction", "prediction"], ["squared"]),
        helper.make_node("ReduceSum", ["squared"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(nodes, "linear_loss", [x, w], [loss])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, path)


def session_outputs(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def check_per_example_grads(path: Path, grad_name: str) -> None:
    xs = RNG.standard_normal((5, 2)).astype(np.float32)
    w = RNG.standard_normal(2).astype(np.float32)
    out = session_outputs(path, {"x": xs, "weight": w})
    np.testing.assert_allclose(out["loss"], ((xs * w) ** 2).sum(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[grad_name], 2 * xs**2 * w, rtol=1e-5, atol=1e-6)


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"```python\n(import onnx_ir as ir\n.*?)```", text, re.S)
    assert match, "README.md has no seed example block starting with 'import onnx_ir as ir'"
    return match.group(1)


def test_onnx_pin_is_the_cpp_library_version() -> None:
    pinned = re.search(r"^onnx==([0-9.]+)$", (ROOT / "requirements.txt").read_text(), re.M)
    built = re.search(r"set\(ONNAX_ONNX_VERSION ([0-9.]+)\)", (ROOT / "cmake/third_party.cmake").read_text())
    assert pinned and built
    assert pinned.group(1) == built.group(1), (
        f"requirements.txt pins onnx=={pinned.group(1)} but cmake/third_party.cmake builds the ONNX "
        f"C++ library {built.group(1)}; Fix: set ONNAX_ONNX_VERSION, its URL and SHA256 to the pin"
    )


def test_wheel_in_an_empty_virtual_environment(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    with build_dir_lock():
        run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             f"-Cbuild-dir={BUILD}", "-w", str(wheels), str(ROOT)],
            cwd=ROOT,
        )  # fmt: skip
    (wheel,) = wheels.glob("onnax-*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py, onnax_cmd = str(venv / "bin/python"), str(venv / "bin/onnax")
    run([py, "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path, env=clean_env(), timeout=600)

    work = tmp_path / "work"
    work.mkdir()
    env = clean_env()
    installed = run(
        [py, "-c", "import onnax, onnax._core as c; print(onnax.__file__); print(c.__file__)"], work, env
    )
    assert all(str(venv) in line for line in installed.split()), installed
    # The extension needs no shared library but the C++ runtime: protobuf and ONNX are inside.
    extension = Path(installed.split()[1])
    linked = run(["ldd", str(extension)], work)
    assert "protobuf" not in linked and "onnx" not in linked and "not found" not in linked, linked

    (work / "seed.py").write_text(readme_example())
    run([py, "seed.py"], work, env)
    check_per_example_grads(work / "per_example.onnx", "weight_grad")

    linear_loss(work / "linear_loss.onnx")
    run([onnax_cmd, "grad", "linear_loss.onnx", "-o", "grad.onnx", "--inputs", "weight"], work, env)
    run([onnax_cmd, "vmap", "grad.onnx", "-o", "per_example_cli.onnx", "--in-axes", "0,none"], work, env)
    check_per_example_grads(work / "per_example_cli.onnx", "weight_grad")


def test_cpp_package_in_a_consumer_project(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    with build_dir_lock():
        run([CMAKE, "--install", str(BUILD), "--prefix", str(prefix)], cwd=ROOT)
    assert not list(prefix.rglob("_core*.so")), "the Python extension leaked into the C++ package"
    consumer = tmp_path / "consumer"
    source = ROOT / "examples/cpp_consumer"
    run([CMAKE, "-S", str(source), "-B", str(consumer), f"-DCMAKE_PREFIX_PATH={prefix}"], cwd=tmp_path)
    run([CMAKE, "--build", str(consumer)], cwd=tmp_path)
    binary = consumer / "per_example_grads"
    linked = run(["ldd", str(binary)], tmp_path)
    assert "protobuf" not in linked and "not found" not in linked, linked

    linear_loss(tmp_path / "linear_loss.onnx")
    out = run([str(binary), "linear_loss.onnx", "per_example.onnx", "weight"], tmp_path)
    assert "wrote per_example.onnx" in out
    onnx.checker.check_model(onnx.load(tmp_path / "per_example.onnx"), full_check=True)
    check_per_example_grads(tmp_path / "per_example.onnx", "weight_grad")


def test_sdist_holds_what_the_build_needs(tmp_path: Path) -> None:
    pytest.importorskip("scikit_build_core")
    dist = tmp_path / "dist"
    dist.mkdir()
    name = run(
        [sys.executable, "-c", "import sys; from scikit_build_core.build import build_sdist; "
         "print(build_sdist(sys.argv[1]))", str(dist)],
        cwd=ROOT,
    ).split()[-1]  # fmt: skip
    with tarfile.open(dist / name) as archive:
        members = {m.split("/", 1)[1] for m in archive.getnames() if "/" in m}
        archive.extractall(tmp_path / "src", filter="data")
    assert not any(m.startswith(("tests/", "bench/", "build/", ".venv/")) for m in members)
    if (ROOT / ".git").exists() and shutil.which("git"):
        tracked = run(
            ["git", "ls-files", "CMakeLists.txt", "cmake", "src", "include", "cli", "python/onnax",
             "python/binding.cc", "pyproject.toml", "README.md"],
            cwd=ROOT,
        ).split()  # fmt: skip
        missing = sorted(set(tracked) - members)
        assert not missing, f"the sdist lacks tracked build inputs: {missing[:10]}"
    # The unpacked sdist configures (protobuf and ONNX download and build at build time).
    (source,) = (tmp_path / "src").iterdir()
    pybind11_dir = run([sys.executable, "-m", "pybind11", "--cmakedir"], cwd=ROOT).strip()
    out = run(
        [CMAKE, "-S", str(source), "-B", str(tmp_path / "sdist-build"), "-DONNAX_BUILD_TESTS=OFF",
         f"-DONNAX_DOWNLOAD_DIR={ROOT / '.deps/downloads'}", f"-DPython3_EXECUTABLE={sys.executable}",
         f"-Dpybind11_DIR={pybind11_dir}"],
        cwd=tmp_path,
    )  # fmt: skip
    assert "Build files have been written" in out
