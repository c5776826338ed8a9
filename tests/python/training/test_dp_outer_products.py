"""DP-SGD steps whose weight gradients are outer products: every example's gradient norm and
the clipped sum computed from the layer's input rows and output cotangents (K = 1: the norms'
product; small K: Gram matrices) instead of materialised per-example gradients, and the
generic form where that is not cheaper. Checked against JAX float64 per-example gradients."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles.training_oracle import run

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

onnax = pytest.importorskip("onnax")

T, D, H, R = 3, 8, 8, 6  # sequence, input width, hidden width, rows of the left factor


def sequence_model(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x [N, T, D] -> h = tanh(x W1 + b1) [N, T, H] -> u = M2 (h w3) [N, R, 1], and
    v = (M h) W2 [N, R, 2]; output y = u + v [N, R, 2].

    W1's per-example gradient x^T dh has K = T = 3 rows (Gram form: 3 (8 + 8) < 8 * 8); w3's
    has K = T (3 (8 + 1) >= 8: generic); M2 (on the left of h w3, broadcast over the example's
    batch of one: a sum over that axis of a rank-4 product) has K = 1 (the norms' product, its
    rows the transpose of the product's operand); M's K = H (8 (6 + 3) >= 18: generic); W2's
    K = R (6 (8 + 2) >= 16: generic)."""
    values = {
        "W1": (rng.standard_normal((D, H)) * 0.4).astype(np.float32),
        "b1": (rng.standard_normal(H) * 0.1).astype(np.float32),
        "w3": (rng.standard_normal((H, 1)) * 0.4).astype(np.float32),
        "M2": (rng.standard_normal((R, T)) * 0.4).astype(np.float32),
        "M": (rng.standard_normal((R, T)) * 0.4).astype(np.float32),
        "W2": (rng.standard_normal((H, 2)) * 0.4).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "w3"], ["hw"]),
        helper.make_node("MatMul", ["M2", "hw"], ["u"]),
        helper.make_node("MatMul", ["M", "h"], ["mh"]),
        helper.make_node("MatMul", ["mh", "W2"], ["v"]),
        helper.make_node("Add", ["u", "v"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "seq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", T, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", R, 2])],
        [numpy_helper.from_array(v, k) for k, v in values.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), values


def sequence_jax(p: dict[str, Any], x: Any) -> Any:
    h = jnp.tanh(x @ p["W1"] + p["b1"])
    return p["M2"] @ (h @ p["w3"]) + (p["M"] @ h) @ p["W2"]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_outer_product_norms_and_sums_match_jax_per_example_gradients(optimizer: str) -> None:
    rng = np.random.default_rng(11)
    model, values = sequence_model(rng)
    loss_model = onnax.add_loss(model, "mse")
    clip, sigma, lr, n = 0.5, 0.7, 0.1, 5
    step = onnax.train_step(
        loss_model,
        optimizer=optimizer,
        learning_rate=lr,
        weight_decay=0.01 if optimizer == "adamw" else 0.0,
        dp_clip_norm=clip,
        noise_multiplier=sigma,
    )
    outputs = {o for node in step.graph.node for o in node.output}
    # Which form each weight took (names are the step's own hints).
    assert "W1_left_gram" in outputs and "W1_right_gram" in outputs
    assert "M2_left_sq_norm" in outputs and "M2_right_sq_norm" in outputs
    for generic in ("w3", "M", "W2", "b1"):
        assert not any(o.startswith((f"{generic}_left_", f"{generic}_right_")) for o in outputs), generic

    state = onnax.initial_state(loss_model, step)
    x = rng.standard_normal((n, T, D)).astype(np.float32)
    label = rng.standard_normal((n, R, 2)).astype(np.float32)
    noise = {f"{k}_noise": rng.standard_normal(v.shape).astype(np.float32) for k, v in values.items()}
    out = run(step, {**state, **noise, "x": x, "label": label})

    params = {k: v.astype(np.float64) for k, v in values.items()}

    def example_loss(p: dict[str, Any], xi: Any, ti: Any) -> Any:
        return jnp.mean((sequence_jax(p, xi[None]) - ti[None]) ** 2)

    per_example = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))(
        params, x.astype(np.float64), label.astype(np.float64)
    )
    norms = np.sqrt(sum(np.sum(np.asarray(g).reshape(n, -1) ** 2, axis=1) for g in per_example.values()))
    np.testing.assert_allclose(out["per_example_grad_norm"], norms, rtol=2e-5)
    factor = np.minimum(1.0, clip / norms)
    assert (factor < 1).any()  # clipping is exercised
    private = {
        k: (np.tensordot(factor, np.asarray(per_example[k]), axes=1) + sigma * clip * noise[f"{k}_noise"]) / n
        for k in values
    }
    if optimizer == "sgd":
        for k in values:
            np.testing.assert_allclose(
                out[f"{k}_new"], params[k] - lr * private[k], rtol=1e-5, atol=1e-6, err_msg=k
            )
    else:
        import optax

        opt = optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)
        updates, _ = opt.update(private, opt.init(params), params)
        expected = optax.apply_updates(params, updates)
        for k in values:
            np.testing.assert_allclose(out[f"{k}_new"], expected[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_outer_products_agree_with_the_generic_form_on_an_mlp() -> None:
    """K = 1 everywhere, the first layer a Gemm with transB (as torch.onnx writes Linear, its
    gradient the transpose of an outer product): the step with outer products equals, to float32
    rounding, the same clip-sum computed from onnax's own per-example gradients (vmap of grad)."""
    rng = np.random.default_rng(3)
    w = {
        "W1": (rng.standard_normal((16, 6)) * 0.5).astype(np.float32),
        "W2": (rng.standard_normal((16, 4)) * 0.5).astype(np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "W1"], ["a"], transB=1),
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("MatMul", ["r", "W2"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    loss_model = onnax.add_loss(model, "mse")
    step = onnax.train_step(
        loss_model, optimizer="sgd", learning_rate=1.0, dp_clip_norm=1.0, noise_multiplier=0.0
    )
    outputs = {o for node in step.graph.node for o in node.output}
    assert {"W1_left_sq_norm", "W2_left_sq_norm"} <= outputs
    assert not any(o in ("W1_grad", "W2_grad") for o in outputs)  # never materialised
    x = rng.standard_normal((9, 6)).astype(np.float32)
    label = rng.standard_normal((9, 4)).astype(np.float32)
    noise = {f"{k}_noise": np.zeros_like(v) for k, v in w.items()}  # (sigma 0: unread)
    out = run(step, {**onnax.initial_state(loss_model, step), **noise, "x": x, "label": label})

    per_example = onnax.vmap(onnax.grad(loss_model, inputs=["W1", "W2"]), in_axes=[0, 0])
    grads = run(per_example, {"x": x[:, None], "label": label[:, None]})
    g = {k: grads[f"{k}_grad"].astype(np.float64) for k in w}
    norms = np.sqrt(sum(np.sum(v.reshape(9, -1) ** 2, axis=1) for v in g.values()))
    np.testing.assert_allclose(out["per_example_grad_norm"], norms, rtol=1e-5)
    factor = np.minimum(1.0, 1.0 / norms)
    for k in w:
        np.testing.assert_allclose(
            out[f"{k}_new"], w[k] - np.tensordot(factor, g[k], axes=1) / 9, rtol=1e-5, atol=1e-6, err_msg=k
        )
