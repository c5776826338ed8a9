"""Derivatives through control flow (Loop), against the independent oracles of ``ad_oracle``.

Every model runs the full battery: jvp against float64 central finite differences, vjp by the
dot-product test against the checked jvp, grad of a scalar loss against finite differences,
Hessian-vector products (``jvp(grad(f))``) against finite differences of the gradient, and
per-example gradients (``vmap(grad(f))``) against a loop of ``grad(f)``; a float32 variant is
checked against the float64 oracle. The loops cover what exporters write: a recurrence over a
sequence (weights read from the enclosing graph, or carried as constant state as jax2onnx does),
early exit through the condition, a loop with no trip count, zero iterations, a loop nested in
a loop body, state that becomes active only inside the loop, and an integer counter in the
state.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto, helper
from oracles.ad_oracle import (
    ADGen,
    battery,
    check_grad,
    check_jvp,
    fixed,
    float32_battery,
    make_ad_model,
    make_feeds,
    normal,
    run,
    scalarize,
)
from oracles.vmap_oracle import assert_vmap_matches

D = TensorProto.DOUBLE
I64 = TensorProto.INT64
B = TensorProto.BOOL
T_STEPS = 4


def vi(name: str, elem: int, shape: Sequence[Any] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def const(name: str, value: Any, elem: int) -> onnx.NodeProto:
    arr = np.asarray(value)
    return helper.make_node(
        "Constant", [], [name], value=helper.make_tensor(name + "_v", elem, arr.shape, arr.flatten().tolist())
    )


def body(
    nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]
) -> onnx.GraphProto:
    return helper.make_graph(nodes, "body", inputs, outputs)


def loss_of(*values: str) -> list[onnx.NodeProto]:
    """loss = sum of ReduceSum(v) over `values`."""
    nodes = [helper.make_node("ReduceSum", [v], [v + "_sum"], keepdims=0) for v in values]
    total = values[0] + "_sum"
    for v in values[1:]:
        nodes.append(helper.make_node("Add", [total, v + "_sum"], [total + "_" + v]))
        total = total + "_" + v
    nodes.append(helper.make_node("Identity", [total], ["loss"]))
    return nodes


def loop_over(
    trips: int,
    init: str,
    final: str,
    nodes: list[onnx.NodeProto],
    state: tuple[str, str, list[int]],
    scans: Sequence[tuple[str, str, list[int]]] = (),
) -> list[onnx.NodeProto]:
    """A Loop of `trips` iterations over one float state (body names state[0] -> state[1], of
    shape state[2]) from `init` to `final`; each (body name, outer name, shape) in `scans` is a
    scan output. The body defines `cond_out` (from `cond_in`, or its own condition)."""
    body_in = [vi("it", I64, []), vi("cond_in", B, []), vi(state[0], D, state[2])]
    body_out = [vi("cond_out", B, []), vi(state[1], D, state[2]), *(vi(b, D, sh) for b, _, sh in scans)]
    return [
        const("M", trips, I64),
        const("c0", True, B),
        helper.make_node(
            "Loop", ["M", "c0", init], [final, *(o for _, o, _ in scans)], body=body(nodes, body_in, body_out)
        ),
    ]


def rnn(weights_carried: bool = False) -> onnx.ModelProto:
    """h_{t+1} = tanh(h_t W + xs[t] + b), ys[t] = h_{t+1}^2; W read from the enclosing graph
    (or carried as constant state), xs carried and gathered by the iteration number."""
    w_in = "W_in" if weights_carried else "W"
    nodes = [
        helper.make_node("Gather", ["xs_in", "it"], ["xt"], axis=0),
        helper.make_node("MatMul", ["h_in", w_in], ["hw"]),
        helper.make_node("Add", ["hw", "xt"], ["pre0"]),
        helper.make_node("Add", ["pre0", "b"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_out"]),
        helper.make_node("Identity", ["xs_in"], ["xs_out"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Mul", ["h_out", "h_out"], ["y_t"]),
    ]
    ins = [vi("it", I64, []), vi("cond_in", B, []), vi("h_in", D, [2, 3]), vi("xs_in", D, [T_STEPS, 2, 3])]
    outs = [vi("cond_out", B, []), vi("h_out", D, [2, 3]), vi("xs_out", D, [T_STEPS, 2, 3])]
    loop_in = ["M", "c0", "h0", "xs"]
    loop_out = ["hT", "xsT"]
    if weights_carried:
        nodes.append(helper.make_node("Identity", ["W_in"], ["W_out"]))
        ins.append(vi("W_in", D, [3, 3]))
        outs.append(vi("W_out", D, [3, 3]))
        loop_in.append("W")
        loop_out.append("WT")
    outs.append(vi("y_t", D, [2, 3]))
    loop_out.append("ys")
    g = [
        const("M", T_STEPS, I64),
        const("c0", True, B),
        helper.make_node("Loop", loop_in, loop_out, body=body(nodes, ins, outs)),
        *loss_of("ys", "hT"),
    ]
    rng = np.random.default_rng(7)
    return make_ad_model(
        g,
        [("h0", D, [2, 3]), ("xs", D, [T_STEPS, 2, 3])],
        [("loss", D, []), "hT"],
        initializers={"W": rng.standard_normal((3, 3)) * 0.5, "b": rng.standard_normal((3,)) * 0.3},
    )


def early_exit() -> onnx.ModelProto:
    """M = 10 but the body stops after 3 iterations: x <- sin(x) * w + x, cond = it + 1 < 3."""
    nodes = [
        helper.make_node("Sin", ["x_in"], ["s"]),
        helper.make_node("Mul", ["s", "w"], ["sw"]),
        helper.make_node("Add", ["sw", "x_in"], ["x_out"]),
        const("one", 1, I64),
        const("three", 3, I64),
        helper.make_node("Add", ["it", "one"], ["next"]),
        helper.make_node("Less", ["next", "three"], ["cond_out"]),
    ]
    g = [*loop_over(10, "x", "xT", nodes, ("x_in", "x_out", [4])), *loss_of("xT")]
    return make_ad_model(g, [("x", D, [4]), ("w", D, [4])], [("loss", D, []), "xT"])


def no_trip_count() -> onnx.ModelProto:
    """No M: runs while the carried counter n < 3; x <- x * y + y^2 (y from the enclosing graph)."""
    nodes = [
        helper.make_node("Mul", ["x_in", "y"], ["xy"]),
        helper.make_node("Mul", ["y", "y"], ["yy"]),
        helper.make_node("Add", ["xy", "yy"], ["x_out"]),
        const("one", 1, I64),
        const("three", 3, I64),
        helper.make_node("Add", ["n_in", "one"], ["n_out"]),
        helper.make_node("Less", ["n_out", "three"], ["cond_out"]),
    ]
    g = [
        const("c0", True, B),
        const("n0", 0, I64),
        helper.make_node(
            "Loop",
            ["", "c0", "x", "n0"],
            ["xT", "nT"],
            body=body(
                nodes,
                [vi("it", I64, []), vi("cond_in", B, []), vi("x_in", D, [3]), vi("n_in", I64, [])],
                [vi("cond_out", B, []), vi("x_out", D, [3]), vi("n_out", I64, [])],
            ),
        ),
        *loss_of("xT"),
    ]
    return make_ad_model(g, [("x", D, [3]), ("y", D, [3])], [("loss", D, []), "xT"])


def zero_trips() -> onnx.ModelProto:
    """M = 0: the final state is the initial one and the scan output is empty."""
    nodes = [
        helper.make_node("Mul", ["x_in", "w"], ["x_out"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Exp", ["x_out"], ["e"]),
    ]
    g = [
        *loop_over(0, "x", "xT", nodes, ("x_in", "x_out", [3]), [("e", "es", [3])]),
        helper.make_node("Mul", ["xT", "xT"], ["sq"]),
        *loss_of("sq", "es"),
    ]
    return make_ad_model(g, [("x", D, [3]), ("w", D, [3])], [("loss", D, []), "xT"])


def nested() -> onnx.ModelProto:
    """An outer loop of 3 whose body runs an inner loop of 2 on its state (inner: z <- tanh(z *
    a + c), a from the outer body, c from the top graph)."""
    inner_nodes = [
        helper.make_node("Mul", ["z_in", "a"], ["za"]),
        helper.make_node("Add", ["za", "c"], ["zpre"]),
        helper.make_node("Tanh", ["zpre"], ["z_out"]),
        helper.make_node("Identity", ["icond_in"], ["icond_out"]),
    ]
    inner = body(
        inner_nodes,
        [vi("i_it", I64, []), vi("icond_in", B, []), vi("z_in", D, [3])],
        [vi("icond_out", B, []), vi("z_out", D, [3])],
    )
    outer_nodes = [
        helper.make_node("Sin", ["x_in"], ["a"]),
        const("two", 2, I64),
        helper.make_node("Loop", ["two", "cond_in", "x_in"], ["x_out"], body=inner),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
    ]
    g = [*loop_over(3, "x", "xT", outer_nodes, ("x_in", "x_out", [3])), *loss_of("xT")]
    return make_ad_model(g, [("x", D, [3]), ("c", D, [3])], [("loss", D, []), "xT"])


def late_active() -> onnx.ModelProto:
    """The state starts from constant zeros (no derivative) and depends on w only inside the
    loop: h <- h * 0.5 + sin(w); its tangent starts at zero and becomes non-zero."""
    nodes = [
        const("half", 0.5, D),
        helper.make_node("Mul", ["h_in", "half"], ["hh"]),
        helper.make_node("Sin", ["w"], ["sw"]),
        helper.make_node("Add", ["hh", "sw"], ["h_out"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Mul", ["h_out", "w"], ["y_t"]),
    ]
    g = [
        const("h0", np.zeros(3), D),
        *loop_over(3, "h0", "hT", nodes, ("h_in", "h_out", [3]), [("y_t", "ys", [3])]),
        helper.make_node("Mul", ["hT", "hT"], ["sq"]),
        *loss_of("sq", "ys"),
    ]
    return make_ad_model(g, [("w", D, [3])], [("loss", D, []), "hT"])


def rows_left_over(trips: int) -> onnx.ModelProto:
    """`trips` iterations over a sequence of T_STEPS + 2 rows (read from the enclosing graph,
    one row per iteration at the iteration number): the rows past the last iteration get a
    zero cotangent. h <- tanh(h * w + xs[it]), ys[it] = h * xs[it]."""
    nodes = [
        helper.make_node("Gather", ["xs", "it"], ["xt"], axis=0),
        helper.make_node("Mul", ["h_in", "w"], ["hw"]),
        helper.make_node("Add", ["hw", "xt"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_out"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Mul", ["h_out", "xt"], ["y_t"]),
    ]
    g = [
        *loop_over(trips, "h0", "hT", nodes, ("h_in", "h_out", [3]), [("y_t", "ys", [3])]),
        *loss_of("hT", "ys"),
    ]
    return make_ad_model(
        g, [("h0", D, [3]), ("xs", D, [T_STEPS + 2, 3]), ("w", D, [3])], [("loss", D, []), "hT"]
    )


def scan_rnn(steps: int | str = T_STEPS) -> onnx.ModelProto:
    """Scan: state h [2, 3]; scan inputs xs [T, 2, 3] (axis 0, forward) and zs [2, T, 3] (axis 1,
    backward); W from the enclosing graph; scan outputs y (axis 0) and y2 (axis 1, backward):
    h <- tanh(h W + x) * z, y = h, y2 = h * x."""
    nodes = [
        helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
        helper.make_node("Add", ["hw", "x_t"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["th"]),
        helper.make_node("Mul", ["th", "z_t"], ["h_out"]),
        helper.make_node("Identity", ["h_out"], ["y_t"]),
        helper.make_node("Mul", ["h_out", "x_t"], ["y2_t"]),
    ]
    scan_body = body(
        nodes,
        [vi("h_in", D, [2, 3]), vi("x_t", D, [2, 3]), vi("z_t", D, [2, 3])],
        [vi("h_out", D, [2, 3]), vi("y_t", D, [2, 3]), vi("y2_t", D, [2, 3])],
    )
    g = [
        helper.make_node(
            "Scan",
            ["h0", "xs", "zs"],
            ["hT", "ys", "y2s"],
            body=scan_body,
            num_scan_inputs=2,
            scan_input_axes=[0, 1],
            scan_input_directions=[0, 1],
            scan_output_axes=[0, 1],
            scan_output_directions=[0, 1],
        ),
        helper.make_node("Mul", ["y2s", "y2s"], ["y2sq"]),
        *loss_of("hT", "ys", "y2sq"),
    ]
    rng = np.random.default_rng(11)
    return make_ad_model(
        g,
        [("h0", D, [2, 3]), ("xs", D, [steps, 2, 3]), ("zs", D, [2, steps, 3])],
        [("loss", D, []), "hT", "y2s"],
        initializers={"W": rng.standard_normal((3, 3)) * 0.5},
    )


def branching(then_reads_w: bool = True) -> onnx.ModelProto:
    """y = If(p, then: x * sin(w) (or x * x), else: exp(x) + w); loss = sum(y * y)."""
    then_nodes = (
        [helper.make_node("Sin", ["w"], ["sw"]), helper.make_node("Mul", ["x", "sw"], ["ty"])]
        if then_reads_w
        else [helper.make_node("Mul", ["x", "x"], ["ty"])]
    )
    else_nodes = [helper.make_node("Exp", ["x"], ["ex"]), helper.make_node("Add", ["ex", "w"], ["ey"])]
    g = [
        helper.make_node(
            "If",
            ["p"],
            ["y"],
            then_branch=body(then_nodes, [], [vi("ty", D, [3])]),
            else_branch=body(else_nodes, [], [vi("ey", D, [3])]),
        ),
        helper.make_node("Mul", ["y", "y"], ["sq"]),
        *loss_of("sq"),
    ]
    return make_ad_model(g, [("p", B, []), ("x", D, [3]), ("w", D, [3])], [("loss", D, []), "y"])


def branch_in_loop() -> onnx.ModelProto:
    """A loop of 4 whose body branches on the iteration's parity: even steps h <- tanh(h * w),
    odd steps h <- h + sin(h) * w."""
    even = body(
        [helper.make_node("Mul", ["h_in", "w"], ["hw"]), helper.make_node("Tanh", ["hw"], ["e_out"])],
        [],
        [vi("e_out", D, [3])],
    )
    odd = body(
        [
            helper.make_node("Sin", ["h_in"], ["sh"]),
            helper.make_node("Mul", ["sh", "w"], ["shw"]),
            helper.make_node("Add", ["h_in", "shw"], ["o_out"]),
        ],
        [],
        [vi("o_out", D, [3])],
    )
    nodes = [
        const("two", 2, I64),
        const("zero", 0, I64),
        helper.make_node("Mod", ["it", "two"], ["parity"]),
        helper.make_node("Equal", ["parity", "zero"], ["is_even"]),
        helper.make_node("If", ["is_even"], ["h_out"], then_branch=even, else_branch=odd),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
    ]
    g = [*loop_over(T_STEPS, "h0", "hT", nodes, ("h_in", "h_out", [3])), *loss_of("hT")]
    return make_ad_model(g, [("h0", D, [3]), ("w", D, [3])], [("loss", D, []), "hT"])


@dataclass
class Case:
    id: str
    model: onnx.ModelProto
    inputs: list[str]
    gens: Mapping[str, ADGen] = field(default_factory=dict)
    hvp_wrt: list[str] = field(default_factory=list)
    in_axes: tuple[int | None, ...] | None = None  # per-example grad over the runtime inputs


CASES = [
    Case("rnn-captured-weights", rnn(), ["h0", "xs", "W", "b"], hvp_wrt=["W"], in_axes=(0, 0)),
    Case(
        "rnn-carried-weights",
        rnn(weights_carried=True),
        ["h0", "xs", "W", "b"],
        hvp_wrt=["W", "b"],
        in_axes=(0, 0),
    ),
    Case("early-exit", early_exit(), ["x", "w"], hvp_wrt=["x"], in_axes=(0, None)),
    Case("no-trip-count", no_trip_count(), ["x", "y"], hvp_wrt=["y"], in_axes=(0, None)),
    Case("zero-trips", zero_trips(), ["x", "w"], hvp_wrt=["x"], in_axes=(0, None)),
    Case("nested-loops", nested(), ["x", "c"], hvp_wrt=["x", "c"], in_axes=(0, None)),
    Case("late-active-state", late_active(), ["w"], hvp_wrt=["w"], in_axes=(0,)),
    Case(
        "rows-left-over",
        rows_left_over(T_STEPS),
        ["h0", "xs", "w"],
        hvp_wrt=["xs", "w"],
        in_axes=(0, 0, None),
    ),
    Case("rows-zero-trips", rows_left_over(0), ["h0", "xs", "w"], hvp_wrt=["xs"], in_axes=(0, 0, None)),
    Case("if-then", branching(), ["x", "w"], {"p": fixed(True)}, hvp_wrt=["x", "w"], in_axes=(None, 0, None)),
    Case("if-else", branching(), ["x", "w"], {"p": fixed(False)}, hvp_wrt=["w"], in_axes=(None, 0, None)),
    Case(
        "if-branch-reads-no-w",
        branching(then_reads_w=False),
        ["x", "w"],
        {"p": fixed(True)},
        hvp_wrt=["w"],
        in_axes=(None, 0, 0),
    ),
    Case("if-in-loop", branch_in_loop(), ["h0", "w"], hvp_wrt=["h0", "w"], in_axes=(0, None)),
    Case("scan-rnn", scan_rnn(), ["h0", "xs", "zs", "W"], hvp_wrt=["W"], in_axes=(0, 0, 0)),
    Case(
        "scan-rnn-symbolic-length",
        scan_rnn("T"),
        ["h0", "xs", "zs", "W"],
        gens={"xs": normal((T_STEPS + 1, 2, 3)), "zs": normal((2, T_STEPS + 1, 3))},
        hvp_wrt=["W"],
        in_axes=(0, 0, 0),
    ),
]
IDS = [c.id for c in CASES]


test_jvp, test_vjp_dot, test_grad, test_hvp, test_per_example_grad = battery(
    CASES, IDS, inputs=lambda c: c.inputs, hvp_wrt=lambda c: c.hvp_wrt, per_example_axes=lambda c: c.in_axes
)
test_f32 = float32_battery(CASES, IDS, inputs=lambda c: c.inputs)


def test_grad_of_grad_through_a_loop() -> None:
    # Second-order reverse mode: the gradient graph (with its stacking and reverse loops) is
    # differentiated again in reverse mode, through a scalar of the first gradient.
    m = rnn()
    g1 = onnax.grad(m, inputs=["W"], output="loss")
    gm = scalarize(g1, name="ad_loss")
    check_grad(gm, ["W"], "ad_loss")


def test_reverse_graph_recomputes_forward_once_per_loop() -> None:
    # The reverse graph of one loop holds the stacking loop (in the source loop's place: it
    # computes the source loop's outputs too) and the reverse loop: two top-level Loops (not one
    # per step or per output, and not the source loop beside the stacking loop).
    g = onnax.grad(rnn(), inputs=["W"], output="loss")
    assert [n.op_type for n in g.graph.node].count("Loop") == 2
    onnx.checker.check_model(g, full_check=True)
    check_grad(rnn(), ["W"], "loss")


@pytest.mark.parametrize("steps", [T_STEPS, "T"], ids=["static-length", "symbolic-length"])
def test_scan_runs_once_as_its_loop(steps: int | str) -> None:
    # The Loop that differentiates a Scan computes the Scan's outputs too and replaces it: jvp
    # runs one loop (the JVP loop), grad two (the stacking loop in the Scan's place, and the
    # reverse loop). Primal outputs equal the source model's; derivatives against float64
    # central differences.
    model = scan_rnn(steps)
    gens = {"xs": normal((T_STEPS, 2, 3)), "zs": normal((2, T_STEPS, 3))}
    j = onnax.jvp(model, inputs=["h0", "W"])
    g = onnax.grad(model, inputs=["h0", "xs", "zs", "W"], output="loss")
    for result, loops in ((j, 1), (g, 2)):
        ops = [n.op_type for n in result.graph.node]
        assert "Scan" not in ops and ops.count("Loop") == loops, ops
        onnx.checker.check_model(result, full_check=True)
        feeds = make_feeds(model, gens, np.random.default_rng(7))
        tangents = {"h0_tangent": np.ones((2, 3)), "W_tangent": np.ones((3, 3))}
        got, want = run(result, {**feeds, **tangents}), run(model, feeds)
        for o in model.graph.output:
            np.testing.assert_allclose(got[o.name], want[o.name], rtol=1e-12, atol=1e-12)
    check_jvp(model, ["h0", "W"], gens=gens)
    check_grad(model, ["h0", "xs", "zs", "W"], "loss", gens=gens)


def _ops_in(graph: onnx.GraphProto) -> list[str]:
    ops = []
    for n in graph.node:
        ops.append(n.op_type)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                ops += _ops_in(a.g)
    return ops


@pytest.mark.parametrize(
    "model", [rnn(), rows_left_over(T_STEPS)], ids=["carried-sequence", "captured-sequence"]
)
def test_reverse_loop_returns_rows_of_a_scanned_sequence(model: onnx.ModelProto) -> None:
    # A sequence the body reads one row of per iteration gets one cotangent row per iteration
    # (stacked by the reverse loop), not a scatter into a full-size accumulator every iteration.
    g = onnax.grad(model, inputs=["xs"], output="loss")
    reverse = [n for n in g.graph.node if n.op_type == "Loop"][-1]
    assert not [op for op in _ops_in(reverse.attribute[0].g) if op.startswith("Scatter")]


def _top_level_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_vmap_runs_control_flow_once_for_the_batch(case: Case) -> None:
    # A shared trip count and condition: the Loop/Scan/If runs once with its body batched (no
    # per-example Scan around it, so no fallback warning), and matches a per-example loop.
    gens = {k: (lambda rng, g=g: g(rng, np.dtype(np.float64))) for k, g in case.gens.items()}
    source_ops = _top_level_ops(case.model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vm = assert_vmap_matches(case.model, case.in_axes, 0, gens=gens, rtol=1e-9, atol=1e-9)
    ops = _top_level_ops(vm)
    for op in ("Loop", "If", "Scan"):
        assert ops.count(op) == source_ops.count(op), (op, ops)


def test_vmap_with_batched_condition_runs_per_example() -> None:
    # Examples take different branches: the per-example map, with its notice.
    with pytest.warns(UserWarning, match="per-example"):
        assert_vmap_matches(branching(), (0, 0, None), 0, rtol=1e-9, atol=1e-9)
