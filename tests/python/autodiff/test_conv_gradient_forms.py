"""The forms Conv's reverse mode takes, each checked against float64 finite differences.

- Input cotangent: for unit strides and static pads, a Conv with the kernel flipped and its
  channel roles swapped per group (ONNX Runtime runs it faster than a ConvTranspose); otherwise
  a ConvTranspose cropped to the input.
- Weight cotangent: the input's windows (a Conv with one-hot kernels; for a 1x1 kernel the input
  itself, strided), contracted with the output cotangent: one Gemm for a single example and one
  group; else one MatMul per example and group summed over the examples, when a group has no
  more output channels than there are output positions; else an Einsum.

Oracles: float64 central differences of the source (check_grad), differences of the gradient
(check_hvp), and a loop over examples for per-example gradients (check_per_example_grad).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnax.testing._models import op_counts
from onnx import TensorProto
from oracles import ad_oracle as ad
from oracles.vmap_oracle import node

D = TensorProto.DOUBLE

# (kernel, strides, pads, dilations, group, channels in, channels out)
CASES = {
    "3x3": ([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1, 2, 3),
    "3x3 unpadded": ([3, 3], [1, 1], [0, 0, 0, 0], [1, 1], 1, 2, 3),
    "3x3 asymmetric pads": ([3, 3], [1, 1], [2, 0, 1, 2], [1, 1], 1, 2, 3),
    "3x2 dilated": ([3, 2], [1, 1], [1, 0, 2, 1], [2, 1], 1, 2, 2),
    "3x3 grouped": ([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 2, 4, 6),
    "depthwise": ([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 3, 3, 3),
    "3x3 stride 2": ([3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 1, 2, 3),
    "1x1": ([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1, 3, 2),
    "1x1 stride 2": ([1, 1], [2, 2], [0, 0, 0, 0], [1, 1], 1, 3, 2),
    "1x1 padded": ([1, 1], [1, 1], [1, 0, 0, 1], [1, 1], 1, 3, 2),
    "whole image": ([7, 6], [1, 1], [0, 0, 0, 0], [1, 1], 1, 2, 3),
}
SIZE = [7, 6]


def output_positions(case: str) -> int:
    kernel, strides, pads, dilations, *_ = CASES[case]
    n = 1
    for i, size in enumerate(SIZE):
        extent = (kernel[i] - 1) * dilations[i] + 1
        n *= (size + pads[i] + pads[i + 2] - extent) // strides[i] + 1
    return n


def conv_model(case: str, batch: Any) -> onnx.ModelProto:
    kernel, strides, pads, dilations, group, c_in, c_out = CASES[case]
    nodes = [
        node(
            "Conv",
            ["x", "W", "B"],
            ["y"],
            kernel_shape=kernel,
            strides=strides,
            pads=pads,
            dilations=dilations,
            group=group,
        ),
        node("Tanh", ["y"], ["t"]),
        node("Mul", ["t", "t"], ["sq"]),
        node("ReduceSum", ["sq"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(len(case))
    return ad.make_ad_model(
        nodes,
        [("x", D, [batch, c_in, *SIZE])],
        ["loss"],
        initializers={
            "W": rng.normal(size=(c_out, c_in // group, *kernel)) / 2,
            "B": rng.normal(size=c_out) / 4,
        },
    )


@pytest.mark.parametrize("batch", [1, 2, "N"])
@pytest.mark.parametrize("case", list(CASES))
def test_conv_gradient(case: str, batch: Any) -> None:
    kernel, strides, pads, dilations, group, c_in, _ = CASES[case]
    model = conv_model(case, batch)
    n = 2 if batch == 2 else 1
    gens = {"x": ad.normal([n, c_in, 7, 6])}
    gm = ad.check_grad(model, inputs=["x", "W", "B"], output="loss", gens=gens)
    ops = op_counts(gm)
    # The input's cotangent: a ConvTranspose only for strides above 1 or pads wider than the
    # kernel's extent.
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    by_conv = strides == [1, 1] and all(p <= e - 1 for p, e in zip(pads, extents * 2, strict=True))
    assert ops.get("ConvTranspose", 0) == (0 if by_conv else 1), ops
    # The weight's: one Gemm for one static example and one group; else per-example MatMuls
    # when a group's output channels are no more than the output positions; else an Einsum.
    c_out = CASES[case][6]
    form = (
        "Gemm"
        if batch == 1 and group == 1
        else "MatMul"
        if c_out // group <= output_positions(case)
        else "Einsum"
    )
    assert {f: ops.get(f, 0) for f in ("Gemm", "MatMul", "Einsum")} == {
        f: int(f == form) for f in ("Gemm", "MatMul", "Einsum")
    }, ops
    # Windows: no window Conv for an unpadded 1x1 kernel (the forward Conv and the input's
    # cotangent Conv remain).
    unpadded_1x1 = kernel == [1, 1] and not any(pads)
    convs = 1 + by_conv + (not unpadded_1x1)
    assert ops.get("Conv", 0) == convs, ops


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("case", ["3x3", "3x3 grouped", "1x1 stride 2", "3x3 stride 2", "whole image"])
def test_conv_hvp_and_per_example_gradients(case: str, batch: int) -> None:
    """Forward over reverse and vmap over reverse go through the new forms' own rules."""
    c_in = CASES[case][5]
    model = conv_model(case, batch)
    gens = {"x": ad.normal([batch, c_in, *SIZE])}
    ad.check_hvp(model, wrt=["W"], inputs=["x", "W", "B"], output="loss", gens=gens)
    ad.check_per_example_grad(
        model, in_axes=[0], inputs=["W", "B"], output="loss", gens=gens, batch_sizes=(1, 3)
    )


@pytest.mark.parametrize("spatial", [[7, 6], ["H", "W"]])
@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_same_padded_conv_gradient(auto_pad: str, strides: list[int], spatial: list[Any]) -> None:
    """auto_pad=SAME_* pads depend on the input's size: computed at run time for symbolic sizes,
    folded to constants for static ones, where the gradient then needs no shape arithmetic and
    (for unit strides) no ConvTranspose."""
    nodes = [
        node("Conv", ["x", "W"], ["y"], kernel_shape=[3, 2], strides=strides, auto_pad=auto_pad),
        node("Sin", ["y"], ["s"]),
        node("ReduceSum", ["s"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(5)
    model = ad.make_ad_model(
        nodes, [("x", D, [1, 2, *spatial])], ["loss"], initializers={"W": rng.normal(size=(3, 2, 3, 2)) / 2}
    )
    gm = ad.check_grad(model, inputs=["x", "W"], output="loss", gens={"x": ad.normal([1, 2, 7, 6])})
    ops = op_counts(gm)
    static = spatial == [7, 6]
    assert ("Shape" in ops) == (not static), ops
    assert ops.get("ConvTranspose", 0) == (0 if static and strides == [1, 1] else 1), ops
