"""Models and independent references for the training tests: a small MLP built with
onnx.helper, the same function written in jax.numpy, losses written from their definitions in
JAX float64, and optax as the optimizer reference."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
PARAMS = ("W1", "b1", "W2", "b2")


def mlp_values(
    rng: np.random.Generator, n_in: int = 4, hidden: int = 8, n_out: int = 3
) -> dict[str, np.ndarray]:
    return {
        "W1": (rng.standard_normal((n_in, hidden)) * 0.5).astype(np.float32),
        "b1": (rng.standard_normal(hidden) * 0.1).astype(np.float32),
        "W2": (rng.standard_normal((hidden, n_out)) * 0.5).astype(np.float32),
        "b2": (rng.standard_normal(n_out) * 0.1).astype(np.float32),
    }


def mlp_model(values: Mapping[str, np.ndarray], n_in: int = 4, n_out: int = 3) -> onnx.ModelProto:
    """y = tanh(x W1 + b1) W2 + b2 over a symbolic batch N; the weights are initializers."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["y0"]),
        helper.make_node("Add", ["y0", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", F, ["N", n_in])],
        [helper.make_tensor_value_info("y", F, ["N", n_out])],
        [numpy_helper.from_array(values[k], k) for k in PARAMS],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def mlp_jax(params: Mapping[str, Any], x: Any) -> Any:
    import jax.numpy as jnp

    return jnp.tanh(x @ params["W1"] + params["b1"]) @ params["W2"] + params["b2"]


def jax_loss(kind: str, **o: Any) -> Callable[[Any, Any], Any]:
    """Per-element loss l(y, t) from its definition (not from onnax's formulas)."""
    import jax
    import jax.numpy as jnp

    axis = o.get("class_axis", -1)

    def smoothed(t: Any, classes: int) -> Any:
        s = o.get("label_smoothing", 0.0)
        return (1 - s) * t + s / classes

    def f(y: Any, t: Any) -> Any:
        if kind == "mse":
            return (y - t) ** 2
        if kind == "l1":
            return jnp.abs(y - t)
        if kind == "huber":
            d, delta = jnp.abs(y - t), o.get("huber_delta", 1.0)
            return jnp.where(d <= delta, 0.5 * d**2, delta * (d - 0.5 * delta))
        if kind.startswith("binary_cross_entropy"):
            p = jax.nn.sigmoid(y) if kind.endswith("logits") else y
            return -(t * jnp.log(p) + (1 - t) * jnp.log1p(-p))
        classes = y.shape[axis]
        logp = {"softmax_cross_entropy": jax.nn.log_softmax(y, axis=axis), "cross_entropy": jnp.log(y)}.get(
            kind, y
        )
        if o.get("probabilities"):
            target = t
        else:
            target = jax.nn.one_hot(jnp.where(t < 0, 0, t), classes, axis=axis, dtype=y.dtype)
        return -jnp.sum(smoothed(target, classes) * logp, axis=axis)

    return f


def reduce_loss(elements: Any, mask: Any = None, weights: Any = None, reduction: str = "mean") -> Any:
    import jax.numpy as jnp

    if weights is not None:
        elements = elements * weights.reshape((-1,) + (1,) * (elements.ndim - 1))
    if mask is not None:
        elements = jnp.where(mask, elements, 0.0)
        if reduction == "mean":
            return jnp.sum(elements) / jnp.maximum(jnp.sum(mask), 1)
    return jnp.sum(elements) if reduction == "sum" else jnp.mean(elements)


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    # (ONNX Runtime lists inputs with a default initializer apart, as overridable initializers.)
    wanted = {i.name for i in [*sess.get_inputs(), *sess.get_overridable_initializers()]}
    return dict(zip(names, sess.run(None, {k: v for k, v in feeds.items() if k in wanted}), strict=True))


class StepRunner:
    """Runs a training step repeatedly, feeding every output back to its input."""

    def __init__(self, step: onnx.ModelProto, state: Mapping[str, np.ndarray]) -> None:
        import onnax

        so = ort.SessionOptions()
        so.log_severity_level = 3
        self.sess = ort.InferenceSession(step.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.sess.get_outputs()]
        self.pairs = onnax.feedback(step)
        self.state = dict(state)

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(zip(self.names, self.sess.run(None, {**self.state, **feeds}), strict=True))
        for i, o in self.pairs:
            if o is not None:
                self.state[i] = out[o]
        return out


def as64(values: Mapping[str, np.ndarray], names: Sequence[str] = PARAMS) -> dict[str, np.ndarray]:
    return {k: np.asarray(values[k], np.float64) for k in names}
