"""jvp, vjp, grad and Hessian-vector products of LinearAttention through its ONNX function body
(a Scan that reads the function's constants), against finite differences of that body inlined
into the model (an oracle independent of onnax's expansion code). The inlined model itself is
differentiated too: its Scan body unsqueezes by axes it reads from the enclosing graph, which
reverse mode needs the values of to know the body's ranks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from oracles.ad_oracle import (
    Tol,
    check_grad,
    check_hvp,
    check_jvp,
    check_vjp_dot,
    inline_function_op,
    make_ad_model,
    scalarize,
    uniform,
)

D = TensorProto.DOUBLE
SHAPE = (1, 3, 8)


def model(rule: str) -> onnx.ModelProto:
    extra = "decay" if rule == "gated" else "beta"
    inputs = (
        ["query", "key", "value", "", "decay"]
        if extra == "decay"
        else ["query", "key", "value", "", "", "beta"]
    )
    node = helper.make_node(
        "LinearAttention", inputs, ["y", "state"], q_num_heads=2, kv_num_heads=2, update_rule=rule
    )
    extra_shape = SHAPE if extra == "decay" else (1, 3, 2)
    specs = [(n, D, list(SHAPE)) for n in ("query", "key", "value")] + [(extra, D, list(extra_shape))]
    return make_ad_model([node], specs, [("y", D, None), ("state", D, None)], opset=27)


def inlined(m: onnx.ModelProto) -> onnx.ModelProto:
    return inline_function_op(m)


RULES = ["gated", "delta"]


def gens(rule: str) -> dict:
    return {"decay": uniform(SHAPE, 0.2, 0.9)} if rule == "gated" else {"beta": uniform((1, 3, 2), 0.2, 0.9)}


@pytest.mark.parametrize("rule", RULES)
def test_jvp(rule: str) -> None:
    m = model(rule)
    inputs = [i.name for i in m.graph.input]
    # The body rounds through float32 (its scale): a step of 1e-3 keeps that rounding out of the
    # differences, and the tolerance allows their truncation error.
    check_jvp(m, inputs, gens=gens(rule), oracle_model=inlined(m), eps=1e-3, tol=Tol(2e-3, 1e-3))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("form", ["op", "inlined"])
def test_vjp_dot(rule: str, form: str) -> None:
    m = model(rule) if form == "op" else inlined(model(rule))
    check_vjp_dot(m, [i.name for i in m.graph.input], gens=gens(rule))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("form", ["op", "inlined"])
def test_grad(rule: str, form: str) -> None:
    m = model(rule)
    oracle = scalarize(inlined(m), gens(rule))
    loss = scalarize(m if form == "op" else inlined(m), gens(rule))
    inputs = [i.name for i in m.graph.input]
    check_grad(loss, inputs, "ad_loss", gens=gens(rule), oracle_model=oracle, eps=1e-3, tol=Tol(2e-3, 1e-3))


@pytest.mark.parametrize("rule", RULES)
def test_hvp(rule: str) -> None:
    m = model(rule)
    loss, oracle = scalarize(m, gens(rule)), scalarize(inlined(m), gens(rule))
    inputs = [i.name for i in m.graph.input]
    # (float32 inside the body, as in test_jvp: a step of 1e-3)
    check_hvp(
        loss,
        ["query", "key"],
        inputs,
        "ad_loss",
        gens=gens(rule),
        oracle_model=oracle,
        eps=1e-3,
        tol=Tol(2e-3, 1e-3),
    )


def test_oracle_matches_the_op() -> None:
    m = model("gated")
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(SHAPE) for k in ("query", "key", "value")}
    feeds["decay"] = rng.uniform(0.2, 0.9, SHAPE)
    from oracles.vmap_oracle import run_model

    for a, b in zip(run_model(m, feeds), run_model(inlined(m), feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
