"""Patterns real exporters write, built from the pattern itself (not only from one exported
model), each checked numerically."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from training_oracle import run

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
