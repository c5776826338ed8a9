"""Reverse mode through a Loop: weights' gradients and the dims of loop-carried state.

Two properties of the reverse loop, each checked by structure (it fails without the feature) and
by numbers (the ``ad_oracle`` battery: jvp and grad against float64 central differences, vjp by
the dot-product test, HVP against differences of the gradient, per-example gradients against a
loop of ``grad``):

* A weight every iteration reads gets its gradient as one matrix product over the sequence after
  the loop (``X^T dY``: the per-iteration factors are stacked by the reverse loop), not a
  weight-sized product added to an accumulator at every step. Cases cover the three factor forms
  (``x_t^T dy_t`` of a batched state, the outer product of a vector state, and a weight on the
  left, ``dy_t x_t^T``), a state of rank 3, a Gemm of the transposed weight (whose transposes
  cancel), two products per step, a symbolic batch, early exit and zero iterations; a state
  that grows is refused in reverse mode.
* The loop-carried state has static dims inside the bodies when the loop keeps them, so
  unbroadcasting a cotangent needs no run-time test at every step: the reverse body of an RNN op
  holds no ``Compress`` / ``Equal``, while a state that grows keeps only its rank.
* The reverse body does not run the forward step again: the values it reads (activations and
  their derivatives) are stacked by the stacking loop, which computes them anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto, helper
from oracles.ad_oracle import ADGen, battery, check_grad, check_jvp, make_ad_model, make_feeds, normal, run
from test_autodiff_control_flow import body, const, loss_of, vi
from test_autodiff_recurrent import BATCH, IN, Spec, op_model, oracle_model

D = TensorProto.DOUBLE
I64 = TensorProto.INT64
B = TensorProto.BOOL
T_STEPS = 4


def recurrence(
    trips: int,
    state: Sequence[Any],
    weight_left: bool = False,
    grows: bool = False,
    variant: str = "",
) -> onnx.ModelProto:
    """h_{t+1} = tanh(h_t W + xs[t]) (or W h_t + xs[t] with `weight_left`), W [3, 3] an
    initializer read from the enclosing graph, xs carried and gathered by the iteration number.
    With `grows`, a second state appends h_{t+1} to itself every iteration (its length changes).
    Variants: "twice" adds (h_t * h_t) W (two products with W per step), "gemm" computes h_t W
    with Gemm(transB) of W^T, "early-exit" stops after three iterations (the condition is
    computed in the body; "early-exit-no-condition" with no condition input), "stacked" also
    stacks h_{t+1} as a scan output `hs`, a model output that the loss reads, "bias" adds an
    initializer b [3] to h_t W (broadcast over a batched state)."""
    matmul = ["W", "h_in"] if weight_left else ["h_in", "W"]
    step = [helper.make_node("MatMul", matmul, ["hw"])]
    if variant == "gemm":
        step = [
            helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
            helper.make_node("Gemm", ["h_in", "Wt"], ["hw"], transB=1),
        ]
    if variant == "bias":
        step = [
            helper.make_node("MatMul", matmul, ["hw0"]),
            helper.make_node("Add", ["hw0", "b"], ["hw"]),
        ]
    if variant == "twice":
        step = [
            helper.make_node("MatMul", ["h_in", "W"], ["hw1"]),
            helper.make_node("Mul", ["h_in", "h_in"], ["hh"]),
            helper.make_node("MatMul", ["hh", "W"], ["hw2"]),
            helper.make_node("Add", ["hw1", "hw2"], ["hw"]),
        ]
    cond = [helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    if variant.startswith("early-exit"):
        cond = [const("two", 2, I64), helper.make_node("Less", ["it", "two"], ["cond_out"])]
    nodes = [
        helper.make_node("Gather", ["xs_in", "it"], ["xt"], axis=0),
        *step,
        helper.make_node("Add", ["hw", "xt"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_out"]),
        helper.make_node("Identity", ["xs_in"], ["xs_out"]),
        *cond,
    ]
    seq = [T_STEPS, *state]
    ins = [vi("it", I64, []), vi("cond_in", B, []), vi("h_in", D, state), vi("xs_in", D, seq)]
    outs = [vi("cond_out", B, []), vi("h_out", D, state), vi("xs_out", D, seq)]
    # (Without a condition input, the body's computed condition still stops the loop.)
    loop_in = ["M", "" if variant == "early-exit-no-condition" else "c0", "h0", "xs"]
    loop_out, losses = ["hT", "xsT"], ["hT"]
    outputs: list[Any] = [("loss", D, []), "hT"]
    if variant == "stacked":
        nodes.append(helper.make_node("Identity", ["h_out"], ["h_row"]))
        outs.append(vi("h_row", D, state))
        loop_out.append("hs")
        losses.append("hs")
        outputs.append("hs")
    if grows:
        nodes.append(helper.make_node("Concat", ["acc_in", "h_out"], ["acc_out"], axis=0))
        ins.append(vi("acc_in", D, None))
        outs.append(vi("acc_out", D, None))
        loop_in.append("acc0")
        loop_out.append("accT")
        losses.append("acc_sq")
    g = [
        const("M", trips, I64),
        const("c0", True, B),
        helper.make_node("Loop", loop_in, loop_out, body=body(nodes, ins, outs)),
    ]
    if grows:
        g.append(helper.make_node("Mul", ["accT", "accT"], ["acc_sq"]))
    g += loss_of(*losses)
    inputs = [("h0", D, state), ("xs", D, seq)]
    if grows:
        inputs.append(("acc0", D, state))
    rng = np.random.default_rng(11)
    initializers = {"W": rng.standard_normal((3, 3)) * 0.5}
    if variant == "bias":
        initializers["b"] = rng.standard_normal(3) * 0.5
    return make_ad_model(g, inputs, outputs, initializers=initializers)


@dataclass
class Case:
    id: str
    model: onnx.ModelProto
    inputs: list[str]
    in_axes: tuple[int | None, ...]
    gens: Mapping[str, ADGen] = field(default_factory=dict)
    products: int = 1  # weight products the reverse loop hands out (stacked factor pairs)


CASES = [
    Case("vector-state", recurrence(T_STEPS, [3]), ["h0", "xs", "W"], (0, 0)),
    Case("batched-state", recurrence(T_STEPS, [2, 3]), ["h0", "xs", "W"], (0, 0)),
    Case("weight-on-the-left", recurrence(T_STEPS, [3, 2], weight_left=True), ["h0", "xs", "W"], (0, 0)),
    Case(
        "symbolic-batch",
        recurrence(T_STEPS, ["N", 3]),
        ["h0", "xs", "W"],
        (0, 0),
        gens={"h0": normal((2, 3)), "xs": normal((T_STEPS, 2, 3))},
    ),
    Case("zero-iterations", recurrence(0, [2, 3]), ["h0", "xs", "W"], (0, 0)),
    Case(
        "two-products-per-step",
        recurrence(T_STEPS, [2, 3], variant="twice"),
        ["h0", "xs", "W"],
        (0, 0),
        products=2,
    ),
    Case("early-exit", recurrence(T_STEPS, [2, 3], variant="early-exit"), ["h0", "xs", "W"], (0, 0)),
    Case(
        "early-exit-no-condition",
        recurrence(T_STEPS, [2, 3], variant="early-exit-no-condition"),
        ["h0", "xs", "W"],
        (0, 0),
    ),
    Case("gemm-step", recurrence(T_STEPS, [2, 3], variant="gemm"), ["h0", "xs", "W"], (0, 0)),
    Case("rank-3-state", recurrence(T_STEPS, [2, 2, 3]), ["h0", "xs", "W"], (0, 0)),
    Case("stacked-output", recurrence(T_STEPS, [2, 3], variant="stacked"), ["h0", "xs", "W"], (0, 0)),
    Case("bias-vector-state", recurrence(T_STEPS, [3], variant="bias"), ["h0", "xs", "W", "b"], (0, 0)),
    Case("bias-batched-state", recurrence(T_STEPS, [2, 3], variant="bias"), ["h0", "xs", "W", "b"], (0, 0)),
]
IDS = [c.id for c in CASES]

test_jvp, test_vjp_dot, test_grad, test_hvp, test_per_example_grad = battery(
    CASES, IDS, inputs=lambda c: c.inputs, hvp_wrt=lambda c: ["W"], per_example_axes=lambda c: c.in_axes
)


def _loop_bodies(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    out = []
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out.append(a.g)
                out += _loop_bodies(a.g)
    return out


def _reverse_loop(model: onnx.ModelProto) -> onnx.NodeProto:
    loops = [n for n in model.graph.node if n.op_type == "Loop"]
    return loops[-1]


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.products >= 0], ids=[c.id for c in CASES if c.products >= 0]
)
def test_weight_gradient_is_one_product_after_the_loop(case: Case) -> None:
    g = onnax.grad(case.model, inputs=["W"], output="loss")
    reverse = _reverse_loop(g)
    rev_body = reverse.attribute[0].g
    # The reverse loop's state is the cotangent of h only: W's cotangent would pass through
    # unchanged (its products leave the loop), so it is not carried. Its scan outputs are the
    # two stacked factors of W's product.
    states = len(reverse.input) - 2
    assert states == 1, [i.name for i in rev_body.input]
    assert len(reverse.output) - states == 2 * case.products, [o.name for o in rev_body.output]
    # No Identity per iteration for a value the body can read directly.
    assert "Identity" not in [
        n.op_type for n in rev_body.node if n.output[0] not in {o.name for o in rev_body.output}
    ]
    # Inside: the cotangent of h (dy W^T) only, nothing weight-sized, and no forward step
    # recomputed (h W and tanh: the stacking loop stacked tanh's derivative).
    ops = [n.op_type for n in rev_body.node]
    assert ops.count("MatMul") == 1 and "Tanh" not in ops, ops
    # After it: the product over the sequence, whose result is the gradient.
    after = list(g.graph.node).index(reverse)
    assert "MatMul" in [n.op_type for n in g.graph.node[after + 1 :]]
    onnx.checker.check_model(g, full_check=True)
    check_grad(case.model, ["W"], "loss", gens=case.gens)


def test_per_example_weight_gradients_match_a_loop_of_grads() -> None:
    # vmap(grad) of the vector recurrence: B examples' W gradients from the batched product
    # (a batched MatMul over [B, 3, T] x [B, T, 3]) equal B separate gradients.
    model = recurrence(T_STEPS, [3])
    g = onnax.grad(model, inputs=["W"], output="loss")
    vg = onnax.vmap(g, in_axes=[0, 0])
    rng = np.random.default_rng(3)
    h0 = rng.standard_normal((5, 3))
    xs = rng.standard_normal((5, T_STEPS, 3))
    batched = run(vg, {"h0": h0, "xs": xs})["W_grad"]
    for i in range(5):
        single = run(g, {"h0": h0[i], "xs": xs[i]})["W_grad"]
        np.testing.assert_allclose(batched[i], single, rtol=1e-12, atol=1e-12)


def recurrent_op(op: str, batch: Any) -> onnx.ModelProto:
    """test_autodiff_recurrent's model of one RNN/GRU/LSTM op (float32, weights as
    initializers), its batch made symbolic when `batch` is a name."""
    model = op_model(Spec(op))
    if isinstance(batch, str):
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = batch
    return model


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("batch", [BATCH, "N"])
def test_reverse_body_of_a_recurrent_op_has_static_shapes(op: str, batch: Any) -> None:
    # The recurrence keeps its state's shape, so the reverse body knows it: no Shape / Equal /
    # Compress deciding at every step which axes a cotangent was broadcast along. And the
    # gradient still matches float64 central differences of the float32 model.
    # Nor does the reverse body run the cell forward again: the stacking loop stacks the
    # activations (and their derivatives) the reverse body reads.
    model = recurrent_op(op, batch)
    g = onnax.grad(model, inputs=["W", "R", "B"], output="loss")
    for b in _loop_bodies(g.graph):
        ops = [n.op_type for n in b.node]
        assert "Compress" not in ops and "Equal" not in ops, (op, ops)
    reverse_ops = [n.op_type for n in _reverse_loop(g).attribute[0].g.node]
    # (Products with R^T for the state's cotangent: GRU applies R in two parts, around its
    # reset gate.)
    matmuls = {"RNN": 1, "GRU": 2, "LSTM": 1}[op]
    assert not {"Sigmoid", "Tanh"} & set(reverse_ops) and reverse_ops.count("MatMul") == matmuls, reverse_ops
    if batch == BATCH:
        # The op computes its outputs; its expansion's loop is needed in reverse mode only for
        # the shapes of its outputs, which the builder infers (a known trip count, a state that
        # keeps its dims): the stacking and reverse loops run, and no run-time shape. (Before,
        # LSTM ran its expansion's forward loop just to feed Shape nodes.) With a symbolic batch
        # the trip count is still a constant (a Gather of the input's static length).
        top = [n.op_type for n in g.graph.node]
        assert top.count("Loop") == 2 and "Shape" not in top, top
    constants = {n.output[0] for n in g.graph.node if n.op_type == "Constant"}
    assert all(n.input[0] in constants for n in g.graph.node if n.op_type == "Loop")
    # (Against central differences of test_autodiff_recurrent's float64 unrolled oracle:
    # ONNX Runtime has no float64 RNN/GRU/LSTM.)
    check_grad(
        model,
        ["W", "R", "B"],
        "loss",
        gens={"X": normal((T_STEPS, BATCH, IN))},
        oracle_model=oracle_model(Spec(op)),
    )


def test_growing_state_keeps_only_its_rank_inside_the_body() -> None:
    # The appended state changes length every iteration: the JVP body must not claim a static
    # length for it (ONNX Runtime would reject the declared shape), while h keeps [3].
    model = recurrence(T_STEPS, [3], grows=True)
    check_jvp(model, ["W", "acc0"])
    j = onnax.jvp(model, inputs=["W", "acc0"])
    # (One loop: the JVP loop computes the primal outputs too, so the source loop is gone.)
    (jvp_body,) = _loop_bodies(j.graph)
    declared = {v.name: v.type.tensor_type.shape.dim for v in list(jvp_body.input) + list(jvp_body.output)}
    assert any(n.startswith("h_in") and [d.dim_value for d in dims] == [3] for n, dims in declared.items())
    for name, dims in declared.items():
        if name.startswith("acc"):
            assert not any(d.HasField("dim_value") for d in dims), name


def test_reverse_mode_through_a_growing_state_is_refused_clearly() -> None:
    # Reverse mode stacks the state of every iteration; a state whose length changes cannot be
    # stacked. Before, the gradient failed inside ONNX Runtime ("Inconsistent shape in loop
    # output"); now the transform says so, with the shapes and a fix.
    model = recurrence(T_STEPS, [3], grows=True)
    check_jvp(model, ["W", "acc0"])  # (forward mode differentiates it: against differences)
    with pytest.raises(
        onnax.OnnaxError, match=r"changes shape from one iteration to the next \(from \[3\] to \[6\]\)"
    ):
        onnax.grad(model, inputs=["W"], output="loss")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_mode_runs_the_loop_once(case: Case) -> None:
    # The JVP loop computes the primal outputs as well, so jvp's result runs one loop, not the
    # source loop beside it; the primal outputs still match the source model, and the tangents
    # float64 central differences.
    j = onnax.jvp(case.model, inputs=case.inputs)
    assert [n.op_type for n in j.graph.node].count("Loop") == 1
    check_jvp(case.model, case.inputs, gens=case.gens)
    feeds = make_feeds(case.model, case.gens, np.random.default_rng(2))
    tangents = {f"{k}_tangent": np.ones_like(v) for k, v in feeds.items() if k in case.inputs}
    for t in case.model.graph.initializer:
        if t.name in case.inputs:
            tangents[f"{t.name}_tangent"] = np.ones(tuple(t.dims))
    got = run(j, {**feeds, **tangents})
    want = run(case.model, feeds)
    for name in ("loss", "hT"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_reverse_mode_runs_the_forward_loop_once(case: Case) -> None:
    # The stacking loop computes what the source loop computes (and its scan outputs): it takes
    # the source loop's place, so grad runs two loops (stacking, reverse), not three. The primal
    # outputs still match the source model; the gradients are checked against float64 central
    # differences (also by the battery above, for every case).
    g = onnax.grad(case.model, inputs=case.inputs, output="loss")
    assert [n.op_type for n in g.graph.node].count("Loop") == 2
    onnx.checker.check_model(g, full_check=True)
    feeds = make_feeds(case.model, case.gens, np.random.default_rng(4))
    got, want = run(g, feeds), run(case.model, feeds)
    for o in case.model.graph.output:
        np.testing.assert_allclose(got[o.name], want[o.name], rtol=1e-12, atol=1e-12)
    check_grad(case.model, case.inputs, "loss", gens=case.gens)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_activation_derivative_is_computed_after_the_stacking_loop(case: Case) -> None:
    # tanh's derivative 1 - y^2, which the reverse body reads, is computed from the stacked y
    # after the stacking loop (one Mul and one Sub for all iterations), not at every step.
    g = onnax.grad(case.model, inputs=case.inputs, output="loss")
    *forward, _reverse = [n for n in g.graph.node if n.op_type == "Loop"]
    for loop in forward:
        assert "Sub" not in [n.op_type for n in loop.attribute[0].g.node]
    after = list(g.graph.node)[list(g.graph.node).index(forward[-1]) + 1 :]
    assert "Sub" in [n.op_type for n in after]
    check_grad(case.model, case.inputs, "loss", gens=case.gens)


@pytest.mark.parametrize("trips", [0, T_STEPS], ids=["zero-iterations", "four-iterations"])
def test_weights_of_symbolic_shape(trips: int) -> None:
    # W and b as graph inputs of symbolic shape [H, H] / [H]: their cotangents stay accumulated
    # in the reverse loop (a term summed from stacks after zero iterations would have no shape
    # to take), and their gradients have the weights' shapes, zero when the loop does not run.
    model = recurrence(trips, [2, 3], variant="bias")
    assert {t.name for t in model.graph.initializer} == {"W", "b"}
    del model.graph.initializer[:]
    for name, dims in (("W", ["H", "H"]), ("b", ["H"])):
        model.graph.input.append(helper.make_tensor_value_info(name, D, dims))
    gens = {"W": normal((3, 3)), "b": normal((3,))}
    g = onnax.grad(model, inputs=["W", "b"], output="loss")
    feeds = make_feeds(model, gens, np.random.default_rng(8))
    got = run(g, feeds)
    assert got["W_grad"].shape == (3, 3) and got["b_grad"].shape == (3,)
    if trips == 0:
        assert not got["W_grad"].any() and not got["b_grad"].any()
    check_grad(model, ["W", "b"], "loss", gens=gens)


def _compositions() -> dict[str, Any]:
    def g(m: onnx.ModelProto) -> onnx.ModelProto:
        return onnax.grad(m, inputs=["h0", "W"], output="loss")

    return {
        "jvp-of-jvp": lambda m: onnax.jvp(onnax.jvp(m, inputs=["W"]), inputs=["h0"]),
        "vmap-of-jvp": lambda m: onnax.vmap(onnax.jvp(m, inputs=["h0"]), in_axes=0),
        "jvp-of-vmap": lambda m: onnax.jvp(onnax.vmap(m, in_axes=0), inputs=["h0"]),
        "hvp": lambda m: onnax.jvp(g(m), inputs=["W"]),
        "vmap-of-hvp": lambda m: onnax.vmap(onnax.jvp(g(m), inputs=["W"]), in_axes=(0, 0, None)),
    }


@pytest.mark.parametrize("name", list(_compositions()))
def test_compositions_through_the_loop_validate(name: str) -> None:
    # The forward-mode loop that takes over its source loop, the hoisted products and the
    # residuals, composed: onnax.testing.validate replays the recorded chain against finite
    # differences and per-example loops, independently of onnax.
    from onnax import testing

    source = recurrence(T_STEPS, [2, 3])
    report = testing.validate(source, _compositions()[name](source))
    assert report.ok, report.format()
