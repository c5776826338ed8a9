"""Rules users register (onnax.register_rule): a made-up custom op given by its definition, a
custom op kept in the result with a registered JVP, and a custom_jvp on one node of a standard
op. Oracles: the same model with the op inlined (ONNX's inliner) run in ONNX Runtime, and
analytic derivatives."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnax
import onnx
import onnx.inliner
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from oracles.training_oracle import run

F = T.FLOAT
DOMAIN = "my.ops"
RNG = np.random.default_rng(11)
W = RNG.standard_normal((3, 4)).astype(np.float32)
X = RNG.standard_normal((2, 3)).astype(np.float32)


@pytest.fixture(autouse=True)
def no_rules() -> Iterator[None]:
    onnax.clear_rules()
    yield
    onnax.clear_rules()


def softsign_body() -> onnx.FunctionProto:
    """my.ops::SoftSign2(x) = x / (1 + |x|)."""
    return helper.make_function(
        DOMAIN,
        "SoftSign2",
        ["x"],
        ["y"],
        [
            helper.make_node("Abs", ["x"], ["a"]),
            helper.make_node(
                "Constant", [], ["one"], value=numpy_helper.from_array(np.array(1.0, np.float32))
            ),
            helper.make_node("Add", ["a", "one"], ["d"]),
            helper.make_node("Div", ["x", "d"], ["y"]),
        ],
        [helper.make_opsetid("", 18)],
    )


def custom_model(op: str = "SoftSign2", declare: bool = False) -> onnx.ModelProto:
    """loss = sum(op(x @ w)^2); y = op(x @ w)."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node(op, ["h"], ["y"], domain=DOMAIN, name="custom"),
            helper.make_node("ReduceSumSquare", ["y"], ["loss"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 4]), helper.make_tensor_value_info("loss", F, [])],
        initializer=[numpy_helper.from_array(W, "w")],
        value_info=[helper.make_tensor_value_info("y", F, [2, 4])] if declare else [],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)], ir_version=10
    )


def inlined(model: onnx.ModelProto, *functions: onnx.FunctionProto) -> onnx.ModelProto:
    with_functions = onnx.ModelProto()
    with_functions.CopyFrom(model)
    with_functions.functions.extend(functions)
    return onnx.inliner.inline_local_functions(with_functions)


def close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_custom_op_by_its_definition_matches_the_inlined_model() -> None:
    model = custom_model()
    with pytest.raises(
        onnax.OnnaxError, match=r"register its JVP or definition \(onnax.register_rule; --rules FILE"
    ):
        onnax.grad(model, inputs=["w"], output="loss")
    onnax.register_rule("SoftSign2", DOMAIN, body=softsign_body())
    reference = inlined(model, softsign_body())
    xs = RNG.standard_normal((5, 2, 3)).astype(np.float32)
    cases: list[tuple[Any, dict[str, np.ndarray]]] = [
        (lambda m: onnax.vmap(m), {"x": xs}),
        (lambda m: onnax.jvp(m, inputs=["x"]), {"x": X, "x_tangent": np.ones_like(X)}),
        (
            lambda m: onnax.vjp(m, inputs=["x", "w"], outputs=["loss"]),
            {"x": X, "loss_cotangent": np.array(2, np.float32)},
        ),
        (lambda m: onnax.grad(m, inputs=["w"], output="loss"), {"x": X}),
        (lambda m: onnax.vmap(onnax.grad(m, inputs=["w"], output="loss")), {"x": xs}),
    ]
    for transform, feeds in cases:
        close(run(transform(model), feeds), run(transform(reference), feeds))
    # The analytic gradient: d/dh sum(s(h)^2) = 2 s(h) / (1 + |h|)^2.
    h = X @ W
    want = X.T @ (2 * (h / (1 + np.abs(h))) / (1 + np.abs(h)) ** 2)
    np.testing.assert_allclose(run(cases[3][0](model), {"x": X})["w_grad"], want, rtol=1e-5, atol=1e-6)


def cube_jvp() -> onnx.FunctionProto:
    """JVP of my.ops::Cube(x) = x^3: (x, t) -> 3 x^2 t."""
    return helper.make_function(
        DOMAIN,
        "CubeJvp",
        ["x", "t"],
        ["ty"],
        [
            helper.make_node("Mul", ["x", "x"], ["xx"]),
            helper.make_node(
                "Constant", [], ["three"], value=numpy_helper.from_array(np.array(3.0, np.float32))
            ),
            helper.make_node("Mul", ["xx", "three"], ["d"]),
            helper.make_node("Mul", ["d", "t"], ["ty"]),
        ],
        [helper.make_opsetid("", 18)],
    )


def cube_body() -> onnx.FunctionProto:
    return helper.make_function(
        DOMAIN,
        "Cube",
        ["x"],
        ["y"],
        [helper.make_node("Mul", ["x", "x"], ["xx"]), helper.make_node("Mul", ["xx", "x"], ["y"])],
        [helper.make_opsetid("", 18)],
    )


def test_custom_op_kept_with_its_registered_jvp() -> None:
    # The op stays in the result (a kernel the runtime has); ONNX Runtime runs it here from a
    # model-local definition added to the result.
    model = custom_model("Cube", declare=True)
    onnax.register_rule("Cube", DOMAIN, jvp=cube_jvp())
    tangent = onnax.jvp(model, inputs=["x"])
    assert "Cube" in {n.op_type for n in tangent.graph.node}
    t = RNG.standard_normal(X.shape).astype(np.float32)
    got = run(inlined(tangent, cube_body()), {"x": X, "x_tangent": t})
    h = X @ W
    np.testing.assert_allclose(got["y_tangent"], 3 * h**2 * (t @ W), rtol=1e-5, atol=1e-5)
    gradient = onnax.grad(model, inputs=["w"], output="loss")
    got = run(inlined(gradient, cube_body()), {"x": X})
    np.testing.assert_allclose(got["w_grad"], X.T @ (2 * h**3 * 3 * h**2), rtol=1e-4, atol=1e-4)
    # With a body too, vmap runs through the body while the derivatives keep the op.
    onnax.register_rule("Cube", DOMAIN, jvp=cube_jvp(), body=cube_body())
    xs = RNG.standard_normal((4, 2, 3)).astype(np.float32)
    assert "Cube" not in {n.op_type for n in onnax.vmap(model).graph.node}
    np.testing.assert_allclose(run(onnax.vmap(model), {"x": xs})["y"], (xs @ W) ** 3, rtol=1e-5, atol=1e-5)


def straight_through() -> onnx.FunctionProto:
    """A custom JVP for one Relu: the tangent passes through unchanged."""
    return helper.make_function(
        "local", "StraightThrough", ["x", "t"], ["ty"], [helper.make_node("Identity", ["t"], ["ty"])], []
    )


def test_custom_jvp_of_one_node() -> None:
    # y = relu(x) + relu(-x) (two Relu nodes); straight-through on the first only.
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r1"], name="r1"),
            helper.make_node("Neg", ["x"], ["nx"]),
            helper.make_node("Relu", ["nx"], ["r2"], name="r2"),
            helper.make_node("Add", ["r1", "r2"], ["y"]),
            helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, [6])],
        [helper.make_tensor_value_info("loss", F, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    x = np.array([-2, -1, -0.5, 0.5, 1, 2], np.float32)
    onnax.register_rule(node="r1", jvp=straight_through())
    g = run(onnax.grad(model), {"x": x})["x_grad"]
    # d r1 = 1 everywhere (straight through); d r2 / dx = -(x < 0).
    np.testing.assert_allclose(g, 1 - (x < 0), rtol=0, atol=0)
    t = np.full(6, 0.5, np.float32)
    jv = run(onnax.jvp(model), {"x": x, "x_tangent": t})["loss_tangent"]
    np.testing.assert_allclose(jv, np.sum(t * (1 - (x < 0))), rtol=1e-6)
    onnax.clear_rules()
    np.testing.assert_allclose(run(onnax.grad(model), {"x": x})["x_grad"], np.sign(x), rtol=0, atol=0)


def test_bad_rules_are_refused_with_a_fix() -> None:
    with pytest.raises(onnax.OnnaxError, match="gives neither a body nor a jvp nor a vjp"):
        onnax.register_rule("Cube", DOMAIN)
    with pytest.raises(TypeError, match=r"jvp must be an onnx\.FunctionProto"):
        onnax.register_rule("Cube", DOMAIN, jvp=cube_body().SerializeToString())
    onnax.register_rule("Cube", DOMAIN, jvp=cube_body())  # one input: the JVP needs two
    with pytest.raises(
        onnax.OnnaxError, match=r"has 1 inputs and 1 outputs, but this node has 1 inputs.*Fix: give"
    ):
        onnax.jvp(custom_model("Cube", declare=True), inputs=["x"])


def rules_file(path: Any, *functions: onnx.FunctionProto) -> str:
    """A rules file for the command line: an ONNX model whose functions are the rules."""
    model = helper.make_model(
        helper.make_graph([], "rules", [], []),
        functions=list(functions),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)],
        ir_version=10,
    )
    onnx.save(model, path)
    return str(path)


def renamed(f: onnx.FunctionProto, domain: str, name: str) -> onnx.FunctionProto:
    g = onnx.FunctionProto()
    g.CopyFrom(f)
    g.domain, g.name = domain, name
    return g


def onnax_command(*args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "onnax", *args], capture_output=True, text=True, timeout=120)


def test_command_line_rules_file_gives_definitions_and_jvps(tmp_path: Any) -> None:
    """--rules FILE: D::Op defines an operator, D::Op.jvp is its JVP, onnax.node::NAME.jvp the JVP
    of one node; registered for that command only (the next one without --rules refuses)."""
    source = tmp_path / "custom.onnx"
    onnx.save(custom_model(), source)
    out = tmp_path / "grad.onnx"
    refused = onnax_command("grad", str(source), "-o", str(out), "--inputs", "w", "--output", "loss")
    assert refused.returncode == 1 and "--rules FILE" in refused.stderr, refused.stderr
    rules = rules_file(tmp_path / "rules.onnx", softsign_body())
    done = onnax_command(
        "grad", str(source), "-o", str(out), "--inputs", "w", "--output", "loss", "--rules", rules
    )
    assert done.returncode == 0, done.stderr
    h = X @ W
    want = X.T @ (2 * (h / (1 + np.abs(h))) / (1 + np.abs(h)) ** 2)
    np.testing.assert_allclose(run(onnx.load(out), {"x": X})["w_grad"], want, rtol=1e-5, atol=1e-6)
    # A JVP for the operator (the op stays in the result; ORT runs it from its definition).
    onnx.save(custom_model("Cube", declare=True), source)
    jvp_rules = rules_file(tmp_path / "cube.onnx", renamed(cube_jvp(), DOMAIN, "Cube.jvp"))
    done = onnax_command("jvp", str(source), "-o", str(out), "--inputs", "x", "--rules", jvp_rules)
    assert done.returncode == 0, done.stderr
    t = RNG.standard_normal(X.shape).astype(np.float32)
    got = run(inlined(onnx.load(out), cube_body()), {"x": X, "x_tangent": t})
    np.testing.assert_allclose(got["y_tangent"], 3 * h**2 * (t @ W), rtol=1e-5, atol=1e-5)


def test_command_line_rules_file_with_a_node_jvp_and_bad_files(tmp_path: Any) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r1"], name="r1"),
            helper.make_node("ReduceSum", ["r1"], ["loss"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, [4])],
        [helper.make_tensor_value_info("loss", F, [])],
    )
    source, out = tmp_path / "relu.onnx", tmp_path / "grad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), source)
    rules = rules_file(tmp_path / "st.onnx", renamed(straight_through(), "onnax.node", "r1.jvp"))
    done = onnax_command("grad", str(source), "-o", str(out), "--rules", rules)
    assert done.returncode == 0, done.stderr
    x = np.array([-2, -1, 1, 2], np.float32)
    np.testing.assert_allclose(run(onnx.load(out), {"x": x})["x_grad"], np.ones(4), rtol=0, atol=0)
    empty = rules_file(tmp_path / "empty.onnx")
    bad = onnax_command("grad", str(source), "-o", str(out), "--rules", empty)
    assert bad.returncode == 1 and "defines no functions" in bad.stderr and "Fix:" in bad.stderr
    node_body = rules_file(tmp_path / "nb.onnx", renamed(straight_through(), "onnax.node", "r1"))
    bad = onnax_command("grad", str(source), "-o", str(out), "--rules", node_body)
    assert bad.returncode == 1 and "names a node but is no JVP or VJP" in bad.stderr
    missing = onnax_command("grad", str(source), "-o", str(out), "--rules")
    assert missing.returncode == 2 and "--rules needs a file" in missing.stderr


def cube_vjp() -> onnx.FunctionProto:
    """VJP of my.ops::Cube(x) = x^3: (x, ct) -> 3 x^2 ct (the JVP's formula: x^3 is scalar)."""
    return renamed(cube_jvp(), DOMAIN, "CubeVjp")


def test_custom_vjp_of_an_operator_and_of_one_node() -> None:
    """custom_vjp: reverse mode runs the registered VJP on the primal inputs and the output
    cotangents and keeps the node; forward mode without a JVP is refused with a Fix."""
    model = custom_model("Cube", declare=True)
    onnax.register_rule("Cube", DOMAIN, vjp=cube_vjp())
    gradient = onnax.grad(model, inputs=["x", "w"], output="loss")
    assert "Cube" in {n.op_type for n in gradient.graph.node}
    got = run(inlined(gradient, cube_body()), {"x": X})
    h = X @ W
    dh = 2 * h**3 * 3 * h**2
    np.testing.assert_allclose(got["w_grad"], X.T @ dh, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["x_grad"], dh @ W.T, rtol=1e-4, atol=1e-4)
    with pytest.raises(onnax.OnnaxError, match=r"gives a VJP .* but no JVP.*Fix: register a jvp"):
        onnax.jvp(model, inputs=["x"])
    onnax.register_rule("Cube", DOMAIN, vjp=cube_vjp(), body=cube_body())
    t = RNG.standard_normal(X.shape).astype(np.float32)
    tangent = run(onnax.jvp(model, inputs=["x"]), {"x": X, "x_tangent": t})  # (through the body)
    np.testing.assert_allclose(tangent["y_tangent"], 3 * h**2 * (t @ W), rtol=1e-4, atol=1e-4)
    # A VJP for one standard node: Relu's cotangent passed through unchanged.
    onnax.clear_rules()
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r1"], name="r1"),
            helper.make_node("ReduceSum", ["r1"], ["loss"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, [4])],
        [helper.make_tensor_value_info("loss", F, [])],
    )
    relu = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnax.register_rule(node="r1", vjp=straight_through())
    x = np.array([-2, -1, 1, 2], np.float32)
    np.testing.assert_allclose(run(onnax.grad(relu), {"x": x})["x_grad"], np.ones(4), rtol=0, atol=0)
    # (Forward mode keeps onnax's own JVP of the node.)
    np.testing.assert_allclose(
        run(onnax.jvp(relu), {"x": x, "x_tangent": np.ones(4, np.float32)})["loss_tangent"], 2.0, rtol=0
    )
