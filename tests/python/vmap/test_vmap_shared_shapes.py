"""vmap of shape computations whose per-example result is static.

`Shape(x, start=1)` of a batched x is the same for every example: vmap gives it as a constant
(no Shape node). The nodes reading it that stay unbatched are copied unchanged, so they must be
pointed at the constant: before, they kept reading the source's name, which nothing defined
any more ("not topologically sorted"; found by vmap of a vmapped BatchNormalization).
Oracle: a loop over examples in ONNX Runtime (vmap_oracle.assert_vmap_matches).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto
from oracles.vmap_oracle import assert_vmap_matches, make_model, node

D = TensorProto.DOUBLE


def test_static_per_example_shape_read_by_copied_nodes() -> None:
    """Two Shape(x, start=1) nodes: vmap gives both the same constant, named after the first;
    the Concat reading the second is copied unchanged and must read that constant."""
    nodes = [
        node("Shape", ["x"], ["tail"], start=1),
        node("Shape", ["x"], ["tail_again"], name="shape_again", start=1),
        node("Concat", ["minus_one", "tail_again"], ["target"], axis=0),
        node("Flatten", ["x"], ["flat"], axis=0),
        node("Relu", ["flat"], ["r"]),
        node("Reshape", ["r", "target"], ["y"]),
        node("Cast", ["tail"], ["tail_f"], to=D),
        node("ReduceSum", ["tail_f"], ["size_sum"], keepdims=0),
    ]
    model = make_model(
        nodes,
        [("x", D, [2, 3, 4])],
        ["y", "size_sum"],
        initializers={"minus_one": np.array([-1], np.int64)},
    )
    vm = assert_vmap_matches(model, in_axes=0, batch_sizes=(1, 4), rtol=1e-12, atol=1e-12)
    # The per-example shapes are constants: no Shape node reads x from position 1 on.
    starts = [
        a.i
        for n in vm.graph.node
        if n.op_type == "Shape" and n.input[0] == "x"
        for a in n.attribute
        if a.name == "start"
    ]
    assert 1 not in starts, starts


def test_static_per_example_shape_read_inside_a_copied_if() -> None:
    """The same value read by name inside the branches of an If that is copied unchanged (its
    condition and every value its branches read are unbatched)."""
    from onnx import helper

    def branch(name: str, scale: float) -> onnx.GraphProto:
        return helper.make_graph(
            [
                helper.make_node("Cast", ["tail_again"], [f"{name}_f"], to=D),
                helper.make_node("Mul", [f"{name}_f", f"{name}_k"], [f"{name}_out"]),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", D, [2])],
            initializer=[onnx.numpy_helper.from_array(np.array(scale), f"{name}_k")],
        )

    nodes = [
        node("Shape", ["x"], ["tail"], start=1),
        node("Shape", ["x"], ["tail_again"], name="shape_again", start=1),
        node("If", ["flag"], ["picked"], then_branch=branch("then", 2.0), else_branch=branch("else", -1.0)),
        node("Cast", ["tail"], ["tail_f"], to=D),
        node("Add", ["tail_f", "picked"], ["sizes"]),
        node("ReduceSum", ["x"], ["total"], keepdims=0),
        node("Mul", ["total", "sizes"], ["y"]),
    ]
    model = make_model(nodes, [("x", D, [2, 3, 4])], ["y"], initializers={"flag": np.array(True)}, infer=True)
    assert_vmap_matches(model, in_axes=0, batch_sizes=(1, 4), rtol=1e-12, atol=1e-12)
