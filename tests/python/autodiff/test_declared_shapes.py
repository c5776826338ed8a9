"""Declared shapes that inference cannot confirm are claims, not facts.

A Reshape to a run-time shape has sizes ONNX's inference cannot know; an exporter's value_info
may still declare some, and may declare them wrong. ONNX Runtime runs such a source (its kernels
take sizes from the data). A transform must not bake the declared sizes into its result, and
must not copy them into the result's value_info either: ONNX Runtime folds the result's Shape
nodes to the declared sizes. Each case is checked against float64 finite differences of the
source (grad, Hessian-vector product) or a loop over examples (vmap, per-example gradients),
with declarations that are absent, right, symbolic and wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from oracles import ad_oracle as ad
from oracles.vmap_oracle import assert_vmap_matches, node

D = TensorProto.DOUBLE
TARGET = np.array([3, 2], np.int64)  # y = Reshape(x [2, 3], s) is [3, 2] at run time

DECLARATIONS = [
    None,  # nothing declared: inference's rank, unknown sizes
    [3, 2],  # right
    ["rows", 2],  # symbolic
    [6, 1],  # wrong sizes, right element count
    [1, 2],  # wrong: a size 1 (a broadcast, were it true) where there are 3 rows
]


def reshape_loss(declared: list[Any] | None, shape_len: Any = 2) -> onnx.ModelProto:
    """loss = sum((Reshape(x, s) + b)^2) with b [1, 2] broadcast over the rows; `s` is a
    run-time input (of unknown length when `shape_len` is a name: inference then finds no rank)."""
    nodes = [
        node("Reshape", ["x", "s"], ["y"]),
        node("Add", ["y", "b"], ["z"]),
        node("Mul", ["z", "z"], ["zz"]),
        node("ReduceSum", ["zz"], ["loss"], keepdims=0),
    ]
    model = ad.make_ad_model(
        nodes,
        [("x", D, [2, 3]), ("s", TensorProto.INT64, [shape_len])],
        [("loss", D, [])],
        initializers={"b": np.array([[0.5, -1.25]])},
    )
    if declared is not None:
        model.graph.value_info.append(helper.make_tensor_value_info("y", D, declared))
        # z = y + b, declared as the declaration of y broadcast with b [1, 2] would make it
        model.graph.value_info.append(helper.make_tensor_value_info("z", D, [declared[0], 2]))
    return model


def declared_sizes(model: onnx.ModelProto, name: str) -> list[int | str | None]:
    for vi in model.graph.value_info:
        if vi.name == name:
            dims = vi.type.tensor_type.shape.dim
            return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]
    return []


GENS = {"x": ad.normal([2, 3]), "s": ad.fixed(TARGET)}


@pytest.mark.parametrize("shape_len", [2, "k"])
@pytest.mark.parametrize("declared", DECLARATIONS)
def test_grad_and_hvp_ignore_unconfirmed_sizes(declared: list[Any] | None, shape_len: Any) -> None:
    model = reshape_loss(declared, shape_len)
    gm = ad.check_grad(model, inputs=["x"], output="loss", gens=GENS)
    ad.check_hvp(model, wrt=["x"], inputs=["x"], output="loss", gens=GENS)
    # The result claims no size the source's inference did not find (y's sizes depend on s).
    for name in ("y", "z"):
        assert all(not isinstance(d, int) for d in declared_sizes(gm, name)[:1]), declared_sizes(gm, name)


@pytest.mark.parametrize("declared", DECLARATIONS)
def test_per_example_grads_ignore_unconfirmed_sizes(declared: list[Any] | None) -> None:
    ad.check_per_example_grad(
        reshape_loss(declared), in_axes=[0, None], inputs=["x"], output="loss", gens=GENS
    )


@pytest.mark.parametrize("declared", DECLARATIONS)
def test_vmap_ignores_unconfirmed_sizes(declared: list[Any] | None) -> None:
    vm = assert_vmap_matches(
        reshape_loss(declared), in_axes=[0, None], gens={"s": lambda rng: TARGET}, rtol=1e-9, atol=1e-12
    )
    assert all(not isinstance(d, int) for d in declared_sizes(vm, "y")[1:2]), declared_sizes(vm, "y")
