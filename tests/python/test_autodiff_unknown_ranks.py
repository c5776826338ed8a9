"""Reverse mode where ONNX inference loses the ranks: broadcast cotangents are summed back with
run-time shapes (the primal twin's, or built from the tape nodes that made a tangent).

The models compute their reduction axes at run time (as ONNX's own function bodies for
RMSNormalization and friends do), so every value after the reduction has an unknown shape;
a broadcast operand of known rank then meets a cotangent of unknown rank, and an operand of
unknown rank a cotangent of known rank. Oracles: float64 finite differences and the dot-product
test (``ad_oracle``).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from ad_oracle import check_grad, check_hvp, check_jvp, check_per_example_grad, check_vjp_dot, make_ad_model
from onnx import TensorProto, helper

D = TensorProto.DOUBLE
I64 = TensorProto.INT64


def rms_norm(axis: int) -> onnx.ModelProto:
    """y = x / sqrt(mean(x^2 over axes axis.. at run time) + eps) * w; loss = sum(y * c)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Size", ["shape"], ["rank"]),
        helper.make_node("Constant", [], ["axis"], value=helper.make_tensor("axis", I64, [], [axis])),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", I64, [], [1])),
        helper.make_node("Range", ["axis", "rank", "one"], ["axes"]),
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Constant", [], ["eps"], value=helper.make_tensor("eps", D, [], [1e-3])),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
        helper.make_node("Mul", ["y", "c"], ["yc"]),
        helper.make_node("ReduceSum", ["yc"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(axis)
    return make_ad_model(
        nodes,
        [("x", D, [3, 4, 5]), ("w", D, [5])],
        [("loss", D, []), ("y", D, None)],
        initializers={"c": rng.standard_normal((3, 4, 5))},
        infer=False,
    )


MODELS = {f"axis-{a}": rms_norm(a) for a in (1, 2)}


def test_ranks_are_unknown() -> None:
    # The premise: ONNX inference cannot type the values after the run-time reduction.
    inferred = onnx.shape_inference.infer_shapes(MODELS["axis-1"])
    known = {v.name for v in inferred.graph.value_info if v.type.tensor_type.HasField("shape")}
    assert not {"ms", "rms", "n", "y"} & known


@pytest.mark.parametrize("name", sorted(MODELS))
def test_grad(name: str) -> None:
    check_grad(MODELS[name], ["x", "w"], "loss")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_vjp_dot(name: str) -> None:
    check_vjp_dot(MODELS[name], ["x", "w"])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_jvp(name: str) -> None:
    check_jvp(MODELS[name], ["x", "w"])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hvp(name: str) -> None:
    check_hvp(MODELS[name], ["x"], ["x", "w"], "loss")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_per_example_grad(name: str) -> None:
    check_per_example_grad(MODELS[name], (0, None), ["x", "w"], "loss")
