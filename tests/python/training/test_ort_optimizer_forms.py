"""Reverse-mode graphs that ONNX Runtime's default graph optimizations compute right.

ONNX Runtime 1.31's MatmulTransposeFusion computes MatMul(Transpose(W), v) wrongly when v is
1-D (W a run-time value: an initializer is folded first). The gradient of a matrix-vector
product with respect to the vector is W^T ct, which onnax writes as MatMul(ct, W). Checked with
ONNX Runtime at its default optimization level against numpy float64.
"""

from __future__ import annotations

import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from oracles.training_oracle import run


def matvec_loss(rows: int, cols: int) -> onnx.ModelProto:
    """loss = sum((W @ v) ** 2), W [rows, cols] and v [cols] both inputs."""
    nodes = [
        h.make_node("MatMul", ["W", "v"], ["y"], name="matvec"),
        h.make_node("Mul", ["y", "y"], ["sq"], name="square"),
        h.make_node("ReduceSum", ["sq"], ["loss"], name="sum", keepdims=0),
    ]
    graph = h.make_graph(
        nodes,
        "matvec",
        [
            h.make_tensor_value_info("W", T.FLOAT, [rows, cols]),
            h.make_tensor_value_info("v", T.FLOAT, [cols]),
        ],
        [h.make_tensor_value_info("loss", T.FLOAT, [])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize(("rows", "cols"), [(4, 4), (3, 4), (5, 2)])
def test_gradient_of_a_matrix_vector_product(rows: int, cols: int) -> None:
    rng = np.random.default_rng(rows * 10 + cols)
    w = rng.normal(size=(rows, cols)).astype(np.float32)
    v = rng.normal(size=cols).astype(np.float32)
    got = run(onnax.grad(matvec_loss(rows, cols), inputs=["W", "v"]), {"W": w, "v": v})
    y = w.astype(np.float64) @ v
    np.testing.assert_allclose(got["v_grad"], w.T.astype(np.float64) @ (2 * y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["W_grad"], np.outer(2 * y, v), rtol=1e-5, atol=1e-5)


def test_hessian_vector_product_of_a_matrix_vector_product() -> None:
    # d/dv of grad_v = 2 W^T W, applied to a direction u.
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 4)).astype(np.float32)
    v, u = rng.normal(size=4).astype(np.float32), rng.normal(size=4).astype(np.float32)
    hvp = onnax.jvp(onnax.grad(matvec_loss(3, 4), inputs=["v"]), inputs=["v"])
    got = run(hvp, {"W": w, "v": v, "v_tangent": u})
    w64 = w.astype(np.float64)
    np.testing.assert_allclose(got["v_grad_tangent"], 2 * w64.T @ (w64 @ u), rtol=1e-5, atol=1e-5)
