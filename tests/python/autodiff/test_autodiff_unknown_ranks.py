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
import onnax
import onnx
import pytest
from onnx import TensorProto, helper
from oracles.ad_oracle import (
    ad_error,
    check_grad,
    check_hvp,
    check_jvp,
    check_per_example_grad,
    check_vjp_dot,
    make_ad_model,
)

D = TensorProto.DOUBLE
I64 = TensorProto.INT64


def normalized(axis: int | None, out: str) -> list[onnx.NodeProto]:
    """out = x / sqrt(mean(x^2 over axes axis.. (None: the last axis), found at run time) + eps)."""
    first = (
        [helper.make_node("Constant", [], ["axis"], value=helper.make_tensor("axis", I64, [], [axis]))]
        if axis is not None
        else [helper.make_node("Sub", ["rank", "one"], ["axis"])]
    )
    return [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Size", ["shape"], ["rank"]),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", I64, [], [1])),
        *first,
        helper.make_node("Range", ["axis", "rank", "one"], ["axes"]),
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Constant", [], ["eps"], value=helper.make_tensor("eps", D, [], [1e-3])),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], [out]),
    ]


def rms_norm(axis: int) -> onnx.ModelProto:
    """y = x / sqrt(mean(x^2 over axes axis.. at run time) + eps) * w; loss = sum(y * c)."""
    nodes = [
        *normalized(axis, "n"),
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


# --------------------------------------------------------------------------------------------
# MatMul with an operand of unknown rank: an activation normalized over run-time axes, times a
# weight matrix or vector (reverse mode flattens the activation's leading axes for the weight's
# gradient, and a 1-D activation is one row), or a matrix times the activation.


def normalized_product(
    x_shape: list[int], other: str, other_shape: list[int], left: bool = False
) -> onnx.ModelProto:
    """h = x / sqrt(mean(x^2 over the last axis, found at run time) + eps), passed through an
    If whose other branch adds an axis (so no inference knows h's rank, as in AffineGrid's
    function body); y = h @ other (or other @ h with `left`); loss = sum(y * c)."""
    then_branch = helper.make_graph(
        [helper.make_node("Identity", ["hn"], ["h_then"])],
        "then",
        [],
        [helper.make_tensor_value_info("h_then", D, None)],
    )
    else_branch = helper.make_graph(
        [
            helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", I64, [1], [0])),
            helper.make_node("Unsqueeze", ["hn", "zero"], ["h_else"]),
        ],
        "else",
        [],
        [helper.make_tensor_value_info("h_else", D, None)],
    )
    nodes = [
        *normalized(None, "hn"),
        helper.make_node(
            "Constant", [], ["keep"], value=helper.make_tensor("keep", TensorProto.BOOL, [], [True])
        ),
        helper.make_node("If", ["keep"], ["h"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("MatMul", [other, "h"] if left else ["h", other], ["y"]),
        helper.make_node("Mul", ["y", "c"], ["yc"]),
        helper.make_node("ReduceSum", ["yc"], ["loss"], keepdims=0),
    ]
    x = np.zeros(x_shape)
    o = np.zeros(other_shape)
    y_shape = np.matmul(o, x).shape if left else np.matmul(x, o).shape
    rng = np.random.default_rng(len(x_shape) * 10 + len(other_shape))
    return make_ad_model(
        nodes,
        [("x", D, x_shape), (other, D, other_shape)],
        [("loss", D, [])],
        initializers={"c": rng.standard_normal(y_shape)},
        infer=False,
    )


PRODUCTS = {
    # (model, selected inputs): the weight is selected except where it would be the tangent
    # beside a primal of unknown rank on the right (refused: its layout is ambiguous).
    "batched-times-matrix": (normalized_product([3, 4, 5], "W", [5, 2]), ["x", "W"]),
    "vector-times-matrix": (normalized_product([5], "W", [5, 2]), ["x", "W"]),
    "batched-times-vector": (normalized_product([3, 4, 5], "v", [5]), ["x", "v"]),
    "vector-times-vector": (normalized_product([5], "v", [5]), ["x", "v"]),
    "matrix-times-batched": (normalized_product([3, 4, 5], "A", [2, 4], left=True), ["x"]),
}


def test_product_ranks_are_unknown() -> None:
    inferred = onnx.shape_inference.infer_shapes(PRODUCTS["batched-times-matrix"][0])
    known = {v.name for v in inferred.graph.value_info if v.type.tensor_type.HasField("shape")}
    assert not {"h", "y"} & known


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_product_grad(name: str) -> None:
    model, inputs = PRODUCTS[name]
    check_grad(model, inputs, "loss")


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_product_vjp_dot(name: str) -> None:
    model, inputs = PRODUCTS[name]
    check_vjp_dot(model, inputs)


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_product_hvp(name: str) -> None:
    model, inputs = PRODUCTS[name]
    check_hvp(model, inputs, inputs, "loss")


def test_product_with_an_ambiguous_layout_is_refused() -> None:
    # The matrix is the tangent and the activation (unknown rank) the primal on its right: a
    # 1-D activation would make the cotangent's layout different; refused with a diagnostic.
    model, _ = PRODUCTS["matrix-times-batched"]
    msg = ad_error(onnax.grad, model, inputs=["x", "A"], output="loss")
    assert "ai.onnx::MatMul" in msg and "rank of operand 1 is unknown" in msg and "Fix:" in msg, msg
    # (a transpose rule's error, named after the transform called)
    assert msg.startswith("grad: cannot transpose the linear ai.onnx::MatMul"), msg


# --------------------------------------------------------------------------------------------
# Reductions over axes given at run time, kept as size-1 dims and broadcast back. Inside a
# rule's JVP the reduced tangent has no primal twin and unknown dims, so only the reduction's
# run-time shape tells reverse mode to sum the cotangent over the broadcast axis.


def runtime_axes_model(op: str, keepdims: int) -> onnx.ModelProto:
    """r = op(x, axes) (axes an int64 input); y = (x - r) * c for keepdims, else r * c;
    loss = sum(y * y)."""
    nodes = [helper.make_node(op, ["x", "axes"], ["r"], keepdims=keepdims)]
    if keepdims:
        nodes.append(helper.make_node("Sub", ["x", "r"], ["d"]))
    nodes += [
        helper.make_node("Mul", ["d" if keepdims else "r", "c"], ["y"]),
        helper.make_node("Mul", ["y", "y"], ["y2"]),
        helper.make_node("ReduceSum", ["y2"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(keepdims)
    return make_ad_model(
        nodes,
        [("x", D, [3, 4]), ("axes", I64, [1])],
        [("loss", D, [])],
        initializers={"c": rng.standard_normal((3, 4) if keepdims else (3,))},
        infer=False,
    )


@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("op", ["ReduceLogSumExp", "ReduceL2", "ReduceSum"])
def test_runtime_axes_reduction_grad(op: str, keepdims: int) -> None:
    m = runtime_axes_model(op, keepdims)
    gens = {"axes": lambda rng, dtype: np.array([1], dtype=np.int64)}
    check_grad(m, ["x"], "loss", gens=gens)
    check_vjp_dot(m, ["x"], gens=gens)
