"""Exports the small models of ``tests/python/validate/test_validate_exporters.py`` with real exporters
and computes their references with the exporting framework in float64.

Run with a Python that has the exporters (never the project's .venv, never requirements.txt):

    python3 -m venv /tmp/exporters-venv
    /tmp/exporters-venv/bin/pip install tensorflow-cpu tf2onnx onnxscript skl2onnx scikit-learn
    /tmp/exporters-venv/bin/python tests/python/models/exporters/generate.py

Writes, next to this file, ``NAME.onnx`` and ``NAME.npz`` for

* ``tf_cnn``: Keras Conv2D(relu) -> MaxPool -> Dense(relu) -> Dense, loss = sum(y^2), by tf2onnx;
* ``tf_mlp``: Keras Dense(relu) x2 -> Dense, loss = sum(y^2), by tf2onnx;
* ``script_loop``: onnxscript, a model-local function (tanh layer with a float constant inside
  its body) applied in a ``for`` loop (an ONNX Loop), loss = sum(h^2);
* ``skl_mlp``: a scikit-learn MLPRegressor (relu), by skl2onnx, with a ReduceSum appended.

Each ``.npz`` holds the input ``x`` (a batch), ``xs`` (a stack of batches, for vmap), a
direction ``v``, and TensorFlow's float64 answers (NumPy's, by hand, for the scikit-learn MLP):
``loss``, ``grad_x`` (d loss / d x), ``vmap_grad_x`` and ``vmap_loss`` (per stacked batch),
``jvp_loss`` (the loss's tangent along v, by forward mode), ``hvp_x`` (the Hessian w.r.t. x
times v). ``generate_jax.py`` exports the JAX-side models of the same corpus
(``tests/python/conformance_suite/test_exporter_corpus.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

# (onnxscript reads the annotations of scripted functions from this module's globals)
from onnxscript import FLOAT, script
from onnxscript import opset18 as op
from onnxscript.values import Opset

HERE = Path(__file__).resolve().parent
OPSET = 17


def _inputs(shape: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal(shape).astype(np.float32),
        "xs": rng.standard_normal((3, *shape)).astype(np.float32),
        "v": rng.standard_normal(shape).astype(np.float32),
    }


def _save(name: str, arrays: dict[str, Any]) -> None:
    np.savez(HERE / f"{name}.npz", **arrays)


def _tf_references(loss64, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    import tensorflow as tf

    def grad(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = tf.constant(x, tf.float64)
        with tf.GradientTape() as tape:
            tape.watch(t)
            loss = loss64(t)
        return loss.numpy(), tape.gradient(loss, t).numpy()

    loss, g = grad(data["x"].astype(np.float64))
    per = [grad(x.astype(np.float64)) for x in data["xs"]]
    x = tf.constant(data["x"], tf.float64)
    with tf.autodiff.ForwardAccumulator(x, tf.constant(data["v"], tf.float64)) as acc:
        with tf.GradientTape() as tape:
            tape.watch(x)
            inner = loss64(x)
        hessian_row = tape.gradient(inner, x)
    return {
        "loss": np.asarray(loss),
        "grad_x": g,
        "vmap_grad_x": np.stack([p[1] for p in per]),
        "hvp_x": acc.jvp(hessian_row).numpy(),
        "vmap_loss": np.asarray([p[0] for p in per]),
        "jvp_loss": acc.jvp(inner).numpy(),
    }


def _keras(name: str, build, shape: tuple[int, ...], seed: int) -> None:  # type: ignore[no-untyped-def]
    import tensorflow as tf
    import tf2onnx

    tf.keras.utils.set_random_seed(seed)
    m32 = build("float32")
    m64 = build("float64")
    m64.set_weights([w.astype(np.float64) for w in m32.get_weights()])

    @tf.function(input_signature=[tf.TensorSpec([None, *shape[1:]], tf.float32, name="x")])
    def loss32(x):  # type: ignore[no-untyped-def]
        return tf.reduce_sum(tf.square(m32(x)))

    def loss64(x):  # type: ignore[no-untyped-def]
        return tf.reduce_sum(tf.square(m64(x)))

    proto, _ = tf2onnx.convert.from_function(loss32, input_signature=loss32.input_signature, opset=OPSET)
    onnx.save(proto, HERE / f"{name}.onnx")
    data = _inputs(shape, seed)
    _save(name, {**data, **_tf_references(loss64, data)})


def tf_cnn() -> None:
    from tensorflow import keras

    def build(dtype: str):  # type: ignore[no-untyped-def]
        L = keras.layers
        return keras.Sequential(
            [
                keras.Input((6, 6, 2), dtype=dtype),
                L.Conv2D(4, 3, padding="same", activation="relu", dtype=dtype),
                L.MaxPooling2D(2, dtype=dtype),
                L.Flatten(dtype=dtype),
                L.Dense(5, activation="relu", dtype=dtype),
                L.Dense(1, dtype=dtype),
            ]
        )

    _keras("tf_cnn", build, (2, 6, 6, 2), 0)


def tf_mlp() -> None:
    from tensorflow import keras

    def build(dtype: str):  # type: ignore[no-untyped-def]
        L = keras.layers
        return keras.Sequential(
            [
                keras.Input((4,), dtype=dtype),
                L.Dense(8, activation="relu", dtype=dtype),
                L.Dense(8, activation="relu", dtype=dtype),
                L.Dense(1, dtype=dtype),
            ]
        )

    _keras("tf_mlp", build, (5, 4), 1)


def script_loop() -> None:
    import tensorflow as tf

    local = Opset("local", 1)
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((3, 3)) * 0.8).astype(np.float32)

    @script(local, default_opset=op)
    def layer(h: FLOAT[...], w: FLOAT[...]) -> FLOAT[...]:
        scale = op.Constant(value_float=0.9)
        return op.Tanh(op.MatMul(h, w) * scale)

    @script(default_opset=op)
    def loss(x: FLOAT["N", 3]) -> FLOAT:  # type: ignore[name-defined]  # noqa: F821, UP037
        weight = op.Constant(value=onnx.numpy_helper.from_array(w, "weight"))
        h = op.Identity(x)
        for _ in range(3):
            h = layer(h, weight)
        return op.ReduceSum(h * h, keepdims=0)

    proto = loss.to_model_proto()
    onnx.checker.check_model(proto)
    onnx.save(proto, HERE / "script_loop.onnx")
    w64 = tf.constant(w.astype(np.float64))

    def loss64(x):  # type: ignore[no-untyped-def]
        h = x
        for _ in range(3):
            h = tf.tanh(tf.matmul(h, w64) * tf.constant(np.float32(0.9), tf.float64))
        return tf.reduce_sum(h * h)

    data = _inputs((4, 3), 2)
    _save("script_loop", {**data, **_tf_references(loss64, data)})


def skl_mlp() -> None:
    from onnx import helper
    from skl2onnx import to_onnx
    from sklearn.neural_network import MLPRegressor

    rng = np.random.default_rng(3)
    X = rng.standard_normal((64, 4))
    y = np.sin(X @ rng.standard_normal(4))
    reg = MLPRegressor(hidden_layer_sizes=(6, 5), activation="relu", max_iter=300, random_state=0).fit(X, y)
    proto = to_onnx(reg, X[:1].astype(np.float32), target_opset=OPSET)
    out = proto.graph.output[0].name
    axes = onnx.numpy_helper.from_array(np.asarray([0, 1], np.int64), "loss_axes")
    proto.graph.initializer.append(axes)
    proto.graph.node.append(helper.make_node("ReduceSum", [out, "loss_axes"], ["loss"], keepdims=0))
    del proto.graph.output[:]
    proto.graph.output.append(helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, []))
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, HERE / "skl_mlp.onnx")

    # The network by hand in float64 from the fitted coefficients: loss = sum(f(x)),
    # f = W3 relu(W2 relu(W1 x + b1) + b2) + b3; grad by backpropagation; the Hessian of a
    # piecewise-linear network is zero away from kinks.
    W, b = (
        [np.asarray(c, np.float64) for c in reg.coefs_],
        [np.asarray(c, np.float64) for c in reg.intercepts_],
    )

    def forward_backward(x: np.ndarray) -> tuple[float, np.ndarray]:
        z1 = x @ W[0] + b[0]
        a1 = np.maximum(z1, 0)
        z2 = a1 @ W[1] + b[1]
        a2 = np.maximum(z2, 0)
        out = a2 @ W[2] + b[2]
        d2 = np.ones_like(out) @ W[2].T * (z2 > 0)
        d1 = d2 @ W[1].T * (z1 > 0)
        return float(out.sum()), d1 @ W[0].T

    data = _inputs((5, 4), 3)
    loss, g = forward_backward(data["x"].astype(np.float64))
    per = [forward_backward(x.astype(np.float64)) for x in data["xs"]]
    _save(
        "skl_mlp",
        {
            **data,
            "loss": np.asarray(loss),
            "grad_x": g,
            "vmap_grad_x": np.stack([p[1] for p in per]),
            "hvp_x": np.zeros_like(g),
            "vmap_loss": np.asarray([p[0] for p in per]),
            "jvp_loss": np.asarray(np.sum(g * data["v"].astype(np.float64))),
        },
    )


if __name__ == "__main__":
    tf_cnn()
    tf_mlp()
    script_loop()
    skl_mlp()
    for p in sorted(HERE.glob("*.onnx")):
        print(p.name, p.stat().st_size, "bytes")
