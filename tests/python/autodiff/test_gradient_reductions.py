"""How reverse mode sums cotangents: as few passes over an activation as the math needs.

ONNX Runtime's ReduceSum over a leading axis of size 1 (batch 1) is a slow copy: on a ResNet-50
activation it took 20x a ReduceSum over all of N, H, W at once. Three things keep gradients of
convolutional models from paying it:

- a broadcast operand's cotangent (a per-channel scale or bias) is summed over the leading and
  the broadcast axes in one ReduceSum, and a leading axis of static size 1 is squeezed, not
  summed;
- a cotangent takes the facts of the value it belongs to, so a cotangent whose own computation
  lost its static dims (a crop by pads computed at run time) is not summed over a size-1 axis
  "in case it is a broadcast";
- the same computation emitted twice is emitted once (BatchNormalization's bias and mean
  gradients both sum the output's cotangent).

Every case is checked against float64 finite differences of the source (ad_oracle.check_grad)
and counts the ReduceSum nodes, which the build before 6a63dd0 exceeded in each case.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from oracles import ad_oracle as ad
from oracles.vmap_oracle import node

D = TensorProto.DOUBLE
C, HW = 3, 4


def reduce_sums(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "ReduceSum"]


def summed_twice(model: onnx.ModelProto) -> list[str]:
    """ReduceSum nodes reading another ReduceSum's output (two passes where one would do)."""
    made_by_sum = {o for n in reduce_sums(model) for o in n.output}
    return [n.name for n in reduce_sums(model) if n.input[0] in made_by_sum]


@pytest.mark.parametrize("batch", [1, 2, "N"])
def test_channel_scale_and_bias_take_one_sum_each(batch: Any) -> None:
    """loss = sum(tanh(x * s + unsqueeze(b))^2) for x [N, C, H, W], s [C, 1, 1], b [C]."""
    nodes = [
        node("Mul", ["x", "s"], ["xs"]),
        node("Unsqueeze", ["b", "hw_axes"], ["b3"]),
        node("Add", ["xs", "b3"], ["y"]),
        node("Tanh", ["y"], ["z"]),
        node("Mul", ["z", "z"], ["sq"]),
        node("ReduceSum", ["sq"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(0)
    model = ad.make_ad_model(
        nodes,
        [("x", D, [batch, C, HW, HW])],
        ["loss"],
        initializers={
            "s": rng.normal(size=(C, 1, 1)),
            "b": rng.normal(size=C) / 2,
            "hw_axes": np.array([1, 2], np.int64),
        },
    )
    n = 1 if batch == 1 else 2
    gm = ad.check_grad(model, inputs=["x", "s", "b"], output="loss", gens={"x": ad.normal([n, C, HW, HW])})
    assert summed_twice(gm) == []
    # The loss's own, then one per parameter.
    assert len(reduce_sums(gm)) == 3, [n.name for n in reduce_sums(gm)]


@pytest.mark.parametrize("batch", [1, "N"])
def test_bias_of_a_batch_of_one_is_squeezed(batch: Any) -> None:
    """loss = sum(sin(x @ W + b)) for x [N, F], b [H]: with N = 1 nothing is summed."""
    nodes = [
        node("MatMul", ["x", "W"], ["xw"]),
        node("Add", ["xw", "b"], ["y"]),
        node("Sin", ["y"], ["z"]),
        node("ReduceSum", ["z"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(1)
    model = ad.make_ad_model(
        nodes,
        [("x", D, [batch, 4])],
        ["loss"],
        initializers={"W": rng.normal(size=(4, 5)), "b": rng.normal(size=5)},
    )
    gm = ad.check_grad(model, inputs=["W", "b"], output="loss", gens={"x": ad.normal([1, 4])})
    # With a static batch of 1 the bias's cotangent is the output's, squeezed; a symbolic batch
    # is summed.
    assert len(reduce_sums(gm)) == (1 if batch == 1 else 2), [n.name for n in reduce_sums(gm)]


def test_cotangent_of_a_run_time_crop_keeps_its_value_dims() -> None:
    """A SAME-padded Conv's input cotangent is cropped by pads computed at run time, so its own
    facts lose the static dims; the Relu before it must still not sum over the batch of 1."""
    nodes = [
        node("Conv", ["x", "W1"], ["c1"], auto_pad="SAME_UPPER", kernel_shape=[3, 3]),
        node("Relu", ["c1"], ["r"]),
        node("Conv", ["r", "W2"], ["c2"], auto_pad="SAME_UPPER", kernel_shape=[3, 3]),
        node("Mul", ["c2", "c2"], ["sq"]),
        node("ReduceSum", ["sq"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(2)
    model = ad.make_ad_model(
        nodes,
        [("x", D, [1, 2, 5, 5])],
        ["loss"],
        initializers={"W1": rng.normal(size=(C, 2, 3, 3)) / 3, "W2": rng.normal(size=(2, C, 3, 3)) / 3},
    )
    gens = {"x": ad.normal([1, 2, 5, 5])}
    gm = ad.check_grad(model, inputs=["x", "W1", "W2"], output="loss", gens=gens)
    # The loss's own ReduceSum is the only one: no Conv here has a bias.
    assert len(reduce_sums(gm)) == 1, [n.name for n in reduce_sums(gm)]


@pytest.mark.parametrize("batch", [1, 3])
def test_batch_norm_parameters_share_the_output_cotangent_sum(batch: int) -> None:
    """Inference-mode BatchNormalization, gradients w.r.t. scale, bias, mean and variance: the
    bias's and the mean's both sum the output's cotangent over N, H, W; it is summed once."""
    nodes = [
        node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-3),
        node("Sin", ["y"], ["z"]),
        node("ReduceSum", ["z"], ["loss"], keepdims=0),
    ]
    rng = np.random.default_rng(3)
    model = ad.make_ad_model(
        nodes,
        [("x", D, [batch, C, HW, HW])],
        ["loss"],
        initializers={
            "scale": rng.normal(size=C),
            "bias": rng.normal(size=C),
            "mean": rng.normal(size=C) / 4,
            "var": rng.uniform(0.5, 2.0, size=C),
        },
    )
    gm = ad.check_grad(
        model,
        inputs=["x", "scale", "bias", "mean", "var"],
        output="loss",
        gens={"x": ad.normal([batch, C, HW, HW])},
    )
    assert summed_twice(gm) == []
    # The loss's own, then scale (cotangent x normalized input), bias = -mean / std (one sum of
    # the cotangent) and variance.
    assert len(reduce_sums(gm)) == 4, [n.name for n in reduce_sums(gm)]
