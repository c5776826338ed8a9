"""Regression tests for the two onnax bugs the real-model corpus (conformance/corpus) found.

* Reverse mode of ``Conv`` with ``auto_pad=SAME_UPPER`` / ``SAME_LOWER`` (Flax's
  ``padding="SAME"``) was refused; pads are now computed (at run time when sizes are symbolic).
* ``vmap(grad(f))`` failed when ``f`` has a symbolic batch: the gradient's run-time
  unbroadcast ``ReduceSum`` had no rank for vmap; it is now declared as value_info.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from ad_oracle import check_grad, check_per_example_grad, check_vjp_dot, make_ad_model, normal
from onnx import TensorProto
from vmap_oracle import node

D = TensorProto.DOUBLE
CORPUS = Path(__file__).resolve().parents[2] / "conformance" / "corpus" / "models"


def conv_same(mode: str, x_shape: tuple[int, ...], strides: list[int]) -> onnx.ModelProto:
    w_shape = (3, x_shape[1], 3, 2)  # a non-square kernel: the two axes pad differently
    return make_ad_model(
        [
            node("Conv", ["x", "w"], ["y"], auto_pad=mode, strides=strides),
            node("Mul", ["y", "y"], ["sq"]),
            node("ReduceSum", ["sq"], ["loss"], keepdims=0),
        ],
        [("x", D, list(x_shape)), ("w", D, list(w_shape))],
        ["loss", "y"],
    )


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize(("x_shape", "strides"), [((1, 2, 5, 6), [1, 1]), ((2, 1, 5, 7), [2, 2])])
def test_conv_same_padding_reverse_mode(
    onnax, mode: str, x_shape: tuple[int, ...], strides: list[int]
) -> None:
    model = conv_same(mode, x_shape, strides)
    check_grad(model, inputs=["x", "w"], output="loss")
    check_vjp_dot(model, inputs=["x", "w"], outputs=["y"])


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_same_padding_with_symbolic_spatial_sizes(onnax, mode: str) -> None:
    """SAME pads are computed at run time, so a symbolic image height differentiates too."""
    model = make_ad_model(
        [
            node("Conv", ["x", "w"], ["y"], auto_pad=mode, strides=[2, 1]),
            node("Mul", ["y", "y"], ["sq"]),
            node("ReduceSum", ["sq"], ["loss"], keepdims=0),
        ],
        [("x", D, [1, 1, "h", 4]), ("w", D, [1, 1, 3, 3])],
        ["loss", "y"],
    )
    gens = {"x": normal((1, 1, 5, 4))}
    check_grad(model, inputs=["x", "w"], output="loss", gens=gens)
    check_vjp_dot(model, inputs=["x", "w"], outputs=["y"], gens=gens)


def test_per_example_grad_with_symbolic_batch(onnax) -> None:
    """The corpus's jax2onnx MLP (batch ``B`` symbolic, MSE loss): vmap over examples of such
    batches of its parameter gradient, against a loop of the gradient model."""
    model = onnx.load(CORPUS / "jax_mlp.onnx")
    params = [t.name for t in model.graph.initializer if len(t.dims) > 0]
    gens = {"x": normal((4, 8)), "y": normal((4, 4))}
    check_per_example_grad(model, in_axes=(0, 0), inputs=params, output="loss", gens=gens)
