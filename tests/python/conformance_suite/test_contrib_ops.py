"""ONNX Runtime's contrib ops (com.microsoft Gelu, FastGelu, BiasGelu, QuickGelu, FusedMatMul,
BiasAdd, SkipLayerNormalization, SkipSimplifiedLayerNormalization, and the default-domain
SimplifiedLayerNormalization ONNX Runtime registers), as its transformer optimizer writes them.

Backend-style, per op: the source runs in ONNX Runtime (which implements the op; BiasAdd has no
CPU kernel, so its forward is checked against the JAX formula only); vmap against per-example
runs of the source; jvp and vjp against JAX float64 implementations of the ops' definitions;
and a small transformer block of several contrib ops under grad and vmap(grad) against JAX."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import jax.scipy.special as jsp  # noqa: E402

onnax = pytest.importorskip("onnax")

MS = "com.microsoft"
S, H = 3, 8  # sequence, hidden


def gelu(x: Any) -> Any:
    return 0.5 * x * (1 + jsp.erf(x / np.sqrt(2)))


def fast_gelu(x: Any) -> Any:
    return 0.5 * x * (1 + jnp.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def layer_norm(x: Any, g: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    inv = 1 / jnp.sqrt(jnp.mean((x - mean) ** 2, axis=-1, keepdims=True) + eps)
    return (x - mean) * inv * g + b, mean, inv


def rms_norm(x: Any, g: Any, eps: float) -> tuple[Any, Any]:
    inv = 1 / jnp.sqrt(jnp.mean(x**2, axis=-1, keepdims=True) + eps)
    return x * inv * g, inv


# Inputs named here are weights: the same for every example, no leading batch dim.
WEIGHTS = {"b", "g", "beta", "bias"}


@dataclass
class Case:
    op: str
    inputs: dict[str, list[int]]  # per example; data inputs (not WEIGHTS) get a leading dim N
    outputs: list[str]
    reference: Callable[..., tuple[Any, ...]]  # JAX, the inputs in order -> the outputs in order
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = MS
    ort_kernel: bool = True


CASES = [
    Case("Gelu", {"x": [S, H]}, ["y"], lambda x: (gelu(x),)),
    Case("FastGelu", {"x": [S, H], "b": [H]}, ["y"], lambda x, b: (fast_gelu(x + b),)),
    Case("BiasGelu", {"x": [S, H], "b": [H]}, ["y"], lambda x, b: (gelu(x + b),)),
    Case("QuickGelu", {"x": [S, H]}, ["y"], lambda x: (x * jax.nn.sigmoid(1.25 * x),), {"alpha": 1.25}),
    Case(
        "FusedMatMul",
        {"a": [2, H, S], "b": [2, 5, H]},
        ["y"],
        lambda a, b: (0.5 * jnp.swapaxes(a, -1, -2) @ jnp.swapaxes(b, -1, -2),),
        {"transA": 1, "transB": 1, "alpha": 0.5},
    ),
    Case(
        "BiasAdd", {"x": [S, H], "b": [H], "s": [S, H]}, ["y"], lambda x, b, s: (x + b + s,), ort_kernel=False
    ),
    Case(
        "SkipLayerNormalization",
        {"x": [S, H], "s": [S, H], "g": [H], "beta": [H], "bias": [H]},
        ["y", "mean", "inv", "sum"],
        lambda x, s, g, beta, bias: (*layer_norm(x + s + bias, g, beta, 1e-5), x + s + bias),
        {"epsilon": 1e-5},
    ),
    Case(
        "SkipSimplifiedLayerNormalization",
        {"x": [S, H], "s": [S, H], "g": [H], "bias": [H]},
        ["y", "", "inv", "sum"],
        lambda x, s, g, bias: (
            rms_norm(x + s + bias, g, 1e-5)[0],
            rms_norm(x + s + bias, g, 1e-5)[1],
            x + s + bias,
        ),
        {"epsilon": 1e-5},
    ),
    Case(
        "SimplifiedLayerNormalization",
        {"x": [S, H], "g": [H]},
        ["y", "inv"],
        lambda x, g: rms_norm(x, g, 1e-6),
        {"epsilon": 1e-6, "axis": -1},
        domain="",
    ),
]


def model_of(case: Case) -> onnx.ModelProto:
    node = helper.make_node(case.op, list(case.inputs), case.outputs, domain=case.domain, **case.attrs)
    imports = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(MS, 1)] if case.domain else [])
    graph = helper.make_graph(
        [node],
        case.op,
        [
            helper.make_tensor_value_info(k, TensorProto.FLOAT, v if k in WEIGHTS else ["N", *v])
            for k, v in case.inputs.items()
        ],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in case.outputs if o],
    )
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def draw(case: Case, rng: np.random.Generator, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Data inputs with the leading dims `lead`, weights without."""
    return {
        k: rng.standard_normal(tuple(v) if k in WEIGHTS else (*lead, *v)).astype(np.float32)
        for k, v in case.inputs.items()
    }


def outputs(case: Case) -> list[str]:
    return [o for o in case.outputs if o]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.op)
def test_vmap_matches_per_example_runs_of_the_source(case: Case) -> None:
    rng = np.random.default_rng(0)
    model = model_of(case)
    stacked = draw(case, rng, (4, 2))
    axes = {k: None if k in WEIGHTS else 0 for k in case.inputs}
    got = run(onnax.vmap(model, in_axes=axes), stacked)
    for b in range(4):
        example = {k: v if k in WEIGHTS else v[b] for k, v in stacked.items()}
        if case.ort_kernel:
            expected = run(model, example)
        else:
            values = case.reference(*(example[k].astype(np.float64) for k in case.inputs))
            expected = dict(zip(outputs(case), values, strict=True))
        for o in outputs(case):
            np.testing.assert_allclose(got[o][b], expected[o], rtol=2e-5, atol=2e-6, err_msg=f"{case.op} {o}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.op)
def test_jvp_and_vjp_match_jax(case: Case) -> None:
    rng = np.random.default_rng(1)
    model = model_of(case)
    names = list(case.inputs)
    x = draw(case, rng, (2,))
    t = draw(case, rng, (2,))
    x64 = [x[k].astype(np.float64) for k in names]
    primal, tangents = jax.jvp(case.reference, x64, [t[k].astype(np.float64) for k in names])

    out = run(onnax.jvp(model, inputs=names), {**x, **{f"{k}_tangent": t[k] for k in names}})
    source = run(model, x) if case.ort_kernel else dict(zip(outputs(case), primal, strict=True))
    for o, p, tan in zip(outputs(case), primal, tangents, strict=True):
        np.testing.assert_allclose(out[o], source[o], rtol=2e-5, atol=2e-6, err_msg=f"{case.op} {o}")
        np.testing.assert_allclose(out[o], p, rtol=2e-5, atol=2e-6, err_msg=f"{case.op} {o} vs JAX")
        np.testing.assert_allclose(out[f"{o}_tangent"], tan, rtol=1e-4, atol=1e-5, err_msg=f"{case.op} {o}")

    cot = {
        o: rng.standard_normal(np.shape(p)).astype(np.float32)
        for o, p in zip(outputs(case), primal, strict=True)
    }
    _, pullback = jax.vjp(case.reference, *x64)
    expected = pullback(tuple(cot[o].astype(np.float64) for o in outputs(case)))
    got = run(onnax.vjp(model, inputs=names), {**x, **{f"{o}_cotangent": c for o, c in cot.items()}})
    for k, e in zip(names, expected, strict=True):
        np.testing.assert_allclose(got[f"{k}_cotangent"], e, rtol=1e-4, atol=1e-5, err_msg=f"{case.op} {k}")


def block_model() -> onnx.ModelProto:
    """h = SkipLayerNormalization(x, r; g, beta, bias); f = FastGelu(FusedMatMul(h, W1^T), c1);
    y = SimplifiedLayerNormalization(BiasGelu(f W2, c2)); loss = sum(y^2): ORT-optimizer style."""
    nodes = [
        helper.make_node(
            "SkipLayerNormalization", ["x", "r", "g", "beta", "bias"], ["h"], domain=MS, epsilon=1e-5
        ),
        helper.make_node("FusedMatMul", ["h", "W1"], ["m1"], domain=MS, transB=1, alpha=1.0),
        helper.make_node("FastGelu", ["m1", "c1"], ["f"], domain=MS),
        helper.make_node("MatMul", ["f", "W2"], ["m2"]),
        helper.make_node("BiasGelu", ["m2", "c2"], ["u"], domain=MS),
        helper.make_node("SimplifiedLayerNormalization", ["u", "g2"], ["y"], epsilon=1e-6, axis=-1),
        helper.make_node("Mul", ["y", "y"], ["y2"]),
        helper.make_node("ReduceSum", ["y2"], ["loss"], keepdims=0),
    ]
    shapes: dict[str, list[str | int]] = {"x": ["N", S, H], "r": ["N", S, H]}
    weights: dict[str, list[str | int]] = {
        "g": [H],
        "beta": [H],
        "bias": [H],
        "W1": [16, H],
        "c1": [16],
        "W2": [16, H],
        "c2": [H],
        "g2": [H],
    }
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in {**shapes, **weights}.items()],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    )
    imports = [helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def block_jax(p: dict[str, Any], x: Any, r: Any) -> Any:
    h = layer_norm(x + r + p["bias"], p["g"], p["beta"], 1e-5)[0]
    f = fast_gelu(h @ p["W1"].T + p["c1"])
    u = gelu(f @ p["W2"] + p["c2"])
    return jnp.sum(rms_norm(u, p["g2"], 1e-6)[0] ** 2)


def test_a_block_of_contrib_ops_grad_and_vmap_grad_match_jax() -> None:
    rng = np.random.default_rng(2)
    model = block_model()
    weights = [i.name for i in model.graph.input if i.name not in ("x", "r")]
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    p = {k: (rng.standard_normal(shapes[k]) * 0.5).astype(np.float32) for k in weights}
    x = rng.standard_normal((2, S, H)).astype(np.float32)
    r = rng.standard_normal((2, S, H)).astype(np.float32)
    p64 = {k: v.astype(np.float64) for k, v in p.items()}

    source = run(model, {**p, "x": x, "r": r})["loss"]
    out = run(onnax.grad(model, inputs=weights, output="loss"), {**p, "x": x, "r": r})
    np.testing.assert_allclose(out["loss"], source, rtol=1e-5)
    expected = jax.grad(block_jax)(p64, x.astype(np.float64), r.astype(np.float64))
    for k in weights:
        np.testing.assert_allclose(out[f"{k}_grad"], expected[k], rtol=1e-4, atol=1e-4, err_msg=k)

    per_example = onnax.vmap(onnax.grad(model, inputs=["x"], output="loss"), in_axes={"x": 0, "r": 0})
    xs, rs = (
        rng.standard_normal((3, 1, S, H)).astype(np.float32),
        rng.standard_normal((3, 1, S, H)).astype(np.float32),
    )
    got = run(per_example, {**p, "x": xs, "r": rs})["x_grad"]
    want = jax.vmap(jax.grad(block_jax, argnums=1), in_axes=(None, 0, 0))(
        p64, xs.astype(np.float64), rs.astype(np.float64)
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert not any(n.domain == MS for n in onnax.grad(model, inputs=["x"], output="loss").graph.node)


def test_fused_matmul_of_operands_of_unknown_rank_is_exact() -> None:
    """Without ranks the transposes cannot be spelled as Transpose perms: the expansion uses an
    Einsum over the batch axes; jvp against the product rule in float64."""
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, transA=1, alpha=2.0)
    graph = helper.make_graph(
        [node],
        "fm",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, None),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)], ir_version=10
    )
    rng = np.random.default_rng(3)
    a, ta = rng.standard_normal((2, 2, 4, 3)).astype(np.float32)
    b, tb = rng.standard_normal((2, 2, 4, 5)).astype(np.float32)
    out = run(onnax.jvp(model, inputs=["a", "b"]), {"a": a, "b": b, "a_tangent": ta, "b_tangent": tb})
    at, tat = (np.swapaxes(v.astype(np.float64), -1, -2) for v in (a, ta))
    np.testing.assert_allclose(out["y"], run(model, {"a": a, "b": b})["y"], rtol=1e-6)
    np.testing.assert_allclose(out["y"], 2 * at @ b, rtol=1e-5)
    np.testing.assert_allclose(out["y_tangent"], 2 * (tat @ b + at @ tb), rtol=1e-5)


@pytest.mark.parametrize("transform", ["vmap", "grad"])
def test_an_unexpanded_contrib_op_is_refused_with_the_fusion_to_turn_off(transform: str) -> None:
    """com.microsoft Attention (ORT's BERT fusion) is not expanded: the refusal says it is an ORT
    contrib op and which optimizer option avoids it, not "unknown op" with an internal value."""
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], domain=MS, num_heads=2)
    graph = helper.make_graph(
        [node, helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)],
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", S, H])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [
            helper.make_tensor("w", TensorProto.FLOAT, [H, 3 * H], np.zeros(3 * H * H).tolist()),
            helper.make_tensor("b", TensorProto.FLOAT, [3 * H], np.zeros(3 * H).tolist()),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)], ir_version=10
    )
    with pytest.raises(onnax.OnnaxError) as err:
        onnax.vmap(model) if transform == "vmap" else onnax.grad(model, inputs=["x"], output="loss")
    message = str(err.value)
    assert "com.microsoft::Attention" in message and "ONNX Runtime contrib op" in message
    assert "enable_attention = False" in message and "Fix:" in message
    assert "FusedMatMul" in message  # the ops it does expand are listed
