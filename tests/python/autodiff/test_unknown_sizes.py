"""Reverse mode where sizes are unknown or symbolic.

Exporters flatten activations before every Dense layer (jax2onnx: Reshape(x, [-1, features]),
Gemm, Reshape back to the batch dims), and ONNX's inference cannot name the flattened size. Each
unknown dim gets a symbol of its own inside a transform, so a broadcast of a value against
itself, or the rows of a Gemm, are seen to be the same size; and a shape taken with Shape(v) tells
its Expand/Reshape v's dims. Without those, every broadcast in the gradient became a run-time
decision (Shape, Equal, Range, Compress, ReduceSum). The symbols claim nothing else: two
unrelated unknown sizes, one of them a broadcast 1 at run time, are still summed correctly.
Oracles: float64 finite differences of the source (grad, HVP) and loops over examples
(per-example gradients)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnax.testing._models import graphs
from onnx import TensorProto
from oracles import ad_oracle as ad
from oracles.vmap_oracle import node

D = TensorProto.DOUBLE
F, H = 4, 5


def dense_mlp(batch_dims: list[Any]) -> onnx.ModelProto:
    """loss = mean((tanh(dense(x)) - y)^2), dense written as jax2onnx writes it for x [*, F]:
    flatten to [-1, F], Gemm, reshape to the batch dims + [H]."""
    k = len(batch_dims)
    nodes = [
        node("Reshape", ["x", "flat"], ["x2d"]),
        node("Gemm", ["x2d", "W", "b"], ["h2d"]),
        node("Shape", ["x"], ["xs"]),
        node("Slice", ["xs", "zero", "lead"], ["batch"]),
        node("Concat", ["batch", "width"], ["hs"], axis=0),
        node("Reshape", ["h2d", "hs"], ["h"]),
        node("Tanh", ["h"], ["a"]),
        node("Sub", ["a", "y"], ["d"]),
        node("Mul", ["d", "d"], ["sq"]),
        node("ReduceMean", ["sq"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(3)
    return ad.make_ad_model(
        nodes,
        [("x", D, [*batch_dims, F]), ("y", D, [*batch_dims, H])],
        ["loss"],
        initializers={
            "W": rng.normal(size=(F, H)) / 2,
            "b": rng.normal(size=H) / 4,
            "flat": np.array([-1, F], np.int64),
            "zero": np.array([0], np.int64),
            "lead": np.array([k], np.int64),
            "width": np.array([H], np.int64),
        },
    )


def internal_symbols(model: onnx.ModelProto) -> list[str]:
    """Dim names a result must not carry (the transform's own symbols for unknown dims)."""
    return [
        d.dim_param
        for g in graphs(model.graph)
        for vi in [*g.input, *g.output, *g.value_info]
        for d in vi.type.tensor_type.shape.dim
        if "\x1f" in d.dim_param
    ]


def runtime_broadcast_ops(model: onnx.ModelProto) -> list[str]:
    # Compress picks the axes to sum at run time: only an undecidable broadcast needs it.
    return [n.name for n in model.graph.node if n.op_type == "Compress"]


@pytest.mark.parametrize("batch_dims", [["B"], ["B", "T"], [3, "T"]])
def test_flattened_dense_layer(batch_dims: list[Any]) -> None:
    model = dense_mlp(batch_dims)
    shape = [3, 2][: len(batch_dims)]
    gens = {"x": ad.normal([*shape, F]), "y": ad.normal([*shape, H])}
    wrt = ["x", "W", "b"]
    gm = ad.check_grad(model, inputs=wrt, output="loss", gens=gens)
    assert runtime_broadcast_ops(gm) == [], runtime_broadcast_ops(gm)
    assert internal_symbols(gm) == []
    hvp = ad.check_hvp(model, wrt=["W"], inputs=wrt, output="loss", gens=gens)
    assert internal_symbols(hvp) == []
    per_example = ad.check_per_example_grad(
        model, in_axes=[0, 0], inputs=["W", "b"], output="loss", gens=gens, batch_sizes=(1, 4)
    )
    assert internal_symbols(per_example) == []


@pytest.mark.parametrize(
    "runtime_shapes", [([3, 4], [1, 4]), ([3, 4], [3, 1]), ([3, 4], [3, 4]), ([1, 4], [3, 4])]
)
def test_unrelated_unknown_sizes_still_broadcast(runtime_shapes: tuple[list[int], list[int]]) -> None:
    """y1 = Reshape(x1, s1) and y2 = Reshape(x2, s2) have unknown sizes that need not agree: a
    dim of size 1 at run time is broadcast, and its gradient must be summed over it."""
    s1, s2 = runtime_shapes
    nodes = [
        node("Reshape", ["x1", "s1"], ["y1"]),
        node("Reshape", ["x2", "s2"], ["y2"]),
        node("Mul", ["y1", "y2"], ["z"]),
        node("Sin", ["z"], ["w"]),
        node("Mul", ["w", "z"], ["v"]),
        node("ReduceSum", ["v"], ["loss"], keepdims=0),
    ]
    n1, n2 = int(np.prod(s1)), int(np.prod(s2))
    model = ad.make_ad_model(
        nodes,
        [("x1", D, [n1]), ("x2", D, [n2]), ("s1", TensorProto.INT64, [2]), ("s2", TensorProto.INT64, [2])],
        ["loss"],
    )
    gens = {
        "x1": ad.normal([n1]),
        "x2": ad.normal([n2]),
        "s1": ad.fixed(np.array(s1, np.int64)),
        "s2": ad.fixed(np.array(s2, np.int64)),
    }
    gm = ad.check_grad(model, inputs=["x1", "x2"], output="loss", gens=gens)
    assert internal_symbols(gm) == []
    ad.check_hvp(model, wrt=["x2"], inputs=["x1", "x2"], output="loss", gens=gens)
