"""jvp, vjp, grad, Hessian-vector products and per-example gradients of FlexAttention
(ai.onnx.preview), differentiated through its ONNX function body, which inlines the score_mod
and prob_mod subgraphs. Oracle: finite differences (float64) of that body inlined into the model
by ONNX's own inliner, independent of onnax's expansion code."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from oracles.ad_oracle import (
    Tol,
    check_grad,
    check_hvp,
    check_jvp,
    check_per_example_grad,
    check_vjp_dot,
    inline_function_op,
    make_ad_model,
    scalarize,
)
from oracles.vmap_oracle import assert_vmap_matches

D = TensorProto.DOUBLE
PREVIEW = "ai.onnx.preview"


def modifier(kind: str) -> onnx.GraphProto:
    """A score_mod/prob_mod subgraph: one rank-4 input, one output of the same shape."""
    x = helper.make_tensor_value_info("m_in", D, None)
    y = helper.make_tensor_value_info("m_out", D, None)

    def const(name: str, value: float) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, D, [], [value]))

    if kind == "soft-cap":  # cap * tanh(s / cap)
        nodes = [
            const("cap", 2.0),
            helper.make_node("Div", ["m_in", "cap"], ["scaled"]),
            helper.make_node("Tanh", ["scaled"], ["capped"]),
            helper.make_node("Mul", ["capped", "cap"], ["m_out"]),
        ]
    elif kind == "causal":  # -inf above the diagonal
        nodes = [
            helper.make_node("Shape", ["m_in"], ["shape"]),
            helper.make_node(
                "Constant", [], ["i2"], value=helper.make_tensor("i2", TensorProto.INT64, [], [2])
            ),
            helper.make_node(
                "Constant", [], ["i3"], value=helper.make_tensor("i3", TensorProto.INT64, [], [3])
            ),
            helper.make_node(
                "Constant", [], ["z"], value=helper.make_tensor("z", TensorProto.INT64, [], [0])
            ),
            helper.make_node(
                "Constant", [], ["o"], value=helper.make_tensor("o", TensorProto.INT64, [], [1])
            ),
            helper.make_node("Gather", ["shape", "i2"], ["L"]),
            helper.make_node("Gather", ["shape", "i3"], ["S"]),
            helper.make_node("Range", ["z", "L", "o"], ["q"]),
            helper.make_node("Range", ["z", "S", "o"], ["k"]),
            helper.make_node("Unsqueeze", ["q", "o"], ["q_col"]),
            helper.make_node("GreaterOrEqual", ["q_col", "k"], ["keep"]),
            const("neg_inf", -np.inf),
            helper.make_node("Where", ["keep", "m_in", "neg_inf"], ["m_out"]),
        ]
    else:  # "dropout-like" prob_mod: a fixed rescaling
        nodes = [const("s", 0.75), helper.make_node("Mul", ["m_in", "s"], ["m_out"])]
    return helper.make_graph(nodes, kind, [x], [y])


def flex_model(q_heads: int, kv_heads: int, seq_q: int, seq_kv: int, **attrs) -> onnx.ModelProto:
    head = 4
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain=PREVIEW, **attrs)
    specs = [
        ("Q", D, [2, q_heads, seq_q, head]),
        ("K", D, [2, kv_heads, seq_kv, head]),
        ("V", D, [2, kv_heads, seq_kv, 3]),
    ]
    return make_ad_model(
        [node], specs, [("Y", D, [2, q_heads, seq_q, 3])], opset=26, extra_opsets={PREVIEW: 1}
    )


@dataclass
class Case:
    id: str
    model: onnx.ModelProto


CASES = [
    Case("plain", flex_model(2, 2, 3, 4)),
    Case("scaled", flex_model(2, 2, 3, 4, scale=0.3)),
    Case("grouped-query", flex_model(4, 2, 3, 5)),
    Case("soft-cap", flex_model(2, 2, 3, 4, score_mod=modifier("soft-cap"))),
    Case("causal", flex_model(2, 1, 4, 4, score_mod=modifier("causal"))),
    Case("prob-mod", flex_model(2, 2, 3, 4, prob_mod=modifier("rescale"))),
]
IDS = [c.id for c in CASES]
INPUTS = ["Q", "K", "V"]


def loss_pair(m: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(the model with a scalar loss, the same for the inlined oracle)."""
    return scalarize(m), scalarize(inline_function_op(m))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jvp(case: Case) -> None:
    check_jvp(case.model, INPUTS, oracle_model=inline_function_op(case.model))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_vjp_dot(case: Case) -> None:
    check_vjp_dot(case.model, INPUTS)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grad(case: Case) -> None:
    loss, oracle = loss_pair(case.model)
    check_grad(loss, INPUTS, "ad_loss", oracle_model=oracle)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hvp(case: Case) -> None:
    loss, oracle = loss_pair(case.model)
    check_hvp(loss, ["Q", "V"], INPUTS, "ad_loss", oracle_model=oracle, tol=Tol(1e-4, 1e-5))


@pytest.mark.parametrize("case", CASES[:4], ids=IDS[:4])
def test_per_example_grad(case: Case) -> None:
    loss, _ = loss_pair(case.model)
    check_per_example_grad(loss, (0, 0, 0), INPUTS, "ad_loss")


def first_output(outputs: dict[str, Any] | list[Any]) -> Any:
    """The first output of ReferenceEvaluator.run (a list without intermediate results)."""
    assert isinstance(outputs, list)
    return outputs[0]


def test_oracle_matches_the_op() -> None:
    # The inlined body computes the op (reference evaluator, which knows the preview op).
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(0)
    for case in CASES:
        feeds = {
            i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
            for i in case.model.graph.input
        }
        a = first_output(ReferenceEvaluator(case.model).run(None, feeds))
        b = first_output(ReferenceEvaluator(inline_function_op(case.model)).run(None, feeds))
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=case.id)


@pytest.mark.parametrize(
    "in_axes", [(0, 0, 0), (0, None, None), (None, 1, 0)], ids=["all", "queries", "keys-values"]
)
@pytest.mark.parametrize("case", [CASES[2], CASES[4]], ids=[CASES[2].id, CASES[4].id])
def test_vmap_is_vectorized(case: Case, in_axes: tuple[int | None, ...]) -> None:
    # The vmap batch merges into the op's batch N (no per-example Scan, so no warning), against
    # a loop over the examples.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vm = assert_vmap_matches(case.model, in_axes, 0, rtol=1e-9, atol=1e-9)
    assert "Scan" not in [n.op_type for n in vm.graph.node]
