"""onnax.linearize (jax.linearize): jvp split into a primal model (outputs, then residuals) and
a linear model (residuals and input tangents to output tangents), checked against JAX's own
linearize in float64, for linearity, and for leaving the primal computation out of the linear
model; the command line writes the same two models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles.nested_loops import jax_loss, nested

onnax = pytest.importorskip("onnax")
D = TensorProto.DOUBLE


def mlp() -> onnx.ModelProto:
    """y = tanh(x W1 + b) W2, loss = sum(softplus(y)); outputs y and loss."""
    rng = np.random.default_rng(5)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["h"]),
            helper.make_node("MatMul", ["h", "W2"], ["y"]),
            helper.make_node("Softplus", ["y"], ["sp"]),
            helper.make_node("ReduceSum", ["sp"], ["loss"], keepdims=0),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", D, ["batch", 3]), helper.make_tensor_value_info("W1", D, [3, 4])],
        [helper.make_tensor_value_info("y", D, ["batch", 2]), helper.make_tensor_value_info("loss", D, [])],
        initializer=[
            numpy_helper.from_array(0.3 * rng.standard_normal(4), "b"),
            numpy_helper.from_array(0.5 * rng.standard_normal((4, 2)), "W2"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def jax_mlp(model: onnx.ModelProto) -> Any:
    import jax
    import jax.numpy as jnp

    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}

    def f(x: Any, w1: Any) -> Any:
        y = jnp.tanh(x @ w1 + init["b"]) @ init["W2"]
        return y, jnp.sum(jax.nn.softplus(y))

    return f


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in wanted}), strict=True))


def test_mlp_matches_jax_linearize_and_is_linear() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    model = mlp()
    primal, linear = onnax.linearize(model, inputs=["x", "W1"])
    # The linear model holds no primal non-linearity: only the products and sums of tangents.
    assert not {"Tanh", "Softplus"} & {n.op_type for n in linear.graph.node}
    assert [i.name for i in linear.graph.input][-2:] == ["x_tangent", "W1_tangent"]
    assert [o.name for o in linear.graph.output] == ["y_tangent", "loss_tangent"]
    rng = np.random.default_rng(6)
    x, w1 = rng.standard_normal((5, 3)), rng.standard_normal((3, 4))
    residuals = run(primal, {"x": x, "W1": w1})
    (want_y, want_loss), f_jvp = jax.linearize(jax_mlp(model), x, w1)
    np.testing.assert_allclose(residuals["y"], np.asarray(want_y), rtol=1e-12)
    np.testing.assert_allclose(residuals["loss"], np.asarray(want_loss), rtol=1e-12)
    tangents = [(rng.standard_normal((5, 3)), rng.standard_normal((3, 4))) for _ in range(2)]
    got = []
    for tx, tw in tangents:
        out = run(linear, {**residuals, "x_tangent": tx, "W1_tangent": tw})
        want_ty, want_tl = f_jvp(tx, tw)
        np.testing.assert_allclose(out["y_tangent"], np.asarray(want_ty), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(out["loss_tangent"], np.asarray(want_tl), rtol=1e-10, atol=1e-12)
        got.append(out)
    (tx1, tw1), (tx2, tw2) = tangents
    mixed = run(linear, {**residuals, "x_tangent": 2 * tx1 - 3 * tx2, "W1_tangent": 2 * tw1 - 3 * tw2})
    np.testing.assert_allclose(
        mixed["y_tangent"], 2 * got[0]["y_tangent"] - 3 * got[1]["y_tangent"], atol=1e-10
    )


@pytest.mark.parametrize("depth", [1, 3])
def test_nested_loops_match_jax_linearize(depth: int) -> None:
    """A JVP loop carries primal and tangent state side by side: the primal model keeps its
    primal part, the linear model runs it from the residuals."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    model = nested(depth)
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    primal, linear = onnax.linearize(model, inputs=["x", "W"])
    rng = np.random.default_rng(7)
    x, tx, tw = rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), rng.standard_normal((3, 3))
    residuals = run(primal, {"x": x})
    assert all(i.name in residuals or i.name.endswith("_tangent") for i in linear.graph.input)
    out = run(linear, {**residuals, "x_tangent": tx, "W_tangent": tw})
    want, f_jvp = jax.linearize(lambda xx, ww: jax_loss(depth, "const", 0)(xx, ww, w["b"]), x, w["W"])
    np.testing.assert_allclose(residuals["loss"], np.asarray(want), rtol=1e-12)
    np.testing.assert_allclose(out["loss_tangent"], np.asarray(f_jvp(tx, tw)), rtol=1e-10, atol=1e-12)


def test_command_line_writes_both_parts(tmp_path: Path) -> None:
    model = mlp()
    source, p_path, l_path = tmp_path / "mlp.onnx", tmp_path / "primal.onnx", tmp_path / "linear.onnx"
    onnx.save(model, source)
    args = ["linearize", str(source), "-o", str(p_path), "--linear", str(l_path), "--inputs", "x"]
    proc = subprocess.run([sys.executable, "-m", "onnax", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    primal, linear = onnax.linearize(model, inputs=["x"])
    x, tx = np.ones((2, 3)), np.full((2, 3), 0.5)
    w1 = np.random.default_rng(8).standard_normal((3, 4))
    feeds = run(onnx.load(p_path), {"x": x, "W1": w1})
    want = run(linear, {**run(primal, {"x": x, "W1": w1}), "x_tangent": tx})
    got = run(onnx.load(l_path), {**feeds, "x_tangent": tx})
    np.testing.assert_allclose(got["loss_tangent"], want["loss_tangent"], rtol=1e-12)
    jvp = run(onnax.jvp(model, inputs=["x"]), {"x": x, "W1": w1, "x_tangent": tx})
    np.testing.assert_allclose(got["y_tangent"], jvp["y_tangent"], rtol=1e-12)


@pytest.mark.parametrize(
    ("extra", "words"),
    [([], "needs --linear"), (["--linear", "SAME"], "same file as -o")],
)
def test_command_line_refuses_a_missing_or_clashing_linear_path(
    extra: list[str], words: str, tmp_path: Path
) -> None:
    source, out = tmp_path / "mlp.onnx", tmp_path / "primal.onnx"
    onnx.save(mlp(), source)
    extra = [str(out) if e == "SAME" else e for e in extra]
    proc = subprocess.run(
        [sys.executable, "-m", "onnax", "linearize", str(source), "-o", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert not out.exists()
