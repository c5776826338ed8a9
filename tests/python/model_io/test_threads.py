"""Transforms from several Python threads at once: the binding releases the GIL while the core
works (other threads run meanwhile) and takes it back for notices, which then still reach the
calling thread's warnings. Results must be what one thread alone computes."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import onnax
import onnx
from onnx import TensorProto as T
from onnx import helper as h


def chain(opset: int, length: int = 200) -> onnx.ModelProto:
    """loss = sum(tanh(...tanh(x * w)...)): `length` Tanh nodes (opset 13 makes a notice)."""
    nodes = [h.make_node("Mul", ["x", "w"], ["t0"])]
    for k in range(length):
        nodes.append(h.make_node("Tanh", [f"t{k}"], [f"t{k + 1}"]))
    nodes.append(h.make_node("ReduceSum", [f"t{length}"], ["loss"], keepdims=0))
    graph = h.make_graph(
        nodes,
        "chain",
        [h.make_tensor_value_info("x", T.FLOAT, [4]), h.make_tensor_value_info("w", T.FLOAT, [4])],
        [h.make_tensor_value_info("loss", T.FLOAT, [])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def transform(m: onnx.ModelProto) -> bytes:
    return onnax.vmap(onnax.grad(m), in_axes=0).SerializeToString()


def test_concurrent_transforms_match_a_single_thread() -> None:
    models = [chain(13), chain(18)] * 4
    with warnings.catch_warnings(record=True) as alone:
        warnings.simplefilter("always")
        expected = [transform(m) for m in models[:2]] * 4
    results: list[bytes] = [b""] * len(models)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = transform(models[i])
        except BaseException as e:  # (reported below)
            errors.append(e)

    # (catch_warnings is process-wide: the notices of every thread arrive here.)
    with warnings.catch_warnings(record=True) as together:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(models))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    assert not errors, errors
    assert results == expected  # byte-identical, whatever ran beside it
    upgraded = [w for w in together if "upgraded the model from ai.onnx opset 13" in str(w.message)]
    assert len(upgraded) == 4 * len([w for w in alone if "upgraded the model" in str(w.message)]) > 0

    from oracles.training_oracle import run

    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    w = np.full((3, 4), 0.5, np.float32)
    got = run(onnx.load_from_string(results[1]), {"x": x, "w": w})["x_grad"]
    y = x.astype(np.float64) * 0.5
    d = np.full_like(y, 0.5)
    for _ in range(200):
        y = np.tanh(y)
        d = d * (1 - y**2)
    np.testing.assert_allclose(got, d, rtol=1e-4, atol=1e-7)  # (float32 through 200 steps)
