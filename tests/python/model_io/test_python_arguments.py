"""Hostile or mistaken Python arguments get a clear error, never the model's bytes.

pybind11 reports an argument it cannot convert by printing every argument, the serialized model
included (tensor contents in an error message); an int beyond 64 bits or a name with a NUL
character must be refused in Python first, and any conversion error that still reaches pybind11
is cut before its argument dump.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from oracles.training_oracle import run

HUGE = 2**70
SECRET = 1234.5678  # a weight value whose bytes must never appear in a message


def model() -> onnx.ModelProto:
    w = onnx.numpy_helper.from_array(np.full(3, SECRET, np.float32), "w")
    graph = h.make_graph(
        [h.make_node("Mul", ["x", "w"], ["y"]), h.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [3])],
        [h.make_tensor_value_info("loss", T.FLOAT, [])],
        initializer=[w],
    )
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    m.ir_version = 10
    return m


CASES: dict[str, tuple[Callable[[onnx.ModelProto], Any], type[Exception], str]] = {
    "in_axes int": (lambda m: onnax.vmap(m, in_axes=HUGE), ValueError, "in_axes is"),
    "in_axes list": (lambda m: onnax.vmap(m, in_axes=[HUGE]), ValueError, r"in_axes\[0\] is"),
    "in_axes mapping": (lambda m: onnax.vmap(m, in_axes={"x": -HUGE}), ValueError, r"in_axes\['x'\] is"),
    "out_axes": (lambda m: onnax.vmap(m, out_axes=HUGE), ValueError, r"out_axes\[0\] is"),
    "axis_name": (lambda m: onnax.vmap(m, axis_name="b\x00atch"), ValueError, "NUL"),
    "grad inputs": (lambda m: onnax.grad(m, inputs=["x\x00"]), ValueError, "NUL"),
    "grad output": (lambda m: onnax.grad(m, output="loss\x00"), ValueError, "NUL"),
    "jvp outputs": (lambda m: onnax.jvp(m, outputs=["\x00"]), ValueError, "NUL"),
    "convert_opset": (lambda m: onnax.convert_opset(m, HUGE), ValueError, "target is"),
    "select_params": (
        lambda m: onnax.select_params(m, min_size=HUGE),
        TypeError,
        "incompatible function arguments",
    ),
    "add_loss": (
        lambda m: onnax.add_loss(m, "mse", class_axis=HUGE),
        TypeError,
        "incompatible function arguments",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_arguments_are_refused_without_the_models_bytes(case: str) -> None:
    call, kind, pattern = CASES[case]
    m = model()
    with pytest.raises(kind, match=pattern) as info:
        call(m)
    message = str(info.value)
    assert "Invoked with" not in message and "\\x" not in message.replace("\\x00", ""), message
    assert np.float32(SECRET).tobytes().hex() not in message.encode().hex(), message
    assert len(message) < 600, message
    # The model is still fine for a correct call: d sum(x * w) / dx = w, by ONNX Runtime.
    got = run(onnax.grad(m, inputs=["x"]), {"x": np.ones(3, np.float32)})
    np.testing.assert_allclose(got["x_grad"], np.full(3, SECRET, np.float32))
