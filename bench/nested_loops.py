"""Benchmark (not a test): grad through Loops nested `depth` deep, h <- tanh(h * w) twice per
level (or Ifs nested `depth` deep: --kind if-chain, if-tree); transform time, result size and
Loop nodes per nesting level of the result.

Each nesting level of the result holds two Loops: the forward pass (which stacks the inner loops'
stacks as its residuals) and the reverse pass. (Before the inner stacking loops were hoisted out
of the reverse bodies, the reverse body re-ran the inner forward pass and the result doubled per
level: Loops per level 2, 3, 5, 9, ...)

    python bench/nested_loops.py [--max-depth 7] [--kind loops|if-chain|if-tree]
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


def if_branch(level: int, depth: int, then: bool, tree: bool) -> onnx.GraphProto:
    """A branch of nested Ifs on the input c: the then branch (both branches for a `tree`)
    holds the next level's If and takes sin of it; the innermost computes tanh(x * w)."""
    out = f"o{level}_{int(then)}"
    if level == depth or not (then or tree):
        nodes = [
            helper.make_node("Mul", ["x", "w"], [f"m{level}_{int(then)}"]),
            helper.make_node("Tanh", [f"m{level}_{int(then)}"], [out]),
        ]
    else:
        nodes = [
            helper.make_node(
                "If",
                ["c"],
                [f"i{level}_{int(then)}"],
                then_branch=if_branch(level + 1, depth, True, tree),
                else_branch=if_branch(level + 1, depth, False, tree),
            ),
            helper.make_node("Sin", [f"i{level}_{int(then)}"], [out]),
        ]
    return helper.make_graph(
        nodes, f"b{level}_{int(then)}", [], [helper.make_tensor_value_info(out, T.FLOAT, [3])]
    )


def nested_ifs(depth: int, tree: bool) -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node(
                "If",
                ["c"],
                ["y"],
                then_branch=if_branch(1, depth, True, tree),
                else_branch=if_branch(1, depth, False, tree),
            ),
            helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        "nested_ifs",
        [
            helper.make_tensor_value_info("c", T.BOOL, []),
            helper.make_tensor_value_info("x", T.FLOAT, [3]),
            helper.make_tensor_value_info("w", T.FLOAT, [3]),
        ],
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
    parser.add_argument(
        "--kind",
        choices=["loops", "if-chain", "if-tree"],
        default="loops",
        help="nested Loops; nested Ifs in one branch per level (a chain); in both (a tree)",
    )
    args = parser.parse_args()
    for depth in range(1, args.max_depth + 1):
        model = nested(depth) if args.kind == "loops" else nested_ifs(depth, args.kind == "if-tree")
        t0 = time.perf_counter()
        result = onnax.grad(model, inputs=["w"])
        seconds = time.perf_counter() - t0
        size = len(result.SerializeToString())
        line = f"depth {depth}: {seconds * 1e3:.0f} ms, {size} bytes"
        if args.kind == "loops":
            line += f", Loops by level {loops_by_level(result.graph)}"
        else:
            line += f" (source {len(model.SerializeToString())} bytes)"
        print(line)


if __name__ == "__main__":
    main()
