"""vmap of BatchNormalization in training mode: each example is a batch of its own, normalised
with its own statistics and updating its own running statistics.

Checked against ONNX Runtime running the source once per example (``vmap(f)(X)[i] == f(X[i])``),
and per-example gradients against JAX.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from oracles.training_oracle import run
from oracles.vmap_oracle import assert_vmap_matches, make_model

jax.config.update("jax_enable_x64", True)

PARAMS = ["scale", "bias", "mean", "var"]


def batchnorm_model(shape: list[int], **attrs: Any) -> onnx.ModelProto:
    names = ["y", "running_mean", "running_var"]
    nodes = [h.make_node("BatchNormalization", ["x", *PARAMS], names, name="bn", training_mode=1, **attrs)]
    channels = shape[1]
    inputs = [("x", T.FLOAT, shape)] + [(p, T.FLOAT, [channels]) for p in PARAMS]
    return make_model(nodes, inputs, names)


def positive(shape: tuple[int, ...]) -> Any:
    return lambda rng: rng.uniform(0.5, 2.0, size=shape).astype(np.float32)


@pytest.mark.parametrize("shape", [[4, 3], [2, 3, 5], [2, 3, 4, 4]])
def test_every_input_batched(shape: list[int]) -> None:
    model = batchnorm_model(shape, momentum=0.8, epsilon=1e-3)
    assert_vmap_matches(model, in_axes=0, gens={"var": positive((shape[1],))}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "batched",
    [["x"], ["scale", "bias"], ["x", "mean"], ["var"]],
)
def test_some_inputs_batched(batched: list[str]) -> None:
    model = batchnorm_model([3, 2, 4])
    in_axes = {n: (0 if n in batched else None) for n in ["x", *PARAMS]}
    assert_vmap_matches(model, in_axes=in_axes, gens={"var": positive((2,))}, rtol=1e-4, atol=1e-5)


def test_per_example_gradients_match_jax() -> None:
    nodes = [
        h.make_node("BatchNormalization", ["x", *PARAMS], ["y", "rm", "rv"], name="bn", training_mode=1),
        h.make_node("Tanh", ["y"], ["t"], name="tanh"),
        h.make_node("Mul", ["t", "t"], ["sq"], name="square"),
        h.make_node("ReduceSum", ["sq"], ["loss"], name="sum", keepdims=0),
    ]
    model = make_model(nodes, [("x", T.FLOAT, [4, 3, 5])] + [(p, T.FLOAT, [3]) for p in PARAMS], ["loss"])
    grads = onnax.grad(model, inputs=["x", "scale", "bias"])
    per_example = onnax.vmap(grads, in_axes={"x": 0, "scale": None, "bias": None, "mean": None, "var": None})
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(6, 4, 3, 5)).astype(np.float32)
    scale, bias = rng.normal(size=3).astype(np.float32), rng.normal(size=3).astype(np.float32)
    stats = {"mean": np.zeros(3, np.float32), "var": np.ones(3, np.float32)}
    got = run(per_example, {"x": xs, "scale": scale, "bias": bias, **stats})

    def loss(x: Any, s: Any, b: Any) -> Any:
        mean = jnp.mean(x, axis=(0, 2), keepdims=True)
        var = jnp.mean((x - mean) ** 2, axis=(0, 2), keepdims=True)
        y = (x - mean) / jnp.sqrt(var + 1e-5) * s[None, :, None] + b[None, :, None]
        return jnp.sum(jnp.tanh(y) ** 2)

    want = jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(0, None, None))(
        xs.astype(np.float64), scale.astype(np.float64), bias.astype(np.float64)
    )
    for name, w in zip(["x_grad", "scale_grad", "bias_grad"], want, strict=True):
        np.testing.assert_allclose(got[name], w, rtol=2e-3, atol=2e-4)
