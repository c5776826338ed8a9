"""apply_params on a model whose weights are Constants inside local functions (jax2onnx's
@onnx_function): the names constants_to_initializers gave them are found, and the trained values
land in the model (its functions inlined), checked by running it in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from oracles.training_oracle import run

W = np.arange(6, dtype=np.float32).reshape(3, 2) / 10


def model_with_function_weights() -> onnx.ModelProto:
    dense = helper.make_function(
        "local",
        "Dense",
        ["x"],
        ["y"],
        [
            helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(W)),
            helper.make_node("MatMul", ["x", "w"], ["y"]),
        ],
        [helper.make_opsetid("", 18)],
    )
    graph = helper.make_graph(
        [helper.make_node("Dense", ["x"], ["y"], domain="local")],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, [4, 2])],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
        functions=[dense],
        ir_version=10,
    )


def test_trained_values_reach_weights_inside_functions() -> None:
    model = model_with_function_weights()
    lifted = onnax.constants_to_initializers(model)
    (name,) = [t.name for t in lifted.graph.initializer]
    trained = W * -3 + 1
    result = onnax.apply_params(model, {name: trained})
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(run(result, {"x": x})["y"], x @ trained, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"are neither initializers nor Constant outputs"):
        onnax.apply_params(model, {"unknown": trained})
