"""Derivatives of GridSample in X and in the grid, every mode, padding mode and align_corners,
2-D and 3-D, against the oracles of ``ad_oracle`` (float64 finite differences of the op as
ONNX Runtime computes it, the dot-product test, finite differences of the gradient for
Hessian-vector products, a loop for per-example gradients, float32 against the float64
oracle). Grids reach past [-1, 1] so every padding mode is exercised; random points lie on a
pixel boundary (a kink) with probability zero.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto, helper
from oracles.ad_oracle import (
    as_float,
    battery,
    float32_battery,
    make_ad_model,
    make_feeds,
    run,
    uniform,
)
from oracles.vmap_oracle import assert_vmap_matches

D = TensorProto.DOUBLE


def grid_model(
    spatial: tuple[int, ...], out: tuple[int, ...], opset: int = 22, **attrs: Any
) -> onnx.ModelProto:
    """loss = sum(GridSample(X, G) * coef) with X [2, 2, *spatial] and G [2, *out, len(spatial)]."""
    r = len(spatial)
    coef = np.random.default_rng(5).standard_normal((2, 2, *out))
    nodes = [
        helper.make_node("GridSample", ["X", "G"], ["Y"], **attrs),
        helper.make_node("Mul", ["Y", "coef"], ["Yw"]),
        helper.make_node("ReduceSum", ["Yw"], ["loss"], keepdims=0),
    ]
    return make_ad_model(
        nodes,
        [("X", D, [2, 2, *spatial]), ("G", D, [2, *out, r])],
        [("loss", D, []), "Y"],
        initializers={"coef": coef},
        opset=opset,
    )


@dataclass
class Case:
    id: str
    model: onnx.ModelProto
    grid_shape: tuple[int, ...]

    @property
    def gens(self) -> dict[str, Any]:
        return {"G": uniform(self.grid_shape, -1.15, 1.15)}


def case(id: str, spatial: tuple[int, ...] = (4, 5), out: tuple[int, ...] = (3, 4), **attrs: Any) -> Case:
    return Case(id, grid_model(spatial, out, **attrs), (2, *out, len(spatial)))


CASES = [
    case("linear-zeros", mode="linear"),
    case("linear-border-align-corners", mode="linear", padding_mode="border", align_corners=1),
    case("linear-reflection", mode="linear", padding_mode="reflection"),
    case("linear-reflection-align-corners", mode="linear", padding_mode="reflection", align_corners=1),
    case("nearest-zeros", mode="nearest"),
    case("nearest-reflection-align-corners", mode="nearest", padding_mode="reflection", align_corners=1),
    case("cubic-zeros", mode="cubic"),
    case("cubic-border-align-corners", mode="cubic", padding_mode="border", align_corners=1),
    case("cubic-reflection", mode="cubic", padding_mode="reflection"),
    case("volumetric-linear-zeros", (3, 4, 3), (2, 3, 2), mode="linear"),
    case("volumetric-nearest-border", (3, 4, 3), (2, 3, 2), mode="nearest", padding_mode="border"),
]
IDS = [c.id for c in CASES]


XG = ["X", "G"]
test_jvp, test_vjp_dot, test_grad, test_hvp, test_per_example_grad = battery(
    CASES, IDS, inputs=lambda c: XG, hvp_wrt=lambda c: ["G", "X"], per_example_axes=lambda c: (0, 0)
)
test_f32 = float32_battery(CASES, IDS, inputs=lambda c: XG)


def test_opset_16_spellings() -> None:
    # GridSample-16 (opsets 16-19) spells the modes bilinear/bicubic. ONNX Runtime has only
    # float32 kernels for it, so the jvp is compared with the opset-22 model's (checked above).
    for old, new in (("bilinear", "linear"), ("bicubic", "cubic")):
        m16 = as_float(grid_model((4, 5), (3, 4), opset=18, mode=old, padding_mode="border"))
        m22 = as_float(grid_model((4, 5), (3, 4), mode=new, padding_mode="border"))
        feeds = make_feeds(m22, {"G": uniform((2, 3, 4, 2), -1.15, 1.15)}, np.random.default_rng(0))
        rng = np.random.default_rng(1)
        for name in ("X", "G"):
            feeds[name + "_tangent"] = rng.standard_normal(feeds[name].shape).astype(np.float32)
        j16, j22 = onnax.jvp(m16, inputs=["X", "G"]), onnax.jvp(m22, inputs=["X", "G"])
        got, want = run(j16, feeds), run(j22, feeds)
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("in_axes", [(0, 0), (0, None), (None, 0)], ids=["both", "image", "grid"])
@pytest.mark.parametrize("case", [CASES[0], CASES[9]], ids=[CASES[0].id, CASES[9].id])
def test_vmap_is_vectorized(case: Case, in_axes: tuple[int | None, int | None]) -> None:
    # The vmap batch merges into GridSample's N (no per-example Scan, so no warning).
    gens = {"G": lambda rng, g=case.gens["G"]: g(rng, np.dtype(np.float64))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vm = assert_vmap_matches(case.model, in_axes, 0, gens=gens, rtol=1e-9, atol=1e-9)
    assert "Scan" not in [n.op_type for n in vm.graph.node]
