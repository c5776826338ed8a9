"""Nested Loops for reverse-mode tests: `nested(depth, trips)` builds `depth` Loops, each level
running the next and the innermost h <- tanh(h W + b), with trip counts that are constants, a
graph input or the enclosing iteration number; `jax_loss` is the same function in JAX."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

D = TensorProto.DOUBLE
I64 = TensorProto.INT64
B = TensorProto.BOOL
ROWS, COLS = 2, 3
TRIPS = 2


def trips_node(level: int, trips: str) -> list[onnx.NodeProto]:
    """The trip count of the loop at `level`: a constant, the graph input M, or the enclosing
    loop's iteration number plus one (a different count in every enclosing iteration)."""
    out = f"n{level}"
    if trips == "input" and level > 0:
        return [helper.make_node("Identity", ["M"], [out])]
    if trips == "iteration" and level > 0:
        one = helper.make_tensor(f"one{level}", I64, [], [1])
        return [
            helper.make_node("Constant", [], [f"one{level}"], value=one),
            helper.make_node("Add", [f"it{level}", f"one{level}"], [out]),
        ]
    return [helper.make_node("Constant", [], [out], value=helper.make_tensor(f"v{level}", I64, [], [TRIPS]))]


def body(level: int, depth: int, trips: str) -> onnx.GraphProto:
    """Level `level` of the nest: the innermost computes h <- tanh(h W + b); the others run the
    next level and then scale h by (1 + 0.1 level) and add sin(h) * 0.05 (a second non-linearity
    whose residual is read in the reverse pass). Level 1 also stacks h as a scan output."""
    h_in, h_out = f"h_in{level}", f"h_out{level}"
    if level == depth:
        nodes = [
            helper.make_node("MatMul", [h_in, "W"], [f"hw{level}"]),
            helper.make_node("Add", [f"hw{level}", "b"], [f"pre{level}"]),
            helper.make_node("Tanh", [f"pre{level}"], [h_out]),
        ]
    else:
        scale = helper.make_tensor(f"s{level}", D, [], [1.0 + 0.1 * level])
        small = helper.make_tensor(f"e{level}", D, [], [0.05])
        nodes = [
            *trips_node(level, trips),
            helper.make_node(
                "Loop", [f"n{level}", "", h_in], [f"inner{level}"], body=body(level + 1, depth, trips)
            ),
            helper.make_node("Constant", [], [f"s{level}"], value=scale),
            helper.make_node("Constant", [], [f"e{level}"], value=small),
            helper.make_node("Mul", [f"inner{level}", f"s{level}"], [f"scaled{level}"]),
            helper.make_node("Sin", [f"inner{level}"], [f"sin{level}"]),
            helper.make_node("Mul", [f"sin{level}", f"e{level}"], [f"wiggle{level}"]),
            helper.make_node("Add", [f"scaled{level}", f"wiggle{level}"], [h_out]),
        ]
    nodes.append(helper.make_node("Identity", [f"c_in{level}"], [f"c_out{level}"]))
    outputs = [
        helper.make_tensor_value_info(f"c_out{level}", B, []),
        helper.make_tensor_value_info(h_out, D, [ROWS, COLS]),
    ]
    if level == 1:
        nodes.append(helper.make_node("Identity", [h_out], [f"stack{level}"]))
        outputs.append(helper.make_tensor_value_info(f"stack{level}", D, [ROWS, COLS]))
    return helper.make_graph(
        nodes,
        f"body{level}",
        [
            helper.make_tensor_value_info(f"it{level}", I64, []),
            helper.make_tensor_value_info(f"c_in{level}", B, []),
            helper.make_tensor_value_info(h_in, D, [ROWS, COLS]),
        ],
        outputs,
    )


def nested(depth: int, trips: str = "const") -> onnx.ModelProto:
    """loss = sum(final h) + 0.5 * sum(stack of level-1 h's ^ 2), through `depth` nested Loops."""
    half = helper.make_tensor("half", D, [], [0.5])
    nodes = [
        helper.make_node("Constant", [], ["n0"], value=helper.make_tensor("v0", I64, [], [TRIPS])),
        helper.make_node("Loop", ["n0", "", "x"], ["y", "ys"], body=body(1, depth, trips)),
        helper.make_node("ReduceSum", ["y"], ["final"], keepdims=0),
        helper.make_node("Mul", ["ys", "ys"], ["sq"]),
        helper.make_node("ReduceSum", ["sq"], ["sqsum"], keepdims=0),
        helper.make_node("Constant", [], ["half"], value=half),
        helper.make_node("Mul", ["sqsum", "half"], ["penalty"]),
        helper.make_node("Add", ["final", "penalty"], ["loss"]),
    ]
    rng = np.random.default_rng(7)
    inputs = [helper.make_tensor_value_info("x", D, [ROWS, COLS])]
    if trips == "input":
        inputs.append(helper.make_tensor_value_info("M", I64, []))
    graph = helper.make_graph(
        nodes,
        "nested",
        inputs,
        [helper.make_tensor_value_info("loss", D, [])],
        initializer=[
            numpy_helper.from_array(0.4 * rng.standard_normal((COLS, COLS)), "W"),
            numpy_helper.from_array(0.1 * rng.standard_normal(COLS), "b"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def jax_loss(depth: int, trips: str, m: int) -> Any:
    """The same function in JAX (float64), nested fori_loops."""
    import jax
    import jax.numpy as jnp

    def level(k: int, it: Any, h: Any, w: Any, b: Any) -> Any:
        if k == depth:
            return jnp.tanh(h @ w + b)
        if trips == "iteration":
            # (it + 1 steps: a scan over the most there can be, the rest masked, since JAX's
            # reverse mode needs static trip counts.)
            def step(hh: Any, i: Any) -> Any:
                return jnp.where(i <= it, level(k + 1, i, hh, w, b), hh), None

            inner = jax.lax.scan(step, h, jnp.arange(TRIPS))[0]
        else:
            count = m if trips == "input" else TRIPS
            inner = jax.lax.fori_loop(0, count, lambda i, hh: level(k + 1, i, hh, w, b), h)
        return inner * (1.0 + 0.1 * k) + jnp.sin(inner) * 0.05

    def loss(x: Any, w: Any, b: Any) -> Any:
        def outer(h: Any, i: Any) -> Any:
            nh = level(1, i, h, w, b)
            return nh, nh

        y, ys = jax.lax.scan(outer, x, jnp.arange(TRIPS))
        return jnp.sum(y) + 0.5 * jnp.sum(ys * ys)

    return loss
