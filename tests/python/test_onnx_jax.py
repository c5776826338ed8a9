"""The corpus' ONNX-in-JAX interpreter (conformance/corpus/onnx_jax.py) against ONNX Runtime.

It is the float64 reference for the light architectures' derivatives, so each op it covers
must compute what ONNX Runtime computes, including the attribute branches those models may
not reach (grouped and dilated Conv, ceil_mode, count_include_pad, Gemm's transposes, ...).
(LRN sizes are odd: ONNX Runtime rejects even ones.)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from ad_oracle import make_ad_model, run
from onnx import TensorProto
from vmap_oracle import node

pytest.importorskip("jax")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from conformance.corpus import onnx_jax

F = TensorProto.FLOAT
I64 = TensorProto.INT64

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
    got = onnx_jax.interpret(model)({k: v.astype(np.float64) for k, v in feeds.items()})
    for name, value in zip(outputs, got, strict=True):
        np.testing.assert_allclose(np.asarray(value), want[name], rtol=2e-5, atol=2e-5, err_msg=name)
