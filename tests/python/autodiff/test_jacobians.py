"""jacfwd, jacrev and hessian against JAX's (float64) on the same math: hand-built models, a
Loop, a symbolic batch dim, a jax2onnx export with a `lax.fori_loop`, and the command line.

JAX's layout: each block has the output's dims, then the input's; blocks nest outputs outer,
inputs inner. The results must also run in ONNX Runtime as one graph.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from oracles.training_oracle import run

jax.config.update("jax_enable_x64", True)

F = T.FLOAT
RNG = np.random.default_rng(7)
W0 = RNG.standard_normal((3, 4)).astype(np.float32)
B0 = RNG.standard_normal((4,)).astype(np.float32)
X0 = RNG.standard_normal((2, 3)).astype(np.float32)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, list[Any]]],
    outputs: list[tuple[str, list[Any]]],
    inits: tuple[onnx.TensorProto, ...] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
        initializer=list(inits),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def mlp(batch: Any = 2) -> onnx.ModelProto:
    """y = tanh(x @ w + b) (batch x 4) and loss = sum(y^2) / 2; w an initializer."""
    return _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["y"]),
            helper.make_node("Mul", ["y", "y"], ["sq"]),
            helper.make_node("ReduceSum", ["sq"], ["s"], keepdims=0),
            helper.make_node("Mul", ["s", "half"], ["loss"]),
        ],
        [("x", [batch, 3]), ("b", [4])],
        [("y", [batch, 4]), ("loss", [])],
        (numpy_helper.from_array(W0, "w"), numpy_helper.from_array(np.array(0.5, np.float32), "half")),
    )


def mlp_jax(x: Any, w: Any, b: Any) -> tuple[Any, Any]:
    y = jnp.tanh(x @ w + b)
    return y, jnp.sum(y * y) / 2


def _f64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [a.astype(np.float64) for a in arrays]


@pytest.mark.parametrize("transform", [onnax.jacfwd, onnax.jacrev])
def test_jacobians_of_two_outputs_match_jax(transform: Any) -> None:
    model = mlp()
    result = transform(model, inputs=["x", "w"], outputs=["y", "loss"])
    names = [o.name for o in result.graph.output]
    assert names == ["y", "loss", "y_jacobian_x", "y_jacobian_w", "loss_jacobian_x", "loss_jacobian_w"]
    got = run(result, {"x": X0, "b": B0})
    x, w, b = _f64(X0, W0, B0)
    jax_fn = jax.jacfwd if transform is onnax.jacfwd else jax.jacrev
    (jy_x, jy_w), (jl_x, jl_w) = jax_fn(mlp_jax, argnums=(0, 1))(x, w, b)
    for name, want in [
        ("y_jacobian_x", jy_x),
        ("y_jacobian_w", jy_w),
        ("loss_jacobian_x", jl_x),
        ("loss_jacobian_w", jl_w),
    ]:
        assert got[name].shape == want.shape, name
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(got["y"], mlp_jax(x, w, b)[0], rtol=1e-6, atol=1e-6)
    # The declared shapes are JAX's layout too.
    declared = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in result.graph.output}
    assert declared["y_jacobian_w"] == [2, 4, 3, 4]
    assert declared["loss_jacobian_x"] == [2, 3]


def test_default_selection_is_that_of_jvp_and_vjp() -> None:
    # vjp/jvp select the float runtime inputs (x, b) and every float output.
    result = onnax.jacrev(mlp())
    assert [o.name for o in result.graph.output][2:] == [
        "y_jacobian_x",
        "y_jacobian_b",
        "loss_jacobian_x",
        "loss_jacobian_b",
    ]
    got = run(result, {"x": X0, "b": B0})
    x, w, b = _f64(X0, W0, B0)
    (_, jy_b), (_, jl_b) = jax.jacrev(mlp_jax, argnums=(0, 2))(x, w, b)
    np.testing.assert_allclose(got["y_jacobian_b"], jy_b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["loss_jacobian_b"], jl_b, rtol=1e-5, atol=1e-6)


def test_symbolic_batch_dim_stays_symbolic() -> None:
    result = onnax.jacrev(mlp("N"), inputs=["x"], outputs=["y"])
    out = next(o for o in result.graph.output if o.name == "y_jacobian_x")
    dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
    assert dims == ["N", 4, "N", 3]
    w, b = _f64(W0, B0)
    for n in (1, 3):
        x = RNG.standard_normal((n, 3)).astype(np.float32)
        got = run(result, {"x": x, "b": B0})["y_jacobian_x"]
        want = jax.jacrev(lambda x_: mlp_jax(x_, w, b)[0])(x.astype(np.float64))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_hessian_matches_jax() -> None:
    result = onnax.hessian(mlp(), inputs=["x", "w"], output="loss")
    names = [o.name for o in result.graph.output]
    assert names[2:] == [
        "loss_jacobian_x",
        "loss_jacobian_w",
        "loss_hessian_x_x",
        "loss_hessian_x_w",
        "loss_hessian_w_x",
        "loss_hessian_w_w",
    ]
    got = run(result, {"x": X0, "b": B0})
    x, w, b = _f64(X0, W0, B0)
    h = jax.hessian(lambda x_, w_: mlp_jax(x_, w_, b)[1], argnums=(0, 1))(x, w)
    for (a, bb), name in zip([(0, 0), (0, 1), (1, 0), (1, 1)], names[4:], strict=True):
        assert got[name].shape == h[a][bb].shape
        np.testing.assert_allclose(got[name], h[a][bb], rtol=1e-4, atol=1e-5, err_msg=name)
    # jvp(jacrev(f)) defaults differentiate the Jacobian outputs, so the chain composes.
    np.testing.assert_allclose(
        got["loss_jacobian_w"], jax.grad(lambda w_: mlp_jax(x, w_, b)[1])(w), rtol=1e-5
    )


def _loop_model() -> onnx.ModelProto:
    """h <- tanh(h @ w) three times from h = x, in a Loop; output the final h."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", "w"], ["hw"]),
            helper.make_node("Tanh", ["hw"], ["h_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("it", T.INT64, []),
            helper.make_tensor_value_info("c_in", T.BOOL, []),
            helper.make_tensor_value_info("h_in", F, [2, 3]),
        ],
        [
            helper.make_tensor_value_info("c_out", T.BOOL, []),
            helper.make_tensor_value_info("h_out", F, [2, 3]),
        ],
    )
    return _model(
        [
            helper.make_node("Constant", [], ["m"], value=numpy_helper.from_array(np.array(3, np.int64))),
            helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.array(True))),
            helper.make_node("Loop", ["m", "t", "x"], ["h"], body=body),
        ],
        [("x", [2, 3]), ("w", [3, 3])],
        [("h", [2, 3])],
    )


@pytest.mark.parametrize("transform", [onnax.jacfwd, onnax.jacrev])
def test_jacobian_through_a_loop(transform: Any) -> None:
    w0 = (RNG.standard_normal((3, 3)) * 0.5).astype(np.float32)

    def f(x: Any, w: Any) -> Any:
        h = x
        for _ in range(3):
            h = jnp.tanh(h @ w)
        return h

    got = run(transform(_loop_model()), {"x": X0, "w": w0})
    jx, jw = jax.jacrev(f, argnums=(0, 1))(*_f64(X0, w0))
    np.testing.assert_allclose(got["h_jacobian_x"], jx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["h_jacobian_w"], jw, rtol=1e-5, atol=1e-6)


def test_jax2onnx_export_with_a_fori_loop() -> None:
    jax2onnx = pytest.importorskip("jax2onnx")

    def f(x: Any, w: Any) -> Any:
        # (w rides in the carry: jax2onnx 0.17 cannot export a body that closes over it.)
        return jax.lax.fori_loop(0, 2, lambda i, c: (jnp.sin(c[0] @ c[1]) + c[0], c[1]), (x, w))[0]

    w0 = (RNG.standard_normal((3, 3)) * 0.5).astype(np.float32)
    spec = [jax.ShapeDtypeStruct((2, 3), jnp.float32), jax.ShapeDtypeStruct((3, 3), jnp.float32)]
    with jax.enable_x64(False):
        exported = jax2onnx.to_onnx(f, spec, model_name="fori")
    model = onnx.load_from_string(exported.SerializeToString())
    x_name, w_name = [i.name for i in model.graph.input]
    out = model.graph.output[0].name
    want = jax.hessian(lambda w: jnp.sum(f(X0.astype(np.float64), w) ** 2))(w0.astype(np.float64))
    jx, jw = jax.jacrev(f, argnums=(0, 1))(*_f64(X0, w0))
    for transform in (onnax.jacfwd, onnax.jacrev):
        got = run(transform(model), {x_name: X0, w_name: w0})
        np.testing.assert_allclose(got[f"{out}_jacobian_{x_name}"], jx, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[f"{out}_jacobian_{w_name}"], jw, rtol=1e-5, atol=1e-6)
    # A Hessian of a loss on the export (its loss added with onnax).
    loss = onnax.add_loss(model, "mse", output=out)
    zeros = np.zeros((2, 3), np.float32)
    h = run(onnax.hessian(loss, inputs=[w_name], output="loss"), {x_name: X0, w_name: w0, "label": zeros})
    # mse = mean((f - 0)^2) = sum(f^2) / 6.
    np.testing.assert_allclose(h[f"loss_hessian_{w_name}_{w_name}"], want / 6, rtol=1e-4, atol=1e-5)


def test_command_line_matches_python(tmp_path: Path) -> None:
    onnx.save(mlp(), tmp_path / "m.onnx")
    cli = [sys.executable, "-m", "onnax"]
    for args, want_model in [
        (["jacobian", "--inputs", "x", "--outputs", "y", "--mode", "fwd"], onnax.jacfwd(mlp(), ["x"], ["y"])),
        (["jacobian", "--inputs", "x,w", "--outputs", "loss"], onnax.jacrev(mlp(), ["x", "w"], ["loss"])),
        (["hessian", "--inputs", "w", "--output", "loss"], onnax.hessian(mlp(), ["w"], "loss")),
    ]:
        out = tmp_path / f"{args[0]}.onnx"
        subprocess.run([*cli, args[0], str(tmp_path / "m.onnx"), "-o", str(out), *args[1:]], check=True)
        got, want = run(onnx.load(out), {"x": X0, "b": B0}), run(want_model, {"x": X0, "b": B0})
        assert list(got) == list(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    bad = subprocess.run(
        [*cli, "jacobian", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "j.onnx"), "--mode", "x"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--mode is 'x'; expected rev or fwd" in bad.stderr


def test_hessian_of_several_outputs_is_refused() -> None:
    with pytest.raises(onnax.OnnaxError, match=r"hessian: 2 float outputs are selected \('y', 'loss'\)"):
        onnax.hessian(mlp(), inputs=["x"])


def _tanh_model(opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Tanh", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", F, ["N", 3])],
        [helper.make_tensor_value_info("y", F, ["N", 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


@pytest.mark.parametrize("transform", [onnax.jacfwd, onnax.jacrev, onnax.hessian])
def test_sources_below_opset_18_come_back_at_their_opset(transform: Any) -> None:
    # (tf2onnx and older torch exports: the result must pass the checker at the source's opset.)
    source = _tanh_model(13)
    result = transform(source, outputs=["y"]) if transform is not onnax.hessian else transform(source)
    onnx.checker.check_model(result, full_check=True)
    assert next(o.version for o in result.opset_import if o.domain in ("", "ai.onnx")) == 13
    x = X0[:, :3].copy()
    got = run(result, {"x": x})
    want = jax.jacrev(jnp.tanh)(x.astype(np.float64))
    np.testing.assert_allclose(got["y_jacobian_x"], want, rtol=1e-5, atol=1e-6)
    if transform is onnax.hessian:
        np.testing.assert_allclose(
            got["y_hessian_x_x"], jax.hessian(jnp.tanh)(x.astype(np.float64)), rtol=1e-4, atol=1e-6
        )


def test_an_empty_batch_keeps_its_zero_dims() -> None:
    # (A dim of size 0 is a size to Reshape, not "copy the input's dim".)
    empty = np.zeros((0, 3), np.float32)
    for transform in (onnax.jacfwd, onnax.jacrev):
        assert run(transform(_tanh_model(18)), {"x": empty})["y_jacobian_x"].shape == (0, 3, 0, 3)


def test_steps_record_their_derivatives() -> None:
    import json

    result = onnax.hessian(mlp(), inputs=["w"], output="loss")
    step = json.loads(next(p.value for p in result.metadata_props if p.key == "onnax.transforms"))[-1]
    assert step["transform"] == "hessian" and step["inputs"] == ["w"] and step["outputs"] == ["loss"]
    assert step["derivatives"] == ["loss_jacobian_w", "loss_hessian_w_w"]


CORPUS = Path(__file__).resolve().parents[3] / "conformance" / "corpus" / "models"


@pytest.mark.parametrize(
    ("name", "wrt"),
    [("jax_mlp", "x"), ("torch_mlp", "x"), ("jax_gru_scan", "h0"), ("jax_cnn_gap", "x")],
)
def test_corpus_models_against_jax_jacobians(name: str, wrt: str) -> None:
    # The oracle: jax.jacrev / jax.hessian of the source interpreted op by op in JAX float64
    # (onnax.testing._jax_reference, itself checked against ONNX Runtime).
    from onnax.testing import _jax_reference as onnx_jax

    model = onnx.load(CORPUS / f"{name}.onnx")
    data = np.load(CORPUS / f"{name}.npz")
    feeds = {i.name: data[f"jvp/feed/{i.name}"][:2] for i in model.graph.input}
    out = model.graph.output[1].name
    source = onnx_jax.interpret(model)
    names = [o.name for o in model.graph.output]

    def f(v: Any, which: str) -> Any:
        values = {k: (v if k == wrt else jnp.asarray(x, jnp.float64)) for k, x in feeds.items()}
        return source(values)[names.index(which)]

    x64 = jnp.asarray(feeds[wrt], jnp.float64)
    for transform in (onnax.jacfwd, onnax.jacrev):
        got = run(transform(model, inputs=[wrt], outputs=[out]), feeds)[f"{out}_jacobian_{wrt}"]
        np.testing.assert_allclose(got, jax.jacrev(lambda v: f(v, out))(x64), rtol=2e-4, atol=2e-5)
    hess = run(onnax.hessian(model, inputs=[wrt], output="loss"), feeds)[f"loss_hessian_{wrt}_{wrt}"]
    np.testing.assert_allclose(hess, jax.hessian(lambda v: f(v, "loss"))(x64), rtol=2e-3, atol=2e-4)
