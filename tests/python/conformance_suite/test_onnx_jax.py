"""The ONNX-in-JAX interpreter (onnax.testing._jax_reference) against ONNX Runtime.

It is validate's exact reference and the float64 reference of the corpus' light
architectures, so each op it covers must compute what ONNX Runtime computes, including the
attribute branches real exports reach (grouped and dilated Conv, auto_pad, ceil_mode,
count_include_pad, Gemm's transposes, opset-dependent axes inputs, negative indices, ...),
both run eagerly and under ``jax.jit`` with the float inputs traced (shape arithmetic must stay
static). (LRN sizes are odd: ONNX Runtime rejects even ones.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from oracles.ad_oracle import make_ad_model, run
from oracles.vmap_oracle import node

pytest.importorskip("jax")
from onnax.testing import _jax_reference as onnx_jax

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL

CASES: list[tuple[str, list[onnx.NodeProto], list[tuple[str, int, list[int]]], dict[str, Any]]] = [
    (
        "conv-group-dilation-pads",
        [node("Conv", ["x", "w", "b"], ["y"], group=2, dilations=[2, 1], pads=[1, 0, 2, 1], strides=[1, 2])],
        [("x", F, [2, 4, 7, 6]), ("w", F, [6, 2, 3, 2]), ("b", F, [6])],
        {},
    ),
    (
        "maxpool-ceil",
        [node("MaxPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 0, 1], ceil_mode=1)],
        [("x", F, [1, 2, 6, 7])],
        {},
    ),
    (
        "averagepool-count-include-pad",
        [
            node(
                "AveragePool",
                ["x"],
                ["y"],
                kernel_shape=[3, 3],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
                count_include_pad=1,
            )
        ],
        [("x", F, [1, 2, 6, 7])],
        {},
    ),
    (
        "averagepool-ceil-exclude-pad",
        [
            node(
                "AveragePool",
                ["x"],
                ["y"],
                kernel_shape=[2, 2],
                strides=[2, 2],
                pads=[1, 0, 0, 0],
                ceil_mode=1,
            )
        ],
        [("x", F, [1, 2, 5, 7])],
        {},
    ),
    ("global-average-pool", [node("GlobalAveragePool", ["x"], ["y"])], [("x", F, [2, 3, 4, 5])], {}),
    (
        "batchnorm",
        [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)],
        [("x", F, [2, 3, 4, 5]), ("s", F, [3]), ("b", F, [3]), ("m", F, [3])],
        {"v": np.asarray([0.5, 1.0, 1.5], np.float32)},
    ),
    (
        "lrn",
        [node("LRN", ["x"], ["y"], size=5, alpha=0.02, beta=0.6, bias=1.5)],
        [("x", F, [2, 6, 3, 3])],
        {},
    ),
    (
        "gemm-transposes",
        [node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1, alpha=0.7, beta=1.3)],
        [("a", F, [4, 3]), ("b", F, [5, 4]), ("c", F, [5])],
        {},
    ),
    (
        "shape-reshape-flatten-concat",
        [
            node("Shape", ["x"], ["s"], start=0, end=1),
            node("Concat", ["s", "k"], ["target"], axis=0),
            node("Reshape", ["x", "target"], ["r"]),
            node("Flatten", ["x"], ["f"], axis=2),
            node("Unsqueeze", ["r", "ax"], ["u"]),
            node("Concat", ["u", "u"], ["y"], axis=1),
            node("Softmax", ["f"], ["z"], axis=1),
        ],
        [("x", F, [2, 3, 4])],
        {"k": np.asarray([-1, 0], np.int64), "ax": np.asarray([1], np.int64)},
    ),
    (
        "transpose-sum-reduce",
        [
            node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
            node("Sum", ["t", "t", "b"], ["s"]),
            node("ReduceSum", ["s", "axes"], ["y"], keepdims=0),
            node("Dropout", ["s"], ["z"]),
        ],
        [("x", F, [2, 3, 4]), ("b", F, [4, 1])],
        {"axes": np.asarray([1], np.int64)},
    ),
]


def _i64(*values: Any) -> np.ndarray:
    return np.asarray(values, np.int64)


# (id, nodes, inputs, initializers, opset): integer inputs take the initializer's value as feed
# (listed under inits with a "feed:" prefix) so negative and edge indices are exercised.
MORE: list[tuple[str, list[onnx.NodeProto], list[tuple[str, int, list[int]]], dict[str, Any], int]] = [
    (
        "unary-activations",
        [
            node("Sigmoid", ["x"], ["a"]),
            node("Tanh", ["x"], ["b"]),
            node("Erf", ["x"], ["c"]),
            node("Exp", ["x"], ["d"]),
            node("Abs", ["x"], ["e"]),
            node("Neg", ["x"], ["f"]),
            node("Log", ["e"], ["g"]),
            node("Sqrt", ["e"], ["h"]),
            node("Reciprocal", ["d"], ["i"]),
            node("Softplus", ["x"], ["j"]),
            node("Softsign", ["x"], ["k"]),
            node("LeakyRelu", ["x"], ["l"], alpha=0.3),
            node("Elu", ["x"], ["m"], alpha=0.7),
            node("Selu", ["x"], ["n"]),
            node("HardSigmoid", ["x"], ["o"], alpha=0.3, beta=0.4),
            node("Sin", ["x"], ["p"]),
            node("Cos", ["x"], ["q"]),
            node("Floor", ["x"], ["r"]),
            node("Ceil", ["x"], ["s"]),
            node("Sign", ["x"], ["t"]),
        ],
        [("x", F, [3, 4])],
        {},
        18,
    ),
    ("gelu-erf", [node("Gelu", ["x"], ["y"])], [("x", F, [2, 5])], {}, 20),
    ("gelu-tanh", [node("Gelu", ["x"], ["y"], approximate="tanh")], [("x", F, [2, 5])], {}, 20),
    (
        "binary-broadcast",
        [
            node("Div", ["x", "y"], ["a"]),
            node("Pow", ["x", "two"], ["b"]),
            node("Abs", ["x"], ["ax"]),
            node("Pow", ["ax", "y"], ["c"]),
            node("Max", ["x", "y", "z"], ["d"]),
            node("Min", ["x", "y"], ["e"]),
            node("Mean", ["x", "y", "z"], ["f"]),
            node("Equal", ["x", "x"], ["g"]),
            node("Less", ["x", "y"], ["h"]),
            node("GreaterOrEqual", ["x", "y"], ["i"]),
            node("Where", ["h", "x", "y"], ["j"]),
            node("Not", ["h"], ["k"]),
            node("And", ["h", "i"], ["l"]),
            node("Or", ["h", "k"], ["m"]),
        ],
        [("x", F, [3, 4]), ("y", F, [4]), ("z", F, [3, 1])],
        {"two": np.asarray(2.0, np.float32)},
        18,
    ),
    (
        "clip-cast",
        [
            node("Clip", ["x", "lo", "hi"], ["a"]),
            node("Clip", ["x", "", "hi"], ["b"]),
            node("Cast", ["x"], ["c"], to=TensorProto.INT64),
            node("Cast", ["c"], ["d"], to=TensorProto.FLOAT),
            node("CastLike", ["c", "x"], ["e"]),
        ],
        [("x", F, [3, 4])],
        {"lo": np.asarray(-0.5, np.float32), "hi": np.asarray(0.7, np.float32)},
        18,
    ),
    (
        "matmul-batched-einsum",
        [
            node("MatMul", ["a", "b"], ["y"]),
            node("Einsum", ["a", "b"], ["z"], equation="bij,jk->bik"),
        ],
        [("a", F, [2, 3, 4]), ("b", F, [4, 5])],
        {},
        18,
    ),
    (
        "softmax-logsoftmax-axes",
        [
            node("Softmax", ["x"], ["a"], axis=1),
            node("LogSoftmax", ["x"], ["b"]),
        ],
        [("x", F, [2, 3, 4])],
        {},
        18,
    ),
    (
        "softmax-opset11-coerced",
        [node("Softmax", ["x"], ["a"], axis=1), node("LogSoftmax", ["x"], ["b"])],
        [("x", F, [2, 3, 4])],
        {},
        11,
    ),
    (
        "layernorm-outputs",
        [node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], axis=-2, epsilon=1e-3)],
        [("x", F, [2, 3, 4]), ("s", F, [3, 4]), ("b", F, [3, 4])],
        {},
        18,
    ),
    (
        "instancenorm",
        [node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-4)],
        [("x", F, [2, 3, 4, 5]), ("s", F, [3]), ("b", F, [3])],
        {},
        18,
    ),
    (
        "conv-auto-pad-same-1d",
        [node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2])],
        [("x", F, [2, 3, 7]), ("w", F, [4, 3, 3])],
        {},
        18,
    ),
    (
        "conv-same-lower-3d",
        [node("Conv", ["x", "w"], ["y"], auto_pad="SAME_LOWER")],
        [("x", F, [1, 2, 4, 4, 3]), ("w", F, [2, 2, 2, 2, 2])],
        {},
        18,
    ),
    (
        "pools-same-valid-dilation-global",
        [
            node("MaxPool", ["x"], ["a"], kernel_shape=[2, 2], auto_pad="SAME_UPPER", strides=[2, 2]),
            node("MaxPool", ["x"], ["b"], kernel_shape=[2, 2], dilations=[2, 1]),
            node("AveragePool", ["x"], ["c"], kernel_shape=[3, 2], auto_pad="VALID"),
            node("GlobalMaxPool", ["x"], ["d"]),
        ],
        [("x", F, [2, 3, 6, 7])],
        {},
        18,
    ),
    (
        "squeeze-split-slice-opset18",
        [
            node("Squeeze", ["x", "ax1"], ["a"]),
            node("Unsqueeze", ["a", "ax_neg"], ["b"]),
            node("Split", ["a", "sizes"], ["c1", "c2"], axis=1),
            node("Split", ["a"], ["d1", "d2", "d3"], axis=1, num_outputs=3),
            node("Slice", ["a", "starts", "ends", "axes", "steps"], ["e"]),
            node("Slice", ["a", "rstarts", "rends", "axes1", "rsteps"], ["f"]),
            node("Flatten", ["x"], ["g"], axis=-1),
        ],
        [("x", F, [2, 1, 7, 3])],
        {
            "ax1": _i64(1),
            "ax_neg": _i64(-1),
            "sizes": _i64(3, 4),
            "starts": _i64(1, -3),
            "ends": _i64(100, -1),
            "axes": _i64(0, 1),
            "steps": _i64(1, 2),
            "rstarts": _i64(-1),
            "rends": _i64(-(2**62)),
            "axes1": _i64(1),
            "rsteps": _i64(-2),
        },
        18,
    ),
    (
        "squeeze-unsqueeze-split-attrs-opset11",
        [
            node("Squeeze", ["x"], ["a"], axes=[1]),
            node("Unsqueeze", ["a"], ["b"], axes=[0, 3]),
            node("Split", ["a"], ["c1", "c2"], axis=2, split=[1, 2]),
            node("ReduceSum", ["x"], ["d"], axes=[2], keepdims=0),
            node("ReduceMean", ["x"], ["e"], axes=[-1]),
        ],
        [("x", F, [2, 1, 4, 3])],
        {},
        11,
    ),
    (
        "gather-indices-negative",
        [
            node("Gather", ["x", "idx"], ["a"], axis=1),
            node("GatherElements", ["x", "eidx"], ["b"], axis=0),
            node("GatherND", ["x", "nidx"], ["c"]),
            node("GatherND", ["x", "bidx"], ["d"], batch_dims=1),
        ],
        [("x", F, [3, 4, 2])],
        {
            "idx": np.asarray([[0, -1], [2, 1]], np.int64),
            "eidx": np.asarray([[[0, 2]], [[-1, 1]]], np.int64),
            "nidx": np.asarray([[0, 1], [2, -1]], np.int64),
            "bidx": np.asarray([[1], [0], [3]], np.int64),
        },
        18,
    ),
    (
        "scatter-elements-nd-add",
        [
            node("ScatterElements", ["x", "eidx", "upd"], ["a"], axis=1, reduction="add"),
            node("ScatterElements", ["x", "eidx", "upd"], ["b"], axis=1),
            node("ScatterND", ["x", "nidx", "nupd"], ["c"], reduction="add"),
        ],
        [("x", F, [3, 4]), ("upd", F, [3, 2]), ("nupd", F, [2, 4])],
        {"eidx": np.asarray([[0, 3], [1, 1], [-1, 2]], np.int64), "nidx": np.asarray([[2], [0]], np.int64)},
        18,
    ),
    (
        "shape-arith-expand-tile-pad-range",
        [
            node("Shape", ["x"], ["s"]),
            node("Gather", ["s", "zero"], ["n"]),
            node("Mul", ["n", "two"], ["n2"]),
            node("Unsqueeze", ["n2", "zero"], ["n2v"]),
            node("Concat", ["n2v", "minus1"], ["shape"], axis=0),
            node("Reshape", ["x", "shape"], ["r"]),
            node(
                "ConstantOfShape", ["s"], ["ones"], value=onnx.numpy_helper.from_array(np.ones(1, np.float32))
            ),
            node("Add", ["x", "ones"], ["xo"]),
            node("Expand", ["b", "s"], ["e"]),
            node("Tile", ["x", "reps"], ["t"]),
            node("Pad", ["x", "pads", "pv"], ["p"]),
            node("Pad", ["x", "pads"], ["q"], mode="reflect"),
            node("Range", ["zero", "n2", "one"], ["rg"]),
            node("Cast", ["rg"], ["rgf"], to=TensorProto.FLOAT),
            node("Size", ["x"], ["sz"]),
            node("CumSum", ["x", "one"], ["cs"], exclusive=1, reverse=1),
        ],
        [("x", F, [4, 6]), ("b", F, [1, 6])],
        {
            "zero": _i64(0)[0],
            "one": _i64(1)[0],
            "two": _i64(2)[0],
            "minus1": _i64(-1),
            "reps": _i64(2, 1),
            "pads": _i64(1, 0, 2, 3),
            "pv": np.asarray(0.5, np.float32),
        },
        18,
    ),
    (
        "reductions-opset18",
        [
            node("ReduceMax", ["x", "ax"], ["a"]),
            node("ReduceMin", ["x", "ax"], ["b"], keepdims=0),
            node("ReduceProd", ["x", "ax"], ["c"]),
            node("ReduceL2", ["x"], ["d"]),
            node("ReduceLogSumExp", ["x", "ax"], ["e"]),
            node("ReduceSumSquare", ["x", "ax"], ["f"]),
            node("ReduceL1", ["x", "ax"], ["g"]),
            node("ReduceSum", ["x", "empty"], ["h"], noop_with_empty_axes=1),
            node("ArgMax", ["x"], ["i"], axis=1),
            node("ArgMin", ["x"], ["j"], axis=-1, keepdims=0, select_last_index=1),
        ],
        [("x", F, [3, 4, 2])],
        {"ax": _i64(1, -1), "empty": np.zeros(0, np.int64)},
        18,
    ),
    (
        "losses-onehot",
        [
            node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["l1", "logp"]),
            node(
                "SoftmaxCrossEntropyLoss", ["scores", "labels", "w"], ["l2"], reduction="sum", ignore_index=1
            ),
            node("LogSoftmax", ["scores"], ["ls"], axis=1),
            node("NegativeLogLikelihoodLoss", ["ls", "labels", "w"], ["l3"]),
            node("NegativeLogLikelihoodLoss", ["ls", "labels"], ["l4"], reduction="none"),
            node("OneHot", ["labels", "depth", "vals"], ["oh"], axis=0),
        ],
        [("scores", F, [4, 3]), ("w", F, [3])],
        {
            "labels": np.asarray([0, 2, 1, 2], np.int64),
            "depth": _i64(3),
            "vals": np.asarray([0.0, 2.0], np.float32),
        },
        18,
    ),
    (
        "loop-and-if",
        [
            helper.make_node(
                "Loop",
                ["trip", "", "acc0"],
                ["acc", "steps"],
                name="loop",
                body=helper.make_graph(
                    [
                        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                        helper.make_node("Mul", ["acc_in", "x"], ["prod"]),
                        helper.make_node("Tanh", ["prod"], ["acc_out"]),
                        helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
                        helper.make_node("Mul", ["acc_out", "fi"], ["scan"]),
                    ],
                    "body",
                    [
                        helper.make_tensor_value_info("i", I64, []),
                        helper.make_tensor_value_info("cond_in", B, []),
                        helper.make_tensor_value_info("acc_in", F, [3]),
                    ],
                    [
                        helper.make_tensor_value_info("cond_out", B, []),
                        helper.make_tensor_value_info("acc_out", F, [3]),
                        helper.make_tensor_value_info("scan", F, [3]),
                    ],
                ),
            ),
            helper.make_node(
                "If",
                ["flag"],
                ["chosen"],
                name="if",
                then_branch=helper.make_graph(
                    [helper.make_node("Neg", ["x"], ["t"])],
                    "then",
                    [],
                    [helper.make_tensor_value_info("t", F, [3])],
                ),
                else_branch=helper.make_graph(
                    [helper.make_node("Exp", ["x"], ["e"])],
                    "else",
                    [],
                    [helper.make_tensor_value_info("e", F, [3])],
                ),
            ),
        ],
        [("x", F, [3]), ("acc0", F, [3])],
        {"trip": _i64(4)[0], "flag": np.asarray(False)},
        18,
    ),
]


@pytest.mark.parametrize("nodes,inputs,inits,opset", [c[1:] for c in MORE], ids=[c[0] for c in MORE])
def test_more_ops_match_onnx_runtime_eager_and_jitted(
    nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list[int]]], inits: dict[str, Any], opset: int
) -> None:
    import jax

    produced = {o for n in nodes for o in n.output}
    consumed = {i for n in nodes for i in n.input}
    outputs = sorted(produced - consumed)
    model = make_ad_model(nodes, inputs, outputs, initializers=inits, opset=opset)
    rng = np.random.default_rng(1)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, _, shape in inputs}
    want = run(model, feeds)
    f = onnx_jax.interpret(model)
    wide = {k: v.astype(np.float64) for k, v in feeds.items()}
    with jax.enable_x64(True):
        eager = f(wide)
        jitted = jax.jit(lambda values: f(values))(wide)
    for name, e, j in zip(outputs, eager, jitted, strict=True):
        w = want[name]
        assert np.asarray(e).shape == w.shape, name
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(np.asarray(e), w, rtol=2e-5, atol=2e-5, err_msg=name)
            np.testing.assert_allclose(np.asarray(j), w, rtol=2e-5, atol=2e-5, err_msg=f"{name} (jit)")
        else:
            np.testing.assert_array_equal(np.asarray(e), w, err_msg=name)
            np.testing.assert_array_equal(np.asarray(j), w, err_msg=f"{name} (jit)")


def test_missing_ops_are_named_and_functions_inlined() -> None:
    """Ops the interpreter lacks are listed (subgraphs and other domains included); a model-local
    function is inlined, so its body's ops count and it interprets."""
    fn = helper.make_function(
        "local",
        "Scaled",
        ["a"],
        ["b"],
        [
            helper.make_node("Constant", [], ["k"], value_float=1.5),
            helper.make_node("Mul", ["a", "k"], ["b"]),
        ],
        opset_imports=[helper.make_opsetid("", 18)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Scaled", ["x"], ["y"], domain="local"),
            helper.make_node("Det", ["m"], ["d"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, [2]), helper.make_tensor_value_info("m", F, [2, 2])],
        [helper.make_tensor_value_info("y", F, [2]), helper.make_tensor_value_info("d", F, [])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)], functions=[fn]
    )
    assert onnx_jax.missing_ops(model) == ["Det"]
    with pytest.raises(NotImplementedError, match="Det"):
        onnx_jax.interpret(model)
    del model.graph.node[1]
    del model.graph.output[1]
    (y,) = onnx_jax.interpret(model)({"x": np.asarray([2.0, -1.0])})
    np.testing.assert_allclose(np.asarray(y), [3.0, -1.5])


@pytest.mark.parametrize("nodes,inputs,inits", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_interpreter_matches_onnx_runtime(
    nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list[int]]], inits: dict[str, Any]
) -> None:
    produced = {o for n in nodes for o in n.output}
    consumed = {i for n in nodes for i in n.input}
    outputs = sorted(produced - consumed) or [nodes[-1].output[0]]
    model = make_ad_model(nodes, inputs, outputs, initializers=inits, opset=18)
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, _, shape in inputs}
    want = run(model, feeds)
    import jax

    with jax.enable_x64(True):
        got = onnx_jax.interpret(model)({k: v.astype(np.float64) for k, v in feeds.items()})
    for name, value in zip(outputs, got, strict=True):
        np.testing.assert_allclose(np.asarray(value), want[name], rtol=2e-5, atol=2e-5, err_msg=name)
