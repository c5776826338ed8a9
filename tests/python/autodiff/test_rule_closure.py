"""Closure of the rule registries (DESIGN.md section 3).

Every op a transform emits must itself have rules, or the transforms stop composing:
vmap(grad(f)) needs batching rules for what grad emits, jvp(grad(f)) needs JVP rules for it.
This test transforms a corpus of models covering the rule families, collects the op types of
every generated graph (first- and second-order), and checks them against the registries the
C++ core reports. The numbers of those compositions are checked in test_autodiff_rules.py.
"""

from __future__ import annotations

import numpy as np
import onnax
import onnx
import pytest
from onnax import _core
from onnax.testing._models import graphs
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT

# Ops that never need a rule of their own in generated graphs: constants and shape-only
# integer computations that no batched or active value flows into are copied unchanged.
NEEDS_NO_RULE = {"Constant"}
# vmap maps any op with an ONNX schema by a per-example Scan or Loop, so those (which vmap
# emits, and reverse mode emits for loops) are batchable without a rule of their own.
BATCHABLE_BY_FALLBACK = {"Scan", "Loop", "If"}
KNOWN_GAPS: set[str] = set()


def _model(nodes, inputs, outputs, inits=(), opset=18, value_info=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
        initializer=list(inits),
        value_info=[helper.make_tensor_value_info(n, F, s) for n, s in value_info],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _w(name, shape, seed=0):
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(values, name)


def _loss(out):
    return [helper.make_node("ReduceSumSquare", [out], ["loss"], keepdims=0)]


def _recurrence() -> list[onnx.NodeProto]:
    """h <- tanh(h @ w) three times from h = x, in a Loop reading w from the graph; each step
    also emits h * h as a scan output."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", "w"], ["hw"]),
            helper.make_node("Tanh", ["hw"], ["h_out"]),
            helper.make_node("Mul", ["h_out", "h_out"], ["sq"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("it", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", F, [2, 4]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", F, [2, 4]),
            helper.make_tensor_value_info("sq", F, [2, 4]),
        ],
    )
    return [
        helper.make_node("Constant", [], ["m"], value=numpy_helper.from_array(np.array(3, np.int64))),
        helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.array(True))),
        helper.make_node("Loop", ["m", "t", "x"], ["hT", "sqs"], body=body),
        helper.make_node("ReduceSum", ["sqs"], ["s"], keepdims=0),
        helper.make_node("ReduceSumSquare", ["hT"], ["r"], keepdims=0),
        helper.make_node("Add", ["s", "r"], ["loss"]),
    ]


CORPUS = {
    "loop": _model(_recurrence(), [("x", [2, 4])], [("loss", [])], [_w("w", (4, 4))]),
    "mlp": _model(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Add", ["h", "b1"], ["hb"]),
            helper.make_node("Relu", ["hb"], ["a"]),
            helper.make_node("Gemm", ["a", "w2"], ["y"], transB=1),
            helper.make_node("LogSoftmax", ["y"], ["ls"], axis=-1),
            *_loss("ls"),
        ],
        [("x", [4, 3])],
        [("loss", [])],
        [_w("w1", (3, 5)), _w("b1", (5,), 1), _w("w2", (2, 5), 2)],
    ),
    "conv": _model(
        [
            helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
            helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2]),
            helper.make_node("GlobalAveragePool", ["p"], ["g"]),
            helper.make_node("Flatten", ["g"], ["f"]),
            *_loss("f"),
        ],
        [("x", [1, 2, 8, 8])],
        [("loss", [])],
        [_w("k", (3, 2, 3, 3))],
    ),
    "norm": _model(
        [
            helper.make_node("LayerNormalization", ["x", "s", "b"], ["n"], axis=-1),
            helper.make_node("Tanh", ["n"], ["t"]),
            helper.make_node("Softmax", ["t"], ["sm"], axis=1),
            helper.make_node("Transpose", ["sm"], ["tt"], perm=[1, 0]),
            helper.make_node("Concat", ["tt", "tt"], ["cc"], axis=0),
            *_loss("cc"),
        ],
        [("x", [3, 4])],
        [("loss", [])],
        [_w("s", (4,)), _w("b", (4,), 1)],
    ),
    "pool": _model(
        [
            helper.make_node("ConvTranspose", ["x", "kt"], ["ct"], strides=[2, 2], pads=[1, 1, 0, 0]),
            helper.make_node(
                "AveragePool",
                ["ct"],
                ["ap"],
                kernel_shape=[3, 3],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
                ceil_mode=1,
            ),
            helper.make_node("LpPool", ["ap"], ["lp"], kernel_shape=[2, 2], auto_pad="SAME_UPPER"),
            helper.make_node("Conv", ["lp", "k"], ["c"], auto_pad="SAME_LOWER", strides=[2, 2]),
            helper.make_node("GlobalMaxPool", ["c"], ["gm"]),
            helper.make_node("GlobalLpPool", ["c"], ["gl"]),
            helper.make_node("Add", ["gm", "gl"], ["g"]),
            *_loss("g"),
        ],
        [("x", [1, 2, 5, 5])],
        [("loss", [])],
        [_w("kt", (2, 2, 3, 3)), _w("k", (3, 2, 2, 2), 1)],
    ),
    "groupnorm-resize": _model(
        [
            helper.make_node("GroupNormalization", ["x", "s", "b"], ["n"], num_groups=2),
            helper.make_node("Resize", ["n", "", "", "sizes"], ["z"], mode="cubic"),
            helper.make_node("Mul", ["z", "z"], ["r"]),
            *_loss("r"),
        ],
        [("x", [2, 4, 3, 3])],
        [("loss", [])],
        [_w("s", (2,)), _w("b", (2,), 1), numpy_helper.from_array(np.array([2, 4, 5, 2], np.int64), "sizes")],
        # (ONNX infers no shape for the GroupNormalization function op; onnax's facts do)
    ),
    "misc": _model(
        [
            helper.make_node("Mul", ["x", "g"], ["xg"]),
            helper.make_node("LRN", ["xg"], ["l"], size=3),
            helper.make_node("LpNormalization", ["l"], ["n"], axis=1),
            helper.make_node("ScatterElements", ["n", "idx", "n"], ["s"], axis=0, reduction="max"),
            helper.make_node("CumProd", ["s", "ax"], ["c"]),
            *_loss("c"),
        ],
        [("x", [2, 3, 2, 2])],
        [("loss", [])],
        [
            _w("g", (3, 1, 1)),
            numpy_helper.from_array(np.zeros((2, 3, 2, 2), np.int64), "idx"),
            numpy_helper.from_array(np.array(1, np.int64), "ax"),
        ],
        opset=26,
    ),
    "attention": _model(
        [
            helper.make_node("Attention", ["x", "k", "v"], ["a"], is_causal=1),
            *_loss("a"),
        ],
        [("x", [2, 2, 3, 4])],
        [("loss", [])],
        [_w("k", (2, 2, 5, 4)), _w("v", (2, 2, 5, 4), 1)],
        opset=23,
    ),
}


def _ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for g in graphs(model.graph) for n in g.node}


def _registries() -> dict[str, set[str]]:
    """The op types with each kind of rule, from the op table."""
    reg: dict[str, set[str]] = {"batch": set(), "jvp": set(), "transpose": set()}
    for row in _core.op_table():
        name = row["op"] if not row["domain"] else f"{row['domain']}::{row['op']}"
        if row["batch_since"]:
            reg["batch"].add(row["op"])
        if row["jvp"] or row["zero"]:
            reg["jvp"].add(name)
        if row["transpose"]:
            reg["transpose"].add(name)
    return reg


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_generated_graphs_use_only_ops_with_rules(name: str) -> None:
    reg = _registries()
    model = CORPUS[name]
    params = [t.name for t in model.graph.initializer if t.data_type == F]
    gradient = onnax.grad(model, inputs=[*params, "x"], output="loss")
    generated = {
        "grad": gradient,
        "jvp": onnax.jvp(model),
        "hvp": onnax.jvp(gradient, inputs=params),
        "vmap(grad)": onnax.vmap(gradient, in_axes=0),
    }
    missing: list[str] = []
    for label, g in generated.items():
        for op in sorted(_ops(g) - NEEDS_NO_RULE):
            if op not in reg["batch"] and op not in BATCHABLE_BY_FALLBACK:
                missing.append(f"{label}: {op} has no batching rule")
            if op not in reg["jvp"]:
                missing.append(f"{label}: {op} has no JVP rule (nor a zero-derivative entry)")
    unexpected = [m for m in missing if m not in KNOWN_GAPS]
    assert not unexpected, "\n".join(unexpected)


def test_every_linear_op_a_jvp_rule_emits_has_a_transpose() -> None:
    # vjp of each corpus model succeeds only if every linear op on its tape has a transpose;
    # a missing one raises OnnaxError naming the op. Second order: vjp of a vjp graph.
    for model in CORPUS.values():
        params = [t.name for t in model.graph.initializer if t.data_type == F]
        first = onnax.vjp(model, inputs=params)
        onnax.vjp(first, inputs=params, outputs=[o.name for o in first.graph.output[1:]])
