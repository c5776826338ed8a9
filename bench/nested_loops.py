"""Benchmark (not a test): grad through Loops nested `depth` deep, h <- tanh(h * w) twice per
level; transform time, result size and Loop nodes per nesting level of the result.

Each nesting level of the result holds two Loops: the forward pass (which stacks the inner loops'
stacks as its residuals) and the reverse pass. (Before the inner stacking loops were hoisted out
of the reverse bodies, the reverse body re-ran the inner forward pass and the result doubled per
level: Loops per level 2, 3, 5, 9, ...)

    python bench/nested_loops.py [--max-depth 7]
"""

from __future__ import annotations

import argparse
import time

import onnax
import onnx
from onnx import TensorProto as T
from onnx import helper


def body(level: int, depth: int) -> onnx.GraphProto:
    h_in, h_out = f"h_in{level}", f"h_out{level}"
    if level == depth:
        nodes = [
            helper.make_node("Mul", [h_in, "w"], [f"m{level}"]),
            helper.make_node("Tanh", [f"m{level}"], [h_out]),
        ]
    else:
        trips = helper.make_tensor("v", T.INT64, [], [2])
        nodes = [
            helper.make_node("Constant", [], [f"n{level}"], value=trips),
            helper.make_node("Loop", [f"n{level}", "", h_in], [h_out], body=body(level + 1, depth)),
        ]
    nodes.append(helper.make_node("Identity", [f"c_in{level}"], [f"c_out{level}"]))
    return helper.make_graph(
        nodes,
        f"body{level}",
        [
            helper.make_tensor_value_info(f"it{level}", T.INT64, []),
            helper.make_tensor_value_info(f"c_in{level}", T.BOOL, []),
            helper.make_tensor_value_info(h_in, T.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info(f"c_out{level}", T.BOOL, []),
            helper.make_tensor_value_info(h_out, T.FLOAT, [3]),
        ],
    )


def nested(depth: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["n0"], value=helper.make_tensor("v", T.INT64, [], [2])),
            helper.make_node("Loop", ["n0", "", "x"], ["y"], body=body(1, depth)),
            helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        "nested",
        [helper.make_tensor_value_info("x", T.FLOAT, [3]), helper.make_tensor_value_info("w", T.FLOAT, [3])],
        [helper.make_tensor_value_info("loss", T.FLOAT, [])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def loops_by_level(g: onnx.GraphProto, level: int = 0, out: dict[int, int] | None = None) -> dict[int, int]:
    out = {} if out is None else out
    for n in g.node:
        out[level] = out.get(level, 0) + (n.op_type == "Loop")
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                loops_by_level(a.g, level + 1, out)
    return {k: v for k, v in out.items() if v}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-depth", type=int, default=7)
    args = parser.parse_args()
    for depth in range(1, args.max_depth + 1):
        model = nested(depth)
        t0 = time.perf_counter()
        result = onnax.grad(model, inputs=["w"])
        seconds = time.perf_counter() - t0
        loops = loops_by_level(result.graph)
        size = len(result.SerializeToString())
        print(f"depth {depth}: {seconds * 1e3:.0f} ms, {size} bytes, Loops by level {loops}")


if __name__ == "__main__":
    main()
