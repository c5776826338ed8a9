"""Reverse mode through nested Loops and Ifs: each forward pass run once, each body linearized
once.

The reverse body of a loop differentiates the loop's JVP body, which holds the JVP loops of the
loops nested in it. Their forward parts are run once, by the enclosing loop's stacking loop, and
their stacks become that loop's residuals (stacks of stacks), as JAX's scan keeps an inner scan's
residuals: the result has two Loops per nesting level (a forward one, a reverse one) however deep
the nest, where it used to double per level (the reverse body ran the inner forward pass again).
Numbers are checked against JAX float64 (nested ``fori_loop``s): gradients, and Hessian-vector
products through the same nest (jvp of grad). Inner trip counts that are not constants (a graph
input, or the enclosing iteration number, so the stacks differ in length between iterations)
keep the inner forward pass in the reverse body, with the same numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnax
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles.nested_loops import COLS, ROWS, TRIPS, jax_loss, nested

D = TensorProto.DOUBLE
I64 = TensorProto.INT64
B = TensorProto.BOOL


def loops_by_level(g: onnx.GraphProto, level: int = 0, out: dict[int, int] | None = None) -> dict[int, int]:
    out = {} if out is None else out
    for n in g.node:
        if n.op_type == "Loop":
            out[level] = out.get(level, 0) + 1
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                loops_by_level(a.g, level + 1, out)
    return out


def node_count(g: onnx.GraphProto) -> int:
    return len(g.node) + sum(
        node_count(a.g) for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
    )


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize(
    ("depth", "trips"),
    [(1, "const"), (2, "const"), (3, "const"), (5, "const"), (3, "input"), (3, "iteration")],
)
def test_gradients_through_nested_loops_equal_jax(depth: int, trips: str) -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    model = nested(depth, trips)
    x = np.random.default_rng(1).standard_normal((ROWS, COLS))
    feeds = {"x": x} | ({"M": np.array(3, np.int64)} if trips == "input" else {})
    w = weights(model)
    got = run(onnax.grad(model, inputs=["x", "W", "b"]), feeds)
    want_loss, want = jax.value_and_grad(jax_loss(depth, trips, 3), argnums=(0, 1, 2))(x, w["W"], w["b"])
    np.testing.assert_allclose(got["loss"], want_loss, rtol=1e-12)
    for name, g in zip(["x_grad", "W_grad", "b_grad"], want, strict=True):
        np.testing.assert_allclose(got[name], np.asarray(g), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("depth", [2, 3])
def test_hessian_vector_products_through_nested_loops_equal_jax(depth: int) -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    model = nested(depth)
    rng = np.random.default_rng(2)
    x, v = rng.standard_normal((ROWS, COLS)), rng.standard_normal((COLS, COLS))
    w = weights(model)
    hvp = onnax.jvp(onnax.grad(model, inputs=["W"]), inputs=["W"])
    got = run(hvp, {"x": x, "W_tangent": v})
    f = jax_loss(depth, "const", 0)
    _, want = jax.jvp(jax.grad(lambda ww: f(x, ww, w["b"])), (w["W"],), (v,))
    np.testing.assert_allclose(got["W_grad_tangent"], np.asarray(want), rtol=1e-9, atol=1e-12)


def test_reverse_mode_grows_linearly_with_nesting_depth() -> None:
    """Two Loops per nesting level of the result (the forward pass, stacking, and the reverse
    pass), at every depth: the reverse body no longer runs the inner forward pass again (which
    made the Loops per level 2, 3, 5, 9, ... and the result double per level). Each level adds
    about the same number of nodes (one more per level: the innermost residuals are stacked once
    more by each enclosing loop)."""
    nodes = {}
    for depth in (1, 2, 4, 8):
        result = onnax.grad(nested(depth), inputs=["W"])
        assert set(loops_by_level(result.graph).values()) == {2}, (depth, loops_by_level(result.graph))
        nodes[depth] = node_count(result.graph)
    assert nodes[8] - nodes[4] < 1.5 * 4 * (nodes[2] - nodes[1]), nodes


def test_inner_loops_whose_length_varies_are_run_again_in_the_reverse_body() -> None:
    """An inner loop whose trip count differs between enclosing iterations has stacks of
    different lengths, which one stack cannot hold: its forward pass stays in the reverse body
    (numbers: test_gradients_through_nested_loops_equal_jax[3-iteration])."""
    result = onnax.grad(nested(2, "iteration"), inputs=["W"])
    assert loops_by_level(result.graph)[1] == 3


def if_chain(depth: int) -> onnx.ModelProto:
    """Ifs nested `depth` deep on the input condition c: the then branch of each level runs the
    next level and takes sin of it, the else branch computes tanh(x W); the innermost then
    branch is tanh(x W) * 2. Level 2 holds a Loop (two steps of h <- tanh(h W)) around its If,
    so reverse mode meets a Loop inside an If inside an If."""

    def branch(level: int, then: bool) -> onnx.GraphProto:
        out = f"o{level}_{int(then)}"
        if not then or level == depth:
            nodes = [
                helper.make_node("MatMul", ["x", "W"], [f"xw{level}_{int(then)}"]),
                helper.make_node(
                    "Tanh", [f"xw{level}_{int(then)}"], [f"t{level}_{int(then)}" if then else out]
                ),
            ]
            if then:
                nodes.append(helper.make_node("Add", [f"t{level}_1", f"t{level}_1"], [out]))
        else:
            nodes = [
                helper.make_node(
                    "If",
                    ["c"],
                    [f"i{level}"],
                    then_branch=branch(level + 1, True),
                    else_branch=branch(level + 1, False),
                ),
                helper.make_node("Sin", [f"i{level}"], [f"s{level}"] if level == 2 else [out]),
            ]
            if level == 2:
                step = helper.make_graph(
                    [
                        helper.make_node("MatMul", ["hl_in", "W"], ["hl_w"]),
                        helper.make_node("Tanh", ["hl_w"], ["hl_out"]),
                        helper.make_node("Identity", ["cl_in"], ["cl_out"]),
                    ],
                    "step",
                    [
                        helper.make_tensor_value_info("itl", I64, []),
                        helper.make_tensor_value_info("cl_in", B, []),
                        helper.make_tensor_value_info("hl_in", D, [ROWS, COLS]),
                    ],
                    [
                        helper.make_tensor_value_info("cl_out", B, []),
                        helper.make_tensor_value_info("hl_out", D, [ROWS, COLS]),
                    ],
                )
                two = helper.make_tensor("two", I64, [], [TRIPS])
                nodes += [
                    helper.make_node("Constant", [], ["nl"], value=two),
                    helper.make_node("Loop", ["nl", "", f"s{level}"], [out], body=step),
                ]
        return helper.make_graph(
            nodes, f"b{level}_{int(then)}", [], [helper.make_tensor_value_info(out, D, [ROWS, COLS])]
        )

    graph = helper.make_graph(
        [
            helper.make_node("If", ["c"], ["y"], then_branch=branch(1, True), else_branch=branch(1, False)),
            helper.make_node("Mul", ["y", "y"], ["yy"]),
            helper.make_node("ReduceSum", ["yy"], ["loss"], keepdims=0),
        ],
        "if_chain",
        [helper.make_tensor_value_info("c", B, []), helper.make_tensor_value_info("x", D, [ROWS, COLS])],
        [helper.make_tensor_value_info("loss", D, [])],
        initializer=[
            numpy_helper.from_array(0.5 * np.random.default_rng(3).standard_normal((COLS, COLS)), "W")
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def jax_if_chain(depth: int, c: bool) -> Any:
    import jax
    import jax.numpy as jnp

    def level(k: int, x: Any, w: Any) -> Any:
        if not c:
            return jnp.tanh(x @ w)
        if k == depth:
            return 2 * jnp.tanh(x @ w)
        inner = jnp.sin(level(k + 1, x, w))
        if k == 2:
            inner = jax.lax.fori_loop(0, TRIPS, lambda i, h: jnp.tanh(h @ w), inner)
        return inner

    return lambda x, w: jnp.sum(level(1, x, w) ** 2)


@pytest.mark.parametrize("c", [True, False])
@pytest.mark.parametrize("depth", [1, 3, 6])
def test_gradients_and_hvps_through_nested_ifs_equal_jax(depth: int, c: bool) -> None:
    """Each If's transpose differentiates only the branch outputs that have a cotangent (a JVP
    branch's tangents of the highest order), so the inner Ifs are not linearized again for
    every lower order (which made the transform time grow about 3x per nesting level)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    model = if_chain(depth)
    rng = np.random.default_rng(4)
    x, v = rng.standard_normal((ROWS, COLS)), rng.standard_normal((COLS, COLS))
    w = weights(model)["W"]
    feeds = {"c": np.array(c), "x": x}
    got = run(onnax.grad(model, inputs=["x", "W"]), feeds)
    f = jax_if_chain(depth, c)
    want = jax.grad(f, argnums=(0, 1))(x, w)
    np.testing.assert_allclose(got["x_grad"], np.asarray(want[0]), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["W_grad"], np.asarray(want[1]), rtol=1e-10, atol=1e-12)
    hvp = run(onnax.jvp(onnax.grad(model, inputs=["W"]), inputs=["W"]), feeds | {"W_tangent": v})
    _, want_hvp = jax.jvp(jax.grad(lambda ww: f(x, ww)), (w,), (v,))
    np.testing.assert_allclose(hvp["W_grad_tangent"], np.asarray(want_hvp), rtol=1e-9, atol=1e-12)


def loop_if_loop() -> onnx.ModelProto:
    """A Loop (3 steps) whose body runs an If on the step's parity, with a Loop (two sin steps) in
    the then branch and cos in the else branch, and stacks z = sum(h) (ReduceSum, keepdims 0) as a
    scan output. The branches leave h's rank undeclared, so only ReduceSum's own form (every
    axis reduced: a scalar whatever its input) gives zs a rank. loss = sum(h_final) + sum(zs^2)."""

    def vi(name: str, dtype: int, shape: list[int] | None) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, dtype, shape)

    def const(name: str, value: int) -> onnx.NodeProto:
        return helper.make_node(
            "Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.int64))
        )

    inner = helper.make_graph(
        [helper.make_node("Sin", ["g"], ["g1"]), helper.make_node("Identity", ["ck"], ["cko"])],
        "inner",
        [vi("k", I64, []), vi("ck", B, []), vi("g", D, None)],
        [vi("cko", B, []), vi("g1", D, None)],
    )
    then = helper.make_graph(
        [helper.make_node("Loop", ["two", "", "hh"], ["t_o"], body=inner)], "t", [], [vi("t_o", D, None)]
    )
    other = helper.make_graph([helper.make_node("Cos", ["hh"], ["e_o"])], "e", [], [vi("e_o", D, None)])
    outer = helper.make_graph(
        [
            helper.make_node("Mod", ["i", "two"], ["im"]),
            helper.make_node("Equal", ["im", "zero"], ["even"]),
            helper.make_node("If", ["even"], ["h1"], then_branch=then, else_branch=other),
            helper.make_node("Identity", ["c"], ["co"]),
            helper.make_node("ReduceSum", ["h1"], ["z"], keepdims=0),
        ],
        "outer",
        [vi("i", I64, []), vi("c", B, []), vi("hh", D, None)],
        [vi("co", B, []), vi("h1", D, None), vi("z", D, None)],
    )
    nodes = [
        const("two", 2),
        const("zero", 0),
        const("three", 3),
        helper.make_node("Loop", ["three", "", "x"], ["h_fin", "zs"], body=outer),
        helper.make_node("ReduceSum", ["h_fin"], ["l1"], keepdims=0),
        helper.make_node("Mul", ["zs", "zs"], ["zz"]),
        helper.make_node("ReduceSum", ["zz"], ["l2"], keepdims=0),
        helper.make_node("Add", ["l1", "l2"], ["loss"]),
    ]
    graph = helper.make_graph(nodes, "loop_if_loop", [vi("x", D, [2])], [vi("loss", D, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_a_loop_if_loop_nest_with_a_stacked_sum_vmaps_and_has_jax_hessians() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    def f(x: Any) -> Any:
        def step(h: Any, i: Any) -> Any:
            h1 = jax.lax.cond(i % 2 == 0, lambda v: jnp.sin(jnp.sin(v)), jnp.cos, h)
            return h1, jnp.sum(h1)

        h, zs = jax.lax.scan(step, x, jnp.arange(3))
        return jnp.sum(h) + jnp.sum(zs * zs)

    model = loop_if_loop()
    xs = np.random.default_rng(9).standard_normal((4, 2))
    batched = run(onnax.vmap(model, in_axes=0), {"x": xs})
    np.testing.assert_allclose(batched["loss"], [float(f(x)) for x in xs], rtol=1e-12)
    hess = run(onnax.hessian(model, inputs=["x"]), {"x": xs[0]})
    np.testing.assert_allclose(
        hess["loss_hessian_x_x"], np.asarray(jax.hessian(f)(xs[0])), rtol=1e-9, atol=1e-12
    )
    jac = run(onnax.jacfwd(model, inputs=["x"]), {"x": xs[0]})
    np.testing.assert_allclose(jac["loss_jacobian_x"], np.asarray(jax.grad(f)(xs[0])), rtol=1e-10, atol=1e-12)


def loop_reading_inner_stack(variant: str) -> onnx.ModelProto:
    """Two Loops; the outer body reads the inner Loop's scan output (its stack of states):
    h <- inner_final + sin(sum of the inner stack), twice; loss = sum(h^2). `variant`: the
    inner trip count is 3 ("const") or the outer iteration + 1 ("iteration"), or the outer
    loop also stacks the inner stack's sum and the loss adds it ("stacked")."""
    vi = helper.make_tensor_value_info
    inner = helper.make_graph(
        [
            helper.make_node("MatMul", ["hi", "W"], ["hw"]),
            helper.make_node("Tanh", ["hw"], ["ho"]),
            helper.make_node("Identity", ["ci"], ["co"]),
            helper.make_node("Identity", ["ho"], ["hs"]),
        ],
        "inner",
        [vi("j", I64, []), vi("ci", B, []), vi("hi", D, [3])],
        [vi("co", B, []), vi("ho", D, [3]), vi("hs", D, [3])],
    )
    if variant == "iteration":
        trips = [
            helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one_v", I64, [], [1])),
            helper.make_node("Add", ["i", "one"], ["n1"]),
        ]
    else:
        trips = [helper.make_node("Constant", [], ["n1"], value=helper.make_tensor("n1_v", I64, [], [3]))]
    stacked = variant == "stacked"
    outer = helper.make_graph(
        [
            *trips,
            helper.make_node("Loop", ["n1", "", "h"], ["hf", "stack"], body=inner),
            helper.make_node("Constant", [], ["ax0"], value=helper.make_tensor("ax0_v", I64, [1], [0])),
            helper.make_node("ReduceSum", ["stack", "ax0"], ["ssum"], keepdims=0),
            helper.make_node("Sin", ["ssum"], ["sn"]),
            helper.make_node("Add", ["hf", "sn"], ["h2"]),
            helper.make_node("Identity", ["c"], ["c2"]),
            *([helper.make_node("Identity", ["ssum"], ["so"])] if stacked else []),
        ],
        "outer",
        [vi("i", I64, []), vi("c", B, []), vi("h", D, [3])],
        [vi("c2", B, []), vi("h2", D, [3]), *([vi("so", D, [3])] if stacked else [])],
    )
    tail = (
        [
            helper.make_node("ReduceSum", ["sos"], ["extra"], keepdims=0),
            helper.make_node("Add", ["loss0", "extra"], ["loss"]),
        ]
        if stacked
        else [helper.make_node("Identity", ["loss0"], ["loss"])]
    )
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["n0"], value=helper.make_tensor("n0_v", I64, [], [2])),
            helper.make_node("Loop", ["n0", "", "x"], ["y", *(["sos"] if stacked else [])], body=outer),
            helper.make_node("Mul", ["y", "y"], ["yy"]),
            helper.make_node("ReduceSum", ["yy"], ["loss0"], keepdims=0),
            *tail,
        ],
        "loop_reading_inner_stack",
        [vi("x", D, [3])],
        [vi("loss", D, [])],
        initializer=[numpy_helper.from_array(0.5 * np.random.default_rng(0).standard_normal((3, 3)), "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("variant", ["const", "iteration", "stacked"])
def test_jacobians_and_hessians_of_a_loop_reading_an_inner_loops_stack_equal_jax(variant: str) -> None:
    # jacfwd and hessian vmap a JVP over a basis of tangents. The inner stack must not send that
    # vmap to a per-example Scan: it would batch the primal loss too, which out_axes=None for
    # primal outputs refuses.
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    model = loop_reading_inner_stack(variant)
    w = numpy_helper.to_array(model.graph.initializer[0])

    def f(x: Any) -> Any:
        h, extra = x, jnp.zeros(())
        for i in range(2):
            states, hi = [], h
            for _ in range(i + 1 if variant == "iteration" else 3):
                hi = jnp.tanh(hi @ w)
                states.append(hi)
            ssum = jnp.sum(jnp.stack(states), axis=0)
            extra = extra + (jnp.sum(ssum) if variant == "stacked" else 0.0)
            h = hi + jnp.sin(ssum)
        return jnp.sum(h * h) + extra

    x = np.array([0.3, -0.2, 0.5])
    hess = onnax.hessian(model, inputs=["x"], output="loss")
    assert "Scan" not in {n.op_type for n in hess.graph.node}
    got = run(hess, {"x": x})
    np.testing.assert_allclose(got["loss"], float(f(x)), rtol=1e-13)
    np.testing.assert_allclose(got["loss_jacobian_x"], np.asarray(jax.grad(f)(x)), rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(got["loss_hessian_x_x"], np.asarray(jax.hessian(f)(x)), rtol=1e-10, atol=1e-12)
    jac = run(onnax.jacfwd(model, inputs=["x"]), {"x": x})
    np.testing.assert_allclose(jac["loss_jacobian_x"], np.asarray(jax.grad(f)(x)), rtol=1e-11, atol=1e-13)
