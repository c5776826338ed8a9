"""Derivatives of DeformConv in the image, the weights, the offsets, the bias and the mask,
against the oracles of ``ad_oracle``: float64 finite differences of the op (ONNX Runtime, or
the ONNX reference evaluator where ONNX Runtime lacks a float64 kernel), the dot-product test,
finite differences of the gradient for Hessian-vector products, a loop for per-example
gradients, and float32 against the float64 oracle. Offsets are large enough that samples cross
pixel boundaries and the image border; random positions fall on a boundary (a kink) with
probability zero.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from oracles.ad_oracle import (
    battery,
    float32_battery,
    make_ad_model,
    normal,
)
from oracles.vmap_oracle import assert_vmap_matches

D = TensorProto.DOUBLE


@dataclass
class Case:
    id: str
    model: onnx.ModelProto
    inputs: list[str]
    gens: dict[str, Any]


def case(
    id: str,
    x: tuple[int, ...],
    w: tuple[int, ...],
    out: tuple[int, int],
    mask: bool = False,
    bias: bool = False,
    **attrs: Any,
) -> Case:
    n, _, _, _ = x
    taps = w[2] * w[3]
    groups = attrs.get("offset_group", 1)
    offset = (n, groups * taps * 2, *out)
    inputs = ["X", "W", "offset", "B" if bias else "", "mask" if mask else ""]
    while inputs[-1] == "":
        inputs.pop()
    specs = [("X", D, list(x)), ("W", D, list(w)), ("offset", D, list(offset))]
    if bias:
        specs.append(("B", D, [w[0]]))
    if mask:
        specs.append(("mask", D, [n, groups * taps, *out]))
    y = (n, w[0], *out)
    coef = np.random.default_rng(3).standard_normal(y)
    nodes = [
        helper.make_node("DeformConv", inputs, ["Y"], **attrs),
        helper.make_node("Mul", ["Y", "coef"], ["Yc"]),
        helper.make_node("ReduceSum", ["Yc"], ["loss"], keepdims=0),
    ]
    model = make_ad_model(nodes, specs, [("loss", D, []), "Y"], initializers={"coef": coef}, opset=22)
    gens = {"offset": normal(offset, 0.8)}
    return Case(id, model, [s[0] for s in specs], gens)


CASES = [
    case("basic", (1, 2, 5, 5), (3, 2, 3, 3), (3, 3)),
    case(
        "pads-strides-dilations",
        (2, 1, 6, 5),
        (2, 1, 2, 2),
        (4, 2),
        pads=[1, 0, 1, 1],
        strides=[2, 2],
        dilations=[1, 2],
    ),
    case(
        "groups-offset-groups-mask-bias",
        (1, 4, 4, 4),
        (2, 2, 2, 2),
        (3, 3),
        mask=True,
        bias=True,
        group=2,
        offset_group=2,
    ),
]
IDS = [c.id for c in CASES]


test_jvp, test_vjp_dot, test_grad, test_hvp, test_per_example_grad = battery(
    CASES,
    IDS,
    inputs=lambda c: c.inputs,
    hvp_wrt=lambda c: ["offset", "W"],
    # Per-example images, offsets and masks with shared weights.
    per_example_axes=lambda c: tuple(0 if name in ("X", "offset", "mask") else None for name in c.inputs),
)
test_f32 = float32_battery(CASES, IDS, inputs=lambda c: c.inputs)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize(
    "batched", [("X",), ("offset",), ("X", "offset", "mask")], ids=["image", "offsets", "all"]
)
def test_vmap_is_vectorized(case: Case, batched: tuple[str, ...]) -> None:
    # Shared weights: the vmap batch merges into DeformConv's N (no per-example Scan).
    axes = tuple(0 if name in batched else None for name in case.inputs)
    gens = {"offset": lambda rng, g=case.gens["offset"]: g(rng, np.dtype(np.float64))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vm = assert_vmap_matches(case.model, axes, 0, gens=gens, rtol=1e-9, atol=1e-9)
    assert "Scan" not in [n.op_type for n in vm.graph.node]
