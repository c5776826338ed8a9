"""Surrogate gradients of spikes, against spyx 1.0.0's own JAX numbers (tests/python/models/spyx):
its surrogate derivatives on a grid through the kinks, and float64 BPTT gradients of three
spiking networks (LIF, adaptive LIF, recurrent LIF) for six surrogates, through spyx's own
sequence export (a jax2onnx Loop) and through onnax's scan of spyx's step export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles.spyx_models import append_half_sum_of_squares, run, spyx, zero_state

SPYX = Path(__file__).resolve().parents[1] / "models" / "spyx"
SURROGATES = {
    "superspike_k25": "superspike:k=25",
    "arctan_k2": "arctan:k=2",
    "triangular_k2": "triangular:k=2",
    "boxcar_w2_h0.5": "boxcar:width=2,height=0.5",
    "tanh_k1": "tanh:k=1",
    "straight_through": "straight_through",
}
F = TensorProto.FLOAT


def spike_model(form: str) -> onnx.ModelProto:
    """y = spike(x) in one of the forms exporters write; H(x) = 1 for x > 0."""
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    inits = [zero]
    if form == "greater_cast":
        nodes = [
            helper.make_node("Greater", ["x", "zero"], ["c"]),
            helper.make_node("Cast", ["c"], ["y"], to=F),
        ]
    elif form == "less_cast":  # 0 < x
        nodes = [helper.make_node("Less", ["zero", "x"], ["c"]), helper.make_node("Cast", ["c"], ["y"], to=F)]
    elif form == "where_int_cast":  # spyx: Where(x > 0, int32 ones, int32 zeros) then Cast
        inits += [
            numpy_helper.from_array(np.ones(6, np.int32), "ones"),
            numpy_helper.from_array(np.zeros(6, np.int32), "zeros"),
        ]
        nodes = [
            helper.make_node("Greater", ["x", "zero"], ["c"]),
            helper.make_node("Where", ["c", "ones", "zeros"], ["w"]),
            helper.make_node("Cast", ["w"], ["y"], to=F),
        ]
    elif form == "where_scaled":  # 3 H(x) - 1: scaled by v1 - v0 = 3
        inits += [
            numpy_helper.from_array(np.array(2.0, np.float32), "v1"),
            numpy_helper.from_array(np.array(-1.0, np.float32), "v0"),
        ]
        nodes = [
            helper.make_node("Greater", ["x", "zero"], ["c"]),
            helper.make_node("Where", ["c", "v1", "v0"], ["y"]),
        ]
    else:  # sign: H(x) - H(-x), twice the derivative
        nodes = [helper.make_node("Sign", ["x"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "spike",
        [helper.make_tensor_value_info("x", F, [6])],
        [helper.make_tensor_value_info("y", F, [6])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


SCALE = {"greater_cast": 1.0, "less_cast": 1.0, "where_int_cast": 1.0, "where_scaled": 3.0, "sign": 2.0}


@pytest.mark.parametrize("form", list(SCALE))
@pytest.mark.parametrize("name", list(SURROGATES))
def test_surrogate_derivative_is_spyx_on_a_grid_through_the_kinks(name: str, form: str) -> None:
    grid = np.load(SPYX / "surrogates_ref.npz")
    model = spike_model(form)
    jvp = onnax.jvp(model, inputs=["x"], surrogate=SURROGATES[name])
    x = grid["x"].astype(np.float32)
    got = np.concatenate(
        [run(jvp, {"x": x[i : i + 6], "x_tangent": np.ones(6, np.float32)})[1] for i in range(0, len(x), 6)]
    )
    np.testing.assert_allclose(got, SCALE[form] * grid[f"{name}/grad"], rtol=1e-5, atol=1e-6)
    # The forward pass is the model's own, bit for bit.
    for i in range(0, len(x), 6):
        chunk = x[i : i + 6]
        np.testing.assert_array_equal(
            run(jvp, {"x": chunk, "x_tangent": chunk})[0], run(model, {"x": chunk})[0]
        )
    # Without a surrogate the spike has no derivative.
    plain = onnax.jvp(model, inputs=["x"])
    assert not run(plain, {"x": x[:6], "x_tangent": np.ones(6, np.float32)})[1].any()


@pytest.mark.parametrize("net", ["lif", "alif", "rlif"])
@pytest.mark.parametrize("name", list(SURROGATES))
def test_bptt_with_surrogates_equals_spyx(net: str, name: str) -> None:
    step_model, seq_model, ref, _ = spyx(net)
    grads = np.load(SPYX / f"{net}_grads_{name}.npz")
    params = json.loads((SPYX / "params_map.json").read_text())[net]
    for model, key in ((seq_model, "seq_initializer"), (onnax.scan(step_model), "step_initializer")):
        inits = {k: v[key] for k, v in params.items()}
        loss_model = append_half_sum_of_squares(model, model.graph.output[0].name)
        selected = ["x", "state_0", "state_1", *inits.values()]
        g = onnax.grad(loss_model, inputs=selected, output="loss", surrogate=SURROGATES[name])
        names = [o.name for o in g.graph.output]
        values = dict(zip(names, run(g, {"x": ref["x_seq"], **zero_state(ref)}), strict=True))
        np.testing.assert_allclose(values["loss"], grads["loss"], rtol=1e-5)
        pairs = {**{f"{init}_grad": f"grad/{k}" for k, init in inits.items()}, "x_grad": "grad/x_seq"}
        pairs |= {"state_0_grad": "grad/state_0", "state_1_grad": "grad/state_1"}
        for ours, theirs in pairs.items():
            scale = np.abs(grads[theirs]).max()
            np.testing.assert_allclose(
                values[ours], grads[theirs], rtol=1e-4, atol=1e-5 * scale, err_msg=ours
            )


def test_one_spike_by_name_and_refusals() -> None:
    # Two spikes; only the first gets a surrogate.
    graph = helper.make_graph(
        [
            helper.make_node("Greater", ["x", "zero"], ["c1"]),
            helper.make_node("Cast", ["c1"], ["s1"], to=F),
            helper.make_node("Neg", ["x"], ["nx"]),
            helper.make_node("Greater", ["nx", "zero"], ["c2"]),
            helper.make_node("Cast", ["c2"], ["s2"], to=F),
            helper.make_node("Add", ["s1", "s2"], ["y"]),
        ],
        "two",
        [helper.make_tensor_value_info("x", F, [6])],
        [helper.make_tensor_value_info("y", F, [6])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    x = np.array([-2, -0.5, -0.01, 0.01, 0.5, 2], np.float32)
    jvp = onnax.jvp(model, inputs=["x"], surrogate="s1=triangular:k=2")
    np.testing.assert_allclose(
        run(jvp, {"x": x, "x_tangent": np.ones(6, np.float32)})[1],
        np.maximum(0, 1 - np.abs(2 * x)),
        rtol=1e-6,
    )
    with pytest.raises(onnax.OnnaxError, match=r"'nx' is not a spike \(spikes found: \[s1, s2\]\)"):
        onnax.with_surrogates(model, "nx=superspike")
    with pytest.raises(onnax.OnnaxError, match=r"unknown kind 'sigmoidish'.*Fix"):
        onnax.with_surrogates(model, "sigmoidish")
    with pytest.raises(onnax.OnnaxError, match=r"'q=3' is not a parameter of arctan \(parameters: k\)"):
        onnax.with_surrogates(model, "arctan:q=3")
    with pytest.raises(onnax.OnnaxError, match=r"k = '-1' is not a positive number"):
        onnax.with_surrogates(model, "superspike:k=-1")
    no_spike = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "relu",
            [helper.make_tensor_value_info("x", F, [6])],
            [helper.make_tensor_value_info("y", F, [6])],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=10,
    )
    with pytest.raises(onnax.OnnaxError, match=r"the model has no spike.*Fix"):
        onnax.grad(no_spike, surrogate="superspike")


def test_cli_and_training_step_with_a_surrogate(tmp_path: Path) -> None:
    _, seq_model, ref, _ = spyx("lif")
    grads = np.load(SPYX / "lif_grads_arctan_k2.npz")
    params = json.loads((SPYX / "params_map.json").read_text())["lif"]
    kernel = params["layers.0.kernel"]["seq_initializer"]
    loss_model = append_half_sum_of_squares(seq_model, "loop_out_0")
    onnx.save(loss_model, tmp_path / "loss.onnx")
    r = subprocess.run(
        [sys.executable, "-m", "onnax", "grad", str(tmp_path / "loss.onnx"), "-o", str(tmp_path / "g.onnx"),
         "--inputs", kernel, "--surrogate", "arctan:alpha=2"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = run(onnx.load(tmp_path / "g.onnx"), {"x": ref["x_seq"], **zero_state(ref)})
    np.testing.assert_allclose(out[1], grads["grad/layers.0.kernel"], rtol=1e-4, atol=1e-6)
    # One SGD step: the kernel moves by -lr times spyx's gradient.
    step = onnax.train_step(
        loss_model, params=[kernel], optimizer="sgd", learning_rate=0.1, surrogate="arctan:k=2"
    )
    state = onnax.initial_state(loss_model, step)
    names = [o.name for o in step.graph.output]
    feeds = {"x": ref["x_seq"], **zero_state(ref), **state}
    new = dict(zip(names, run(step, {i.name: feeds[i.name] for i in step.graph.input}), strict=True))
    start = numpy_helper.to_array(next(t for t in seq_model.graph.initializer if t.name == kernel))
    np.testing.assert_allclose(
        new[f"{kernel}_new"], start - 0.1 * grads["grad/layers.0.kernel"], rtol=1e-5, atol=1e-6
    )


def test_validate_says_it_cannot_replay_surrogates_or_scan(tmp_path: Path) -> None:
    from onnax import testing

    model = spike_model("greater_cast")
    with pytest.raises(testing.ValidationInputError, match=r"surrogate gradients.*Fix"):
        testing.validate(model, onnax.jvp(model, inputs=["x"], surrogate="superspike"))
    step_model, _, _, _ = spyx("lif")
    with pytest.raises(testing.ValidationInputError, match=r"step 0 is scan, which validate does not replay"):
        testing.validate(step_model, onnax.scan(step_model))


def test_second_order_through_a_surrogate_is_jax_custom_jvp() -> None:
    """hessian and jvp(grad) of a model with a spike: the surrogate's derivative is itself
    differentiated, as JAX differentiates a custom_jvp rule."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["w", "x"], ["wx"]),
            helper.make_node("Greater", ["wx", "zero"], ["c"]),
            helper.make_node("Cast", ["c"], ["s"], to=F),
            helper.make_node("Mul", ["s", "wx"], ["p"]),
            helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("w", F, [5]), helper.make_tensor_value_info("x", F, [5])],
        [helper.make_tensor_value_info("loss", F, [])],
        [numpy_helper.from_array(np.array(0, np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)

    @jax.custom_jvp
    def heaviside(x: Any) -> Any:
        return (x > 0).astype(x.dtype)

    @heaviside.defjvp
    def heaviside_jvp(primals: Any, tangents: Any) -> Any:
        (x,), (tx,) = primals, tangents
        return heaviside(x), tx / (1 + 25 * jnp.abs(x)) ** 2

    def f(w: Any, x: Any) -> Any:
        return jnp.sum(heaviside(w * x) * w * x)

    w = np.array([0.3, -0.2, 0.05, 0.5, -0.01], np.float32)
    x = np.array([1.0, 2.0, -1.0, 0.5, 3.0], np.float32)
    hessian = np.asarray(jax.hessian(f)(jnp.asarray(w, jnp.float64), jnp.asarray(x, jnp.float64)))
    h = onnax.hessian(onnax.with_surrogates(model, "superspike"), inputs=["w"])
    np.testing.assert_allclose(run(h, {"w": w, "x": x})[-1], hessian, rtol=1e-5, atol=1e-6)
    hvp = onnax.jvp(onnax.grad(model, inputs=["w"], surrogate="superspike"), inputs=["w"])
    v = RNG_V.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(
        run(hvp, {"w": w, "x": x, "w_tangent": v})[-1], hessian @ v, rtol=1e-5, atol=1e-6
    )


RNG_V = np.random.default_rng(5)
