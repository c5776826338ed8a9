"""Patterns real exporters write, built from the pattern itself (not only from one exported
model), each checked numerically."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles.training_oracle import run

onnax = pytest.importorskip("onnax")


def _function_model(function_import: int, model_import: int) -> onnx.ModelProto:
    """jax2onnx's @onnx_function layout: y = Block(x), Block a local function of domain
    custom.Block.1 holding its weight as a Constant node; the function imports its own domain at
    `function_import` while the model imports it at `model_import`."""
    w = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    body = [
        helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w, "w")),
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Tanh", ["h"], ["y"]),
    ]
    domain = "custom.Block.1"
    function = helper.make_function(
        domain,
        "Block",
        ["x"],
        ["y"],
        body,
        [helper.make_opsetid("", 18), helper.make_opsetid(domain, function_import)],
    )
    graph = helper.make_graph(
        [helper.make_node("Block", ["in_0"], ["out_0"], domain=domain)],
        "g",
        [helper.make_tensor_value_info("in_0", TensorProto.FLOAT, ["B", 2])],
        [helper.make_tensor_value_info("out_0", TensorProto.FLOAT, ["B", 2])],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(domain, model_import)],
        functions=[function],
        ir_version=10,
    )


def test_local_functions_importing_their_domain_at_another_version_are_inlined() -> None:
    model = _function_model(function_import=18, model_import=1)
    x = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    w = np.array([[1.0, -2.0], [0.5, 3.0]])
    y = np.tanh(x.astype(np.float64) @ w)
    batched = onnax.vmap(model)
    np.testing.assert_allclose(run(batched, {"in_0": x[None]})["out_0"][0], y, rtol=1e-6)
    # The weight, a Constant inside the function, becomes a trainable parameter.
    promoted = onnax.constants_to_initializers(model)
    (w_name,) = onnax.select_params(promoted)
    g = onnax.grad(onnax.add_loss(promoted, "mse", reduction="sum"), inputs=[w_name])
    t = np.zeros_like(x)
    got = run(g, {"in_0": x, "label": t})[f"{w_name}_grad"]
    want = x.astype(np.float64).T @ (2 * y * (1 - y**2))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_dropout_of_ratio_zero_with_a_runtime_training_mode_is_the_identity() -> None:
    """jax2onnx turns nnx.Dropout(0.0)'s `deterministic` flag into a graph input feeding
    training_mode: with ratio 0 the node is the identity in either mode, so the model batches
    and differentiates (it was refused: 'training_mode is set or not a constant')."""
    nodes = [
        helper.make_node("Not", ["deterministic"], ["training"]),
        helper.make_node("Constant", [], ["ratio"], value=numpy_helper.from_array(np.array(0.0, np.float32))),
        helper.make_node("Tanh", ["x"], ["h"]),
        helper.make_node("Dropout", ["h", "ratio", "training"], ["d"]),
        helper.make_node("Mul", ["d", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3]),
            helper.make_tensor_value_info("deterministic", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 3])],
        [numpy_helper.from_array(np.array([1.0, -2.0, 0.5], np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    w = np.array([1.0, -2.0, 0.5])
    for flag in (True, False):
        feeds = {"x": x, "deterministic": np.array(flag)}
        batched = onnax.vmap(model, in_axes={"x": 0})
        got = run(batched, {"x": x[None], "deterministic": np.array(flag)})["y"][0]
        np.testing.assert_allclose(got, np.tanh(x.astype(np.float64)) * w, rtol=1e-6)
        g = run(onnax.vjp(model, inputs=["x"]), {**feeds, "y_cotangent": np.ones((4, 3), np.float32)})
        np.testing.assert_allclose(g["x_cotangent"], (1 - np.tanh(x.astype(np.float64)) ** 2) * w, rtol=1e-5)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [("DepthToSpace", {"mode": "DCR"}), ("DepthToSpace", {"mode": "CRD"}), ("SpaceToDepth", {})],
)
def test_depth_space_reverse_mode_runs_in_onnx_runtime(op: str, attrs: dict[str, str]) -> None:
    """Their transposes are their inverse permutations in the data's dtype (ONNX Runtime has no
    int64 DepthToSpace kernel, which a gather of positions needed): vjp by the dot-product test
    <u, op(v)> = <op^T(u), v>, run by ONNX Runtime."""
    shape_in = [2, 8, 3, 5] if op == "DepthToSpace" else [2, 2, 6, 10]
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node(op, ["x"], ["y"], blocksize=2, **attrs)],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape_in)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=10,
    )
    rng = np.random.default_rng(2)
    v = rng.standard_normal(shape_in).astype(np.float32)
    forward = run(model, {"x": v})["y"]
    u = rng.standard_normal(forward.shape).astype(np.float32)
    back = run(onnax.vjp(model, inputs=["x"]), {"x": v, "y_cotangent": u})["x_cotangent"]
    np.testing.assert_allclose(
        np.sum(u.astype(np.float64) * forward), np.sum(back.astype(np.float64) * v), rtol=1e-5
    )
    # A permutation: the transpose of a one-hot cotangent is one-hot.
    e = np.zeros_like(u)
    e.flat[7] = 1.0
    one_hot = run(onnax.vjp(model, inputs=["x"]), {"x": v, "y_cotangent": e})["x_cotangent"]
    assert np.count_nonzero(one_hot) == 1 and v.flat[int(np.argmax(one_hot))] == forward.flat[7]


def test_folded_dropouts_leave_no_dead_constants() -> None:
    ratio = numpy_helper.from_array(np.array(0.0, np.float32))
    model = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Constant", [], ["r"], value=ratio),
                helper.make_node("Dropout", ["x", "r", "training"], ["y"]),
            ],
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 2]),
                helper.make_tensor_value_info("training", TensorProto.BOOL, []),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 2])],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=10,
    )
    g = onnax.grad(onnax.add_loss(model, "mse"), inputs=["x"])
    assert [n.op_type for n in g.graph.node if n.op_type in ("Dropout", "Constant") and "r" in n.output] == []
    x = np.array([[1.0, 2.0]], np.float32)
    got = run(g, {"x": x, "training": np.array(True), "label": np.zeros_like(x)})["x_grad"]
    np.testing.assert_allclose(got, 2 * x / x.size)
