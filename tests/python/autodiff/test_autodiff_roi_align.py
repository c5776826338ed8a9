"""Derivatives of RoiAlign in the feature map and in the boxes, against the oracles of
``ad_oracle`` (float64 finite differences of the op as ONNX Runtime computes it, the dot-product
test, finite differences of the gradient for Hessian-vector products, a loop for per-example
gradients, float32 against the float64 oracle). Boxes reach past the map's border so the
out-of-map samples and the clamping are exercised; a random sample lies on a pixel boundary (a
kink) with probability zero.
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
    check_per_example_grad,
    float32_battery,
    make_ad_model,
)
from oracles.vmap_oracle import assert_vmap_matches

D = TensorProto.DOUBLE
I64 = TensorProto.INT64
BOXES = 3


def boxes(lo: float, hi: float):
    """Boxes (x1, y1, x2, y2) with x1, y1 in [lo, hi] and sides of 1.5 to 5 pixels."""

    def gen(rng: np.random.Generator, dtype: np.dtype) -> np.ndarray:
        start = rng.uniform(lo, hi, size=(BOXES, 2))
        size = rng.uniform(1.5, 5.0, size=(BOXES, 2))
        return np.concatenate([start, start + size], axis=1).astype(dtype)

    return gen


def roi_model(**attrs: Any) -> onnx.ModelProto:
    out_h, out_w = attrs.get("output_height", 1), attrs.get("output_width", 1)
    coef = np.random.default_rng(4).standard_normal((BOXES, 3, out_h, out_w))
    nodes = [
        helper.make_node("RoiAlign", ["X", "rois", "idx"], ["Y"], **attrs),
        helper.make_node("Mul", ["Y", "coef"], ["Yc"]),
        helper.make_node("ReduceSum", ["Yc"], ["loss"], keepdims=0),
    ]
    return make_ad_model(
        nodes,
        [("X", D, [2, 3, 8, 8]), ("rois", D, [BOXES, 4])],
        [("loss", D, []), "Y"],
        initializers={"coef": coef, "idx": np.array([0, 1, 1], dtype=np.int64)},
    )


@dataclass
class Case:
    id: str
    model: onnx.ModelProto
    gens: dict[str, Any]


CASES = [
    Case(
        "avg-half-pixel",
        roi_model(output_height=3, output_width=2, sampling_ratio=2, spatial_scale=0.5),
        {"rois": boxes(0.0, 8.0)},
    ),
    Case(
        "avg-output-half-pixel-past-the-border",
        roi_model(
            output_height=2,
            output_width=2,
            sampling_ratio=3,
            coordinate_transformation_mode="output_half_pixel",
        ),
        {"rois": boxes(-2.5, 6.0)},
    ),
    Case(
        "max-past-the-border",
        roi_model(output_height=2, output_width=3, sampling_ratio=2, mode="max"),
        {"rois": boxes(-2.5, 6.0)},
    ),
    # Adaptive sampling (sampling_ratio 0, the default): bins of 0.75 to 2.5 pixels take 1 to 3
    # samples per axis, a different count per box.
    Case("adaptive-avg", roi_model(output_height=2, output_width=2), {"rois": boxes(0.0, 6.0)}),
    Case(
        "adaptive-avg-output-half-pixel-past-the-border",
        roi_model(output_height=2, output_width=3, coordinate_transformation_mode="output_half_pixel"),
        {"rois": boxes(-2.5, 6.0)},
    ),
    Case(
        "adaptive-max-past-the-border",
        roi_model(output_height=2, output_width=2, mode="max", spatial_scale=0.75),
        {"rois": boxes(-2.5, 6.0)},
    ),
    # More than 4096 sample positions along an axis: the positions come from a Range, not a
    # constant table (which a huge output_height would make a memory bomb).
    Case(
        "avg-4100-bins-positions-from-a-range",
        roi_model(output_height=4100, output_width=1, sampling_ratio=1),
        {"rois": boxes(0.0, 6.0)},
    ),
    Case(
        "adaptive-avg-4100-bins-positions-from-a-range",
        roi_model(output_height=4100, output_width=2),
        {"rois": boxes(-2.5, 6.0)},
    ),
]
IDS = [c.id for c in CASES]
INPUTS = ["X", "rois"]


test_jvp, test_vjp_dot, test_grad, test_hvp, test_per_example_grad = battery(
    CASES,
    IDS,
    inputs=lambda c: INPUTS,
    hvp_wrt=lambda c: ["rois", "X"],
    per_example_axes=lambda c: (0, None),  # per-example feature maps with shared boxes
)
test_f32 = float32_battery(CASES, IDS, inputs=lambda c: INPUTS)


def test_adaptive_sampling_counts_differ_per_box() -> None:
    # The premise of the adaptive cases: their boxes need different sample counts (ceil of the
    # bin size), so the masks matter.
    rois = boxes(0.0, 6.0)(np.random.default_rng(0), np.dtype(np.float64))
    heights = (rois[:, 3] - rois[:, 1] - 0.0) / 2  # half_pixel: no minimum size, 2 bins
    assert len(set(np.ceil(heights).astype(int))) > 1, heights


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0)], ids=["features", "boxes", "both"])
def test_vmap_is_vectorized(case: Case, in_axes: tuple[int | None, int | None]) -> None:
    # The batch merges into N and into the boxes (indices shifted per example): no per-example
    # Scan, for the op and for per-example gradients.
    gens = {"rois": lambda rng, g=case.gens["rois"]: g(rng, np.dtype(np.float64))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vm = assert_vmap_matches(case.model, in_axes, 0, gens=gens, rtol=1e-9, atol=1e-9)
        assert "Scan" not in [n.op_type for n in vm.graph.node]
        if in_axes == (0, None):
            check_per_example_grad(case.model, in_axes, INPUTS, "loss", gens=case.gens)
