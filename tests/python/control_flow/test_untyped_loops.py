"""Loops whose bodies declare no types (onnxscript writes `for` loops this way; ONNX's own Loop
inference then types the carried state by element type only): onnax infers the body from the
Loop's inputs, so vmap, grad, vmap(grad) and jvp work, declared output dims survive, and no
diagnostic names an onnax-internal value. Checked against JAX float64."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

onnax = pytest.importorskip("onnax")

TRIPS, WIDTH = 3, 4


def untyped_loop_model(rng: np.random.Generator) -> tuple[onnx.ModelProto, np.ndarray]:
    """h_{t+1} = tanh(0.9 h_t W) for 3 steps from h_0 = x [N, 4]; each step also emits
    s_t = sum(h_{t+1}, axis 1) (a scan output [3, N]). Outputs: h [N, 4] (declared) and
    loss = sum(h^2) + sum(s^2). The body's inputs and outputs carry names only."""
    w = (rng.standard_normal((WIDTH, WIDTH)) * 0.6).astype(np.float32)

    def untyped(name: str) -> onnx.ValueInfoProto:
        return helper.make_value_info(name, onnx.TypeProto())

    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
            helper.make_node("Constant", [], ["scale"], value_float=0.9),
            helper.make_node("Mul", ["hw", "scale"], ["hs"]),
            helper.make_node("Tanh", ["hs"], ["h_out"]),
            helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.array([1], np.int64))),
            helper.make_node("ReduceSum", ["h_out", "one"], ["s"], keepdims=0),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [untyped("i"), untyped("cond_in"), untyped("h_in")],
        [untyped("cond_out"), untyped("h_out"), untyped("s")],
    )
    nodes = [
        helper.make_node("Constant", [], ["trips"], value=numpy_helper.from_array(np.array(TRIPS, np.int64))),
        helper.make_node("Loop", ["trips", "", "x"], ["h", "s_all"], body=body),
        helper.make_node("Mul", ["h", "h"], ["h2"]),
        helper.make_node("ReduceSum", ["h2"], ["a"], keepdims=0),
        helper.make_node("Mul", ["s_all", "s_all"], ["s2"]),
        helper.make_node("ReduceSum", ["s2"], ["b"], keepdims=0),
        helper.make_node("Add", ["a", "b"], ["loss"]),
    ]
    graph = helper.make_graph(
        nodes,
        "untyped_loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH])],
        [
            helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", WIDTH]),
        ],
        [numpy_helper.from_array(w, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), w


def reference(w: np.ndarray, x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    h, total = x, jnp.zeros(())
    for _ in range(TRIPS):
        h = jnp.tanh(0.9 * (h @ w))
        total = total + jnp.sum(jnp.sum(h, axis=1) ** 2)
    return jnp.sum(h**2) + total, h


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def declared_dims(model: onnx.ModelProto, name: str) -> list[int | str]:
    vi = next(o for o in model.graph.output if o.name == name)
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]


def test_vmap_of_an_untyped_loop_matches_jax() -> None:
    rng = np.random.default_rng(0)
    model, w = untyped_loop_model(rng)
    xs = rng.standard_normal((5, 2, WIDTH)).astype(np.float32)
    out = run(onnax.vmap(model), {"x": xs})
    for b in range(5):
        loss, h = reference(w.astype(np.float64), xs[b].astype(np.float64))
        np.testing.assert_allclose(out["loss"][b], loss, rtol=2e-5)
        np.testing.assert_allclose(out["h"][b], h, rtol=2e-5, atol=1e-6)


def test_vmap_of_grad_of_an_untyped_loop_matches_jax() -> None:
    rng = np.random.default_rng(1)
    model, w = untyped_loop_model(rng)
    per_example = onnax.vmap(onnax.grad(model, inputs=["x"], output="loss"))
    xs = rng.standard_normal((4, 3, WIDTH)).astype(np.float32)
    out = run(per_example, {"x": xs})
    expected = jax.vmap(jax.grad(lambda x: reference(w.astype(np.float64), x)[0]))(xs.astype(np.float64))
    np.testing.assert_allclose(out["x_grad"], expected, rtol=2e-5, atol=1e-6)


def test_jvp_and_hvp_of_an_untyped_loop_keep_declared_dims_and_match_jax() -> None:
    rng = np.random.default_rng(2)
    model, w = untyped_loop_model(rng)
    x = rng.standard_normal((3, WIDTH)).astype(np.float32)
    v = rng.standard_normal((3, WIDTH)).astype(np.float32)
    jvp = onnax.jvp(model, inputs=["x"])
    assert declared_dims(jvp, "h_tangent") == ["N", WIDTH]
    out = run(jvp, {"x": x, "x_tangent": v})

    def f(x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        return reference(w.astype(np.float64), x)

    _, (loss_t, h_t) = jax.jvp(f, (x.astype(np.float64),), (v.astype(np.float64),))
    np.testing.assert_allclose(out["loss_tangent"], loss_t, rtol=2e-5)
    np.testing.assert_allclose(out["h_tangent"], h_t, rtol=2e-5, atol=1e-6)

    hvp = onnax.jvp(onnax.grad(model, inputs=["x"], output="loss"), inputs=["x"])
    assert declared_dims(hvp, "x_grad_tangent") == ["N", WIDTH]
    got = run(hvp, {"x": x, "x_tangent": v})["x_grad_tangent"]
    expected = jax.jvp(jax.grad(lambda x: f(x)[0]), (x.astype(np.float64),), (v.astype(np.float64),))[1]
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6)
