"""`onnax grad|jvp|vjp` on the command line, checked against the closed-form derivatives of
the seed README's linear_loss model: loss = sum((x * w)^2)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

ONNAX = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "onnax"
RNG = np.random.default_rng(7)
X = RNG.standard_normal(2).astype(np.float32)
W = RNG.standard_normal(2).astype(np.float32)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nodes = [
        helper.make_node("Mul", ["x", "weight"], ["prediction"]),
        helper.make_node("Mul", ["prediction", "prediction"], ["squared"]),
        helper.make_node("ReduceSum", ["squared"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "linear_loss",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "weight")],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    )
    path = tmp_path_factory.mktemp("cli_ad") / "linear_loss.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ONNAX), *args], capture_output=True, text=True, timeout=60, check=False)


def run_model(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def test_grad(model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "grad.onnx"
    result = run_cli("grad", str(model_path), "-o", str(out), "--inputs", "weight", "--output", "loss")
    assert result.returncode == 0, result.stderr
    values = run_model(out, {"x": X, "weight": W})
    assert list(values) == ["loss", "weight_grad"]
    np.testing.assert_allclose(values["loss"], np.sum((X * W) ** 2), rtol=1e-6)
    np.testing.assert_allclose(values["weight_grad"], 2 * X**2 * W, rtol=1e-6)


def test_jvp(model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "jvp.onnx"
    result = run_cli("jvp", str(model_path), "-o", str(out), "--inputs", "x", "--outputs", "loss")
    assert result.returncode == 0, result.stderr
    v = RNG.standard_normal(2).astype(np.float32)
    values = run_model(out, {"x": X, "weight": W, "x_tangent": v})
    np.testing.assert_allclose(values["loss_tangent"], np.sum(2 * X * W * W * v), rtol=1e-5)


def test_vjp(model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "vjp.onnx"
    result = run_cli("vjp", str(model_path), "-o", str(out), "--inputs", "weight", "--outputs", "loss")
    assert result.returncode == 0, result.stderr
    u = np.array(1.7, dtype=np.float32)
    values = run_model(out, {"x": X, "weight": W, "loss_cotangent": u})
    np.testing.assert_allclose(values["weight_cotangent"], u * 2 * X**2 * W, rtol=1e-6)


def test_unknown_selection_lists_available_names(model_path: Path, tmp_path: Path) -> None:
    result = run_cli("grad", str(model_path), "-o", str(tmp_path / "g.onnx"), "--inputs", "bias")
    assert result.returncode == 1
    assert "'bias'" in result.stderr and "'x'" in result.stderr and "'weight'" in result.stderr
    assert "Fix:" in result.stderr
    assert not (tmp_path / "g.onnx").exists()


def test_grad_through_a_loop_matches_jax(tmp_path: Path) -> None:
    # The corpus GRU over jax.lax.scan (an ONNX Loop whose weights are loop-carried constants):
    # `onnax grad` on the command line against jax.grad in float64.
    root = Path(__file__).resolve().parents[3] / "conformance" / "corpus" / "models"
    ref = np.load(root / "jax_gru_scan.npz")
    params = ["const_2", "const_1", "const_0"]
    out = tmp_path / "gru_grad.onnx"
    result = run_cli(
        "grad",
        str(root / "jax_gru_scan.onnx"),
        "-o",
        str(out),
        "--inputs",
        ",".join(params),
        "--output",
        "loss",
    )
    assert result.returncode == 0, result.stderr
    values = run_model(out, {k: ref[f"grad/feed/{k}"] for k in ("xs", "h0")})
    assert list(values)[2:] == [f"{p}_grad" for p in params]
    for i, p in enumerate(params):
        np.testing.assert_allclose(values[f"{p}_grad"], ref[f"grad/out/{2 + i}"], rtol=1e-4, atol=1e-6)
