"""Dropout whose training mode is a run-time input and whose mask is not an output (jax2onnx
writes Dropout(x, ratio, Not(deterministic)) this way): grad, jvp, vjp and vmap work, and the
derivative goes through the mask the run drew. The oracle is the run's own output: y = x * mask
/ (1 - ratio) in training mode (x has no zeros, so the mask is y != 0), y = x otherwise."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

onnax = pytest.importorskip("onnax")

RATIO = 0.3


def dropout_model() -> onnx.ModelProto:
    """y = Dropout(x * w, 0.3, Not(deterministic)); loss = sum(y * c)."""
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("Not", ["deterministic"], ["training"]),
        helper.make_node("Dropout", ["xw", "ratio", "training"], ["y"]),
        helper.make_node("Mul", ["y", "c"], ["yc"]),
        helper.make_node("ReduceSum", ["yc"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "dropout",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64]),
            helper.make_tensor_value_info("deterministic", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64]),
        ],
        [
            numpy_helper.from_array(np.linspace(0.5, 1.5, 64, dtype=np.float32), "w"),
            numpy_helper.from_array(np.cos(np.arange(64, dtype=np.float32)), "c"),
            numpy_helper.from_array(np.array(RATIO, np.float32), "ratio"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def inputs(rng: np.random.Generator, batch: tuple[int, ...] = ()) -> np.ndarray:
    x = rng.uniform(0.5, 2.0, size=(*batch, 3, 64)).astype(np.float32)
    return x * rng.choice([-1.0, 1.0], size=x.shape).astype(np.float32)  # no zeros


@pytest.mark.parametrize("deterministic", [False, True])
def test_grad_goes_through_the_mask_the_run_drew(deterministic: bool) -> None:
    model = dropout_model()
    w = np.linspace(0.5, 1.5, 64, dtype=np.float32)
    c = np.cos(np.arange(64, dtype=np.float32))
    x = inputs(np.random.default_rng(0))
    out = run(
        onnax.grad(model, inputs=["x"], output="loss"), {"x": x, "deterministic": np.array(deterministic)}
    )
    if deterministic:
        np.testing.assert_allclose(out["y"], x * w, rtol=1e-6)
        np.testing.assert_allclose(out["x_grad"], np.broadcast_to(w * c, x.shape), rtol=1e-6)
    else:
        kept = out["y"] != 0
        assert 0.5 < kept.mean() < 0.9  # the run dropped about 30%
        np.testing.assert_allclose(out["y"], np.where(kept, x * w / (1 - RATIO), 0), rtol=1e-5)
        np.testing.assert_allclose(out["x_grad"], np.where(kept, w * c / (1 - RATIO), 0), rtol=1e-5)
        np.testing.assert_allclose(out["loss"], np.sum(out["y"] * c), rtol=1e-4)


def test_jvp_and_vjp_go_through_the_same_mask() -> None:
    model = dropout_model()
    w = np.linspace(0.5, 1.5, 64, dtype=np.float32)
    rng = np.random.default_rng(1)
    x, t = inputs(rng), rng.standard_normal((3, 64)).astype(np.float32)
    jvp = run(
        onnax.jvp(model, inputs=["x"], outputs=["y"]),
        {"x": x, "x_tangent": t, "deterministic": np.array(False)},
    )
    kept = jvp["y"] != 0
    np.testing.assert_allclose(jvp["y_tangent"], np.where(kept, t * w / (1 - RATIO), 0), rtol=1e-5)
    ct = rng.standard_normal((3, 64)).astype(np.float32)
    vjp = run(
        onnax.vjp(model, inputs=["x"], outputs=["y"]),
        {"x": x, "y_cotangent": ct, "deterministic": np.array(False)},
    )
    kept = vjp["y"] != 0
    np.testing.assert_allclose(vjp["x_cotangent"], np.where(kept, ct * w / (1 - RATIO), 0), rtol=1e-5)


def test_vmap_and_vmap_of_grad_draw_per_element_and_keep_inference_exact() -> None:
    model = dropout_model()
    w = np.linspace(0.5, 1.5, 64, dtype=np.float32)
    c = np.cos(np.arange(64, dtype=np.float32))
    xs = inputs(np.random.default_rng(2), (4,))
    axes = {"x": 0, "deterministic": None}
    off = run(onnax.vmap(model, in_axes=axes), {"x": xs, "deterministic": np.array(True)})
    np.testing.assert_allclose(off["y"], xs * w, rtol=1e-6)
    on = run(onnax.vmap(model, in_axes=axes), {"x": xs, "deterministic": np.array(False)})
    kept = on["y"] != 0
    np.testing.assert_allclose(on["y"], np.where(kept, xs * w / (1 - RATIO), 0), rtol=1e-5)
    assert 0.5 < kept.mean() < 0.9
    grads = onnax.vmap(onnax.grad(model, inputs=["x"], output="loss"), in_axes=axes)
    g = run(grads, {"x": xs, "deterministic": np.array(False)})
    kept = g["y"] != 0
    np.testing.assert_allclose(g["x_grad"], np.where(kept, w * c / (1 - RATIO), 0), rtol=1e-5)
    np.testing.assert_allclose(g["loss"], np.sum(g["y"] * c, axis=(1, 2)), rtol=1e-4)


def test_a_batched_training_flag_is_refused_with_a_diagnostic() -> None:
    with pytest.raises(onnax.OnnaxError, match="training_mode"):
        onnax.vmap(dropout_model(), in_axes={"x": 0, "deterministic": 0})
