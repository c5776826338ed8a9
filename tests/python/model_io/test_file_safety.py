"""File safety of the command line on untrusted models: external data only from regular files in
the model's folder (no symbolic links), never a write over the input or the data it reads,
results written atomically (a failed write keeps the earlier result), FIFOs refused. The
successful path is checked against ONNX Runtime."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnax")


def save_with_external_data(folder: Path, name: str, data_name: str) -> np.ndarray:
    """y = x @ w with w (64 x 64) stored in `data_name` next to the model."""
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, folder / name, save_as_external_data=True, location=data_name, size_threshold=0)
    return w


def onnax_cli(*args: str, preexec_fn: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onnax", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=preexec_fn,
    )


def test_a_model_with_external_data_transforms_and_runs(tmp_path: Path) -> None:
    w = save_with_external_data(tmp_path, "m.onnx", "m.onnx.data")
    out = tmp_path / "v.onnx"
    proc = onnax_cli("vmap", str(tmp_path / "m.onnx"), "-o", str(out), "--external-data")
    assert proc.returncode == 0, proc.stderr
    xs = np.random.default_rng(1).standard_normal((3, 2, 64)).astype(np.float32)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": xs})[0], xs @ w, rtol=1e-5, atol=1e-5)
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary left


def test_external_data_through_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"token=" + b"s" * 20000)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    save_with_external_data(model_dir, "m.onnx", "w.bin")
    (model_dir / "w.bin").unlink()
    (model_dir / "w.bin").symlink_to(secret)
    out = tmp_path / "out.onnx"
    proc = onnax_cli("vmap", str(model_dir / "m.onnx"), "-o", str(out))
    assert proc.returncode == 1
    assert "symbolic link" in proc.stderr and "Fix:" in proc.stderr
    assert not out.exists()


def test_output_over_the_inputs_external_data_is_refused(tmp_path: Path) -> None:
    save_with_external_data(tmp_path, "a.onnx", "b.onnx.data")
    before = (tmp_path / "b.onnx.data").read_bytes()
    # -o b.onnx with --external-data would write b.onnx.data, the input's weights
    # (An output path that collides with what the input reads is a usage error, exit 2, as -o
    # naming the input is.)
    proc = onnax_cli("vmap", str(tmp_path / "a.onnx"), "-o", str(tmp_path / "b.onnx"), "--external-data")
    assert proc.returncode == 2
    assert "would overwrite" in proc.stderr and "b.onnx.data" in proc.stderr
    # -o naming the data file itself
    proc = onnax_cli("vmap", str(tmp_path / "a.onnx"), "-o", str(tmp_path / "b.onnx.data"))
    assert proc.returncode == 2 and "would overwrite" in proc.stderr
    assert (tmp_path / "b.onnx.data").read_bytes() == before
    sess = ort.InferenceSession(str(tmp_path / "a.onnx"), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.ones((1, 64), np.float32)})[0].shape == (1, 64)  # the source still loads


def test_a_failed_write_keeps_the_earlier_result(tmp_path: Path) -> None:
    save_with_external_data(tmp_path, "m.onnx", "m.onnx.data")
    out = tmp_path / "v.onnx"
    out.write_bytes(b"earlier result")

    def small_files() -> None:  # a file size limit below the result's size
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    proc = onnax_cli("vmap", str(tmp_path / "m.onnx"), "-o", str(out), preexec_fn=small_files)
    assert proc.returncode == 1, proc.stderr
    assert "failed" in proc.stderr and "Fix:" in proc.stderr
    assert out.read_bytes() == b"earlier result"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_fifo_input_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    proc = onnax_cli("vmap", str(fifo), "-o", str(tmp_path / "out.onnx"))
    assert proc.returncode == 1
    assert "not a regular file" in proc.stderr


def test_an_output_path_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    save_with_external_data(tmp_path, "m.onnx", "m.onnx.data")
    (tmp_path / "sub").mkdir()
    proc = onnax_cli("vmap", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "sub"))
    assert proc.returncode == 2
    assert "is a directory" in proc.stderr and "model.onnx" in proc.stderr
