"""Derivatives of Resize in its run-time ``scales`` and ``roi`` against a float64 NumPy Resize.

The finite-difference oracle of test_autodiff_rules runs ONNX Runtime or the reference
evaluator, which cannot serve here: ONNX Runtime resizes the outer two axes of a 4-D input only
at scale 1 in linear and cubic modes (so FD over those scales fails), and the reference
evaluator's float64 cubic Resize is only float32-accurate (too coarse for FD). So this file
carries its own Resize: separable along the axes, in float64, with ONNX Runtime's sampling
(linear clamps the coordinate to the input, cubic clamps the tap indices, exclude_outside drops
and renormalizes the taps outside, tf_crop_and_resize extrapolates outside the input; antialias
weighs every input element by a kernel stretched by 1/scale when downsampling, and copies an
axis whose length does not change). The
onnax graphs run in float32 in ONNX Runtime; jvp must match central differences of the NumPy
Resize, and vjp must match them by the dot-product test. Through the antialias expansion, the
Hessian in scales (jvp of grad) must match central differences of the gradient, and vmap(grad)
a loop over examples.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto
from oracles.ad_oracle import make_ad_model, run
from oracles.vmap_oracle import node

F = TensorProto.FLOAT


def _coordinate(
    mode: str, pos: np.ndarray, n: int, out: int, scale: float, roi: tuple[float, float]
) -> np.ndarray:
    if mode == "half_pixel":
        return (pos + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n / 2 * (1 - out / (scale * n))
        return offset + (pos + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (pos + 0.5) / scale - 0.5 if out > 1 else np.zeros_like(pos)
    if mode == "tf_half_pixel_for_nn":
        return (pos + 0.5) / scale
    if mode == "asymmetric":
        return pos / scale
    if mode == "align_corners":
        return pos * (n - 1) / (out - 1) if out > 1 else np.zeros_like(pos)
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out == 1:
            return np.full_like(pos, 0.5 * (start + end) * (n - 1))
        return start * (n - 1) + pos * (end - start) * (n - 1) / (out - 1)
    raise AssertionError(mode)


def _keys(t: np.ndarray, a: float) -> list[np.ndarray]:
    def far(d: np.ndarray) -> np.ndarray:
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    def near(d: np.ndarray) -> np.ndarray:
        return ((a + 2) * d - (a + 3)) * d * d + 1

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _antialias_weights(coord: np.ndarray, n: int, scale: float, attrs: Mapping[str, Any]) -> np.ndarray:
    """[out, n] weights of the antialiased filter: the kernel stretched by 1/scale when
    downsampling, normalized over its taps; taps outside the input land on the edge elements
    (or are dropped, with exclude_outside)."""
    stretch = min(scale, 1.0)
    reach = (1.0 if attrs["mode"] == "linear" else 2.0) / stretch
    pad = int(np.ceil(reach)) + 1
    taps = np.arange(n) if attrs.get("exclude_outside", 0) else np.arange(-pad, n + pad)
    d = np.abs((taps[None, :] - coord[:, None]) * stretch)
    if attrs["mode"] == "linear":
        kernel = np.maximum(0.0, 1.0 - d)
    else:
        a = attrs.get("cubic_coeff_a", -0.75)
        near = ((a + 2) * d - (a + 3)) * d * d + 1
        far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        kernel = np.where(d < 1, near, np.where(d < 2, far, 0.0))
    landing = np.clip(taps, 0, n - 1)[:, None] == np.arange(n)[None, :]
    return (kernel @ landing) / kernel.sum(axis=1, keepdims=True)


def resize_1d(
    x: np.ndarray, axis: int, out: int, scale: float, roi: tuple[float, float], attrs: Mapping[str, Any]
) -> np.ndarray:
    n = x.shape[axis]
    mode = attrs.get("coordinate_transformation_mode", "half_pixel")
    coord = _coordinate(mode, np.arange(out, dtype=np.float64), n, out, scale, roi)
    moved = np.moveaxis(x, axis, -1)
    if attrs.get("antialias", 0):
        y = moved if out == n else moved @ _antialias_weights(coord, n, scale, attrs).T
    elif attrs["mode"] == "linear":
        c = np.clip(coord, 0, n - 1)
        lo = np.floor(c).astype(np.int64)
        hi = np.minimum(lo + 1, n - 1)
        frac = c - lo
        y = moved[..., lo] * (1 - frac) + moved[..., hi] * frac
    else:
        base = np.floor(coord)
        weights = _keys(coord - base, attrs.get("cubic_coeff_a", -0.75))
        taps = [base.astype(np.int64) + k - 1 for k in range(4)]
        if attrs.get("exclude_outside", 0):
            weights = [w * ((t >= 0) & (t < n)) for w, t in zip(weights, taps, strict=True)]
            total = sum(weights)
            weights = [w / total for w in weights]
        y = sum(moved[..., np.clip(t, 0, n - 1)] * w for t, w in zip(taps, weights, strict=True))
    if mode == "tf_crop_and_resize":
        outside = (coord < 0) | (coord > n - 1)
        y = np.where(outside, attrs.get("extrapolation_value", 0.0), y)
    return np.moveaxis(y, -1, axis)


def resize(
    x: np.ndarray, scales: np.ndarray, roi: np.ndarray, out_shape: tuple[int, ...], attrs: Mapping[str, Any]
) -> np.ndarray:
    r = x.ndim
    for a in range(r):
        x = resize_1d(x, a, out_shape[a], float(scales[a]), (float(roi[a]), float(roi[a + r])), attrs)
    return x


CASES = [
    ("linear-half-pixel", {"mode": "linear"}),
    (
        "linear-half-pixel-symmetric",
        {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
    ),
    ("linear-pytorch-half-pixel", {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}),
    ("linear-asymmetric", {"mode": "linear", "coordinate_transformation_mode": "asymmetric"}),
    ("cubic-half-pixel", {"mode": "cubic"}),
    (
        "cubic-half-pixel-symmetric",
        {"mode": "cubic", "coordinate_transformation_mode": "half_pixel_symmetric"},
    ),
    ("cubic-exclude-outside", {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}),
    ("cubic-asymmetric", {"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}),
    ("linear-antialias", {"mode": "linear", "antialias": 1}),
    (
        "linear-antialias-align-corners",
        {"mode": "linear", "antialias": 1, "coordinate_transformation_mode": "align_corners"},
    ),
    ("cubic-antialias", {"mode": "cubic", "antialias": 1}),
    (
        "cubic-antialias-exclude-outside",
        {"mode": "cubic", "antialias": 1, "exclude_outside": 1, "cubic_coeff_a": -0.5},
    ),
    (
        "linear-tf-crop-and-resize",
        {
            "mode": "linear",
            "coordinate_transformation_mode": "tf_crop_and_resize",
            "extrapolation_value": 1.5,
        },
    ),
    (
        "linear-antialias-tf-crop-and-resize",
        {
            "mode": "linear",
            "antialias": 1,
            "coordinate_transformation_mode": "tf_crop_and_resize",
            "extrapolation_value": 1.5,
        },
    ),
    (
        "cubic-tf-crop-and-resize",
        {
            "mode": "cubic",
            "coordinate_transformation_mode": "tf_crop_and_resize",
            "extrapolation_value": -0.5,
        },
    ),
]

X_SHAPE = (2, 3, 4, 5)
# Scales of every axis, the batch and channel ones at 1 (ONNX Runtime runs the primal only
# there), and a roi whose starts/ends put some tf_crop_and_resize samples outside the input
# (on the outer axes the full range: ONNX Runtime ignores their roi). The resized axes' samples
# stay well away from the integers, where linear interpolation has kinks; at scale 1 every
# sample is an integer, so only cubic (smooth there) is checked in the outer axes' scales.
SCALES = np.asarray([1, 1, 1.37, 0.71], np.float32)
ROI = np.asarray([0, 0, 0.13, -0.21, 1, 1, 0.83, 1.17], np.float32)
CROP_SIZES = (2, 3, 3, 6)


def _model(attrs: Mapping[str, Any]) -> tuple[onnx.ModelProto, list[str]]:
    crop = attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize"
    if crop:
        # The output size comes from sizes; roi moves the samples.
        inputs = [("x", F, list(X_SHAPE)), ("roi", F, [8])]
        nodes = [node("Resize", ["x", "roi", "", "sizes"], ["y"], **attrs)]
        inits = {"sizes": np.asarray(CROP_SIZES, np.int64)}
        return make_ad_model(nodes, inputs, ["y"], initializers=inits, opset=18), ["x", "roi"]
    inputs = [("x", F, list(X_SHAPE)), ("scales", F, [4])]
    nodes = [node("Resize", ["x", "", "scales"], ["y"], **attrs)]
    return make_ad_model(nodes, inputs, ["y"], opset=18), ["x", "scales"]


def _numpy_resize(
    attrs: Mapping[str, Any], x: np.ndarray, other: np.ndarray, out_shape: tuple[int, ...]
) -> np.ndarray:
    if attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        scales = np.asarray(CROP_SIZES, np.float64) / np.asarray(X_SHAPE, np.float64)
        return resize(x, scales, other, out_shape, attrs)
    return resize(x, other, np.zeros(8), out_shape, attrs)


@pytest.mark.parametrize("attrs", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_resize_jvp_and_vjp_match_numpy_in_scales_and_roi(attrs: dict[str, Any]) -> None:
    check_against_numpy(attrs, SCALES)


@pytest.mark.parametrize(
    "attrs",
    [
        {"mode": "linear", "antialias": 1, "exclude_outside": 1},
        {"mode": "cubic", "antialias": 1},
    ],
    ids=["linear-exclude-outside", "cubic"],
)
def test_antialias_copies_an_axis_whose_length_does_not_change(attrs: dict[str, Any]) -> None:
    # Scale 1.1 on a length-4 axis keeps the length (4.4 -> 4): ONNX Runtime copies that axis
    # whatever the scale, so its scale has no derivative; the other axis downsamples.
    check_against_numpy(attrs, np.asarray([1, 1, 1.1, 0.55], np.float32))


def check_against_numpy(attrs: Mapping[str, Any], scales: np.ndarray) -> None:
    model, names = _model(attrs)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    other = ROI if "roi" in names else scales
    feeds = {names[0]: x, names[1]: other}
    y = run(model, feeds)["y"]
    # The NumPy Resize reproduces the primal (as ONNX Runtime computes it, in float32).
    np.testing.assert_allclose(
        _numpy_resize(attrs, x.astype(np.float64), other.astype(np.float64), y.shape), y, rtol=1e-5, atol=1e-5
    )

    dx = rng.standard_normal(X_SHAPE)
    dother = rng.standard_normal(other.shape)
    if attrs["mode"] == "linear" or "roi" in names:
        dother[[0, 1, 4, 5] if "roi" in names else [0, 1]] = 0
    eps = 1e-6

    def f(s: float) -> np.ndarray:
        return _numpy_resize(attrs, x + s * dx, other.astype(np.float64) + s * dother, y.shape)

    fd = (f(eps) - f(-eps)) / (2 * eps)

    jm = onnax.jvp(model)
    tangents = [vi.name for vi in jm.graph.input[len(model.graph.input) :]]
    got = run(jm, {**feeds, tangents[0]: dx.astype(np.float32), tangents[1]: dother.astype(np.float32)})
    np.testing.assert_allclose(got[jm.graph.output[1].name], fd, rtol=2e-3, atol=2e-3 * np.abs(fd).max())

    vm = onnax.vjp(model)
    u = rng.standard_normal(y.shape)
    cts = run(vm, {**feeds, vm.graph.input[-1].name: u.astype(np.float32)})
    ct_x, ct_other = (cts[o.name].astype(np.float64) for o in vm.graph.output[1:])
    dot = float((ct_x * dx).sum() + (ct_other * dother).sum())
    expected = float((u * fd).sum())
    assert abs(dot - expected) <= 2e-3 * (abs(expected) + np.abs(u).sum() * np.abs(fd).max() * 1e-3), (
        dot,
        expected,
    )


@pytest.mark.parametrize(
    "attrs",
    [
        {"mode": "linear", "antialias": 1},
        {"mode": "cubic", "antialias": 1},
        {"mode": "cubic", "antialias": 1, "exclude_outside": 1},
    ],
    ids=["linear", "cubic", "cubic-exclude-outside"],
)
def test_antialias_hessian_and_per_example_gradients_in_scales(attrs: dict[str, Any]) -> None:
    # Second order and batching through the antialias expansion (its Abs, Relu, Where, Ceil,
    # Range, MatMul each carry rules of their own): jvp(grad) in scales against central
    # differences of the gradient, and vmap(grad) against a loop over examples.
    x_shape, y_shape = (1, 2, 7, 9), (1, 2, 4, 6)
    weights = np.random.default_rng(5).standard_normal(y_shape).astype(np.float32)
    model = make_ad_model(
        [
            node("Resize", ["x", "", "scales"], ["y"], **attrs),
            node("Mul", ["y", "w"], ["weighted"]),
            node("ReduceSum", ["weighted"], ["loss"], keepdims=0),
        ],
        [("x", F, list(x_shape)), ("scales", F, [4])],
        [("loss", F, [])],
        initializers={"w": weights},
        opset=18,
    )
    g = onnax.grad(model, inputs=["x", "scales"], output="loss")
    d_scales = g.graph.output[-1].name
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    scales = np.asarray([1, 1, 0.63, 0.71], np.float32)

    h = onnax.jvp(g, inputs=["scales"])
    direction = np.asarray([0, 0, 0.6, -0.8], np.float32)
    hvp = run(h, {"x": x, "scales": scales, h.graph.input[-1].name: direction})[h.graph.output[-1].name]
    eps = 1e-3
    plus = run(g, {"x": x, "scales": scales + eps * direction})[d_scales]
    minus = run(g, {"x": x, "scales": scales - eps * direction})[d_scales]
    fd = (plus.astype(np.float64) - minus) / (2 * eps)
    np.testing.assert_allclose(hvp, fd, rtol=2e-3, atol=2e-3 * np.abs(fd).max())

    v = onnax.vmap(g, in_axes=[0, None])
    xs = rng.standard_normal((3, *x_shape)).astype(np.float32)
    batched = run(v, {"x": xs, "scales": scales})[d_scales]
    looped = np.stack([run(g, {"x": xs[i], "scales": scales})[d_scales] for i in range(3)])
    np.testing.assert_allclose(batched, looped, rtol=1e-5, atol=1e-5 * np.abs(looped).max())
