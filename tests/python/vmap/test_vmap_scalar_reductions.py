"""Reductions over every axis of a per-example scalar.

A Reduce* without axes reduces every axis; for a rank-0 example that is none, so each example's
result is the reduction of one element (x for ReduceSum, x * x for ReduceSumSquare, |x| for
ReduceL1, log x for ReduceLogSum...). vmap once wrote the batched node with an empty axes list,
which reduces every axis of the batch too: one number for the whole batch. (It came up as
vmap(grad(f)) of f = sum(tanh(a . b)), where the dot product of two vectors is a scalar.)
Oracle: a loop over the examples in ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from oracles import ad_oracle as ad
from oracles.vmap_oracle import REDUCE_OPS, assert_vmap_matches, make_model, node


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_all_of_a_scalar_example(op: str, keepdims: int) -> None:
    model = make_model(
        [node(op, ["x"], ["y"], keepdims=keepdims), node("Mul", ["y", "w"], ["z"])],
        [("x", TensorProto.DOUBLE, []), ("w", TensorProto.DOUBLE, [3])],
        ["z"],
    )
    positive = {"x": lambda rng: np.asarray(rng.uniform(0.5, 2.0))}  # (ReduceLogSum's domain)
    vm = assert_vmap_matches(
        model, in_axes=[0, None], gens=positive, batch_sizes=(1, 5), rtol=1e-12, atol=1e-12
    )
    assert [d.dim_param or d.dim_value for d in vm.graph.output[0].type.tensor_type.shape.dim] == ["batch", 3]


def test_per_example_gradient_of_a_dot_product() -> None:
    nodes = [
        node("MatMul", ["a", "b"], ["y"]),
        node("Tanh", ["y"], ["t"]),
        node("ReduceSum", ["t"], ["loss"], keepdims=0),
    ]
    model = ad.make_ad_model(
        nodes, [("a", TensorProto.DOUBLE, [4]), ("b", TensorProto.DOUBLE, [4])], ["loss"]
    )
    gens = {"a": ad.normal([4]), "b": ad.normal([4])}
    ad.check_per_example_grad(model, in_axes=[0, None], inputs=["b"], output="loss", gens=gens)
    ad.check_per_example_grad(model, in_axes=[0, 0], inputs=["a", "b"], output="loss", gens=gens)
