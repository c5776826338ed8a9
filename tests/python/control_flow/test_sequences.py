"""scan (step -> sequence), step (sequence -> step) and signature, checked numerically.

Oracles: spyx's own exports and references (tests/python/models/spyx: per-step and full-sequence
ONNX of LIF, ALIF and RLIF networks from spyx 1.0.0, spyx/JAX outputs, float64 JAX gradients),
host loops of a step model in ONNX Runtime, and JAX float64 (lax.scan) for hand-written LSTM and
GRU cells, including their vmap and BPTT gradients.
"""

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
from oracles.spyx_models import SPYX, append_half_sum_of_squares, run, session, spyx, zero_state

NETS = ["lif", "alif", "rlif"]
RNG = np.random.default_rng(11)


# --- spyx: scan(step export) equals the sequence export and spyx; step(sequence) the step ---


@pytest.mark.parametrize("name", NETS)
def test_scan_of_spyx_step_is_spyx_sequence(name: str) -> None:
    step_model, seq_model, ref, _ = spyx(name)
    scanned = onnax.scan(step_model)
    onnx.checker.check_model(scanned, full_check=True)
    assert [n.op_type for n in scanned.graph.node].count("Loop") == 1
    feeds = {"x": ref["x_seq"], **zero_state(ref)}
    ours, theirs = run(scanned, feeds), run(seq_model, feeds)
    # step outputs: out, new_state_0, new_state_1 -> out_seq, final_state_0, final_state_1
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ours[0], ref["out_seq"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours[1], ref["final_state_0"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours[2], ref["final_state_1"], rtol=1e-5, atol=1e-5)
    # The step lists one value as its output and its last state; the sequence model keeps the
    # stacked output under the name and gives the final state a new one.
    names = [o.name for o in scanned.graph.output]
    assert names[0] == step_model.graph.output[0].name and len(set(names)) == 3


@pytest.mark.parametrize("name", NETS)
def test_step_of_spyx_sequence_is_spyx_step(name: str) -> None:
    step_model, seq_model, ref, _ = spyx(name)
    extracted = onnax.step(seq_model)
    onnx.checker.check_model(extracted, full_check=True)
    assert not any(n.op_type in ("Loop", "Scan") for n in extracted.graph.node)
    assert [i.name for i in extracted.graph.input] == ["x", "state_0", "state_1"]
    assert [d.dim_value for d in extracted.graph.input[0].type.tensor_type.shape.dim] == [2, 8]
    for feeds in (
        {"x": ref["x_seq"][0], **zero_state(ref)},
        {"x": ref["steprand_x"], "state_0": ref["steprand_state_0"], "state_1": ref["steprand_state_1"]},
    ):
        for a, b in zip(run(extracted, feeds), run(step_model, feeds), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    # No weight copied twice, no constant left unread.
    read = {i for n in extracted.graph.node for i in n.input}
    assert all(t.name in read for t in extracted.graph.initializer)


@pytest.mark.parametrize("name", NETS)
def test_round_trips(name: str) -> None:
    step_model, seq_model, ref, _ = spyx(name)
    feeds = {"x": ref["x_seq"], **zero_state(ref)}
    again = onnax.scan(onnax.step(seq_model))
    for a, b in zip(run(again, feeds), run(seq_model, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    step_again = onnax.step(onnax.scan(step_model))
    one = {"x": ref["steprand_x"], "state_0": ref["steprand_state_0"], "state_1": ref["steprand_state_1"]}
    for a, b in zip(run(step_again, one), run(step_model, one), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", NETS)
def test_signature_matches_spyx(name: str) -> None:
    step_model, seq_model, _, sig = spyx(name)
    for model, theirs, kind in ((step_model, sig["step"], "step"), (seq_model, sig["seq"], "sequence")):
        ours = onnax.signature(model)
        assert ours.kind == kind
        assert list(ours.input_shape or ()) == theirs["input_shape"]
        assert str(ours.input_dtype) == theirs["input_dtype"]
        assert [list(s or ()) for s in ours.state_shapes] == theirs["state_shapes"]
        assert [str(d) for d in ours.state_dtypes] == theirs["state_dtypes"]
        assert list(ours.output_shape or ()) == theirs["output_shape"]
        assert str(ours.output_dtype) == theirs["output_dtype"]
        assert ours.input_names == theirs["input_names"]
        assert ours.num_state == theirs["num_state"]
        assert ours.sequence_length == theirs["sequence_length"]
        # spyx's output_names are nominal ("out", "new_state_0"); ours are the graph's own.
        assert ours.output_names == [o.name for o in model.graph.output]
        zeros = ours.seed_state()
        assert [z.shape for z in zeros] == [tuple(s) for s in theirs["state_shapes"]]
        assert all(not z.any() for z in zeros)


@pytest.mark.parametrize("name", NETS)
def test_bptt_through_scan_matches_spyx_after_the_spikes(name: str) -> None:
    """BPTT through the scanned step: gradients of the layers after the spiking neuron do not
    pass through a spike, so they equal spyx's (the same for every surrogate); the input's
    gradient passes only through the Heaviside, whose derivative is 0 without a surrogate."""
    step_model, _, ref, _ = spyx(name)
    params = json.loads((SPYX / "params_map.json").read_text())[name]
    after = {k: v["step_initializer"] for k, v in params.items() if k.startswith(("layers.2", "layers.3"))}
    grads = np.load(SPYX / f"{name}_grads_superspike_k25.npz")
    scanned = onnax.scan(step_model)
    loss_model = append_half_sum_of_squares(scanned, scanned.graph.output[0].name)
    g = onnax.grad(loss_model, inputs=["x", *after.values()], output="loss")
    values = dict(
        zip([o.name for o in g.graph.output], run(g, {"x": ref["x_seq"], **zero_state(ref)}), strict=True)
    )
    np.testing.assert_allclose(values["loss"], grads["loss"], rtol=1e-5)
    for key, init in after.items():
        np.testing.assert_allclose(values[f"{init}_grad"], grads[f"grad/{key}"], rtol=1e-4, atol=1e-5)
    assert not values["x_grad"].any()


# --- hand-written LSTM and GRU steps against JAX float64 and host loops ---

H, IN, OUT = 5, 3, 2


def lstm_step() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    w = {
        "W": RNG.standard_normal((IN, 4 * H)) * 0.5,
        "U": RNG.standard_normal((H, 4 * H)) * 0.5,
        "b": RNG.standard_normal(4 * H) * 0.1,
        "V": RNG.standard_normal((H, OUT)) * 0.5,
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("MatMul", ["h", "U"], ["hu"]),
        helper.make_node("Add", ["xw", "hu"], ["z0"]),
        helper.make_node("Add", ["z0", "b"], ["z"]),
        helper.make_node("Split", ["z"], ["zi", "zf", "zg", "zo"], axis=1, num_outputs=4),
        helper.make_node("Sigmoid", ["zi"], ["i"]),
        helper.make_node("Sigmoid", ["zf"], ["f"]),
        helper.make_node("Tanh", ["zg"], ["gg"]),
        helper.make_node("Sigmoid", ["zo"], ["o"]),
        helper.make_node("Mul", ["f", "c"], ["fc"]),
        helper.make_node("Mul", ["i", "gg"], ["ig"]),
        helper.make_node("Add", ["fc", "ig"], ["c_next"]),
        helper.make_node("Tanh", ["c_next"], ["tc"]),
        helper.make_node("Mul", ["o", "tc"], ["h_next"]),
        helper.make_node("MatMul", ["h_next", "V"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "lstm_step",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", H]),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, ["batch", H]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", OUT]),
            helper.make_tensor_value_info("h_next", TensorProto.FLOAT, ["batch", H]),
            helper.make_tensor_value_info("c_next", TensorProto.FLOAT, ["batch", H]),
        ],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), w


def gru_step() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A GRU cell with the state first among the inputs and a gain input constant over time:
    the roles must be named (state=["h"], constants=["gain"])."""
    w = {
        "Wz": RNG.standard_normal((IN, H)) * 0.5,
        "Uz": RNG.standard_normal((H, H)) * 0.5,
        "Wr": RNG.standard_normal((IN, H)) * 0.5,
        "Ur": RNG.standard_normal((H, H)) * 0.5,
        "Wn": RNG.standard_normal((IN, H)) * 0.5,
        "Un": RNG.standard_normal((H, H)) * 0.5,
    }
    mm = helper.make_node
    nodes = [
        mm("MatMul", ["x", "Wz"], ["xz"]),
        mm("MatMul", ["h", "Uz"], ["hz"]),
        mm("Add", ["xz", "hz"], ["zz"]),
        mm("Sigmoid", ["zz"], ["z"]),
        mm("MatMul", ["x", "Wr"], ["xr"]),
        mm("MatMul", ["h", "Ur"], ["hr"]),
        mm("Add", ["xr", "hr"], ["rr"]),
        mm("Sigmoid", ["rr"], ["r"]),
        mm("Mul", ["r", "h"], ["rh"]),
        mm("MatMul", ["x", "Wn"], ["xn"]),
        mm("MatMul", ["rh", "Un"], ["hn"]),
        mm("Add", ["xn", "hn"], ["nn"]),
        mm("Tanh", ["nn"], ["n"]),
        mm("Sub", ["h", "n"], ["hmn"]),
        mm("Mul", ["z", "hmn"], ["zh"]),
        mm("Add", ["n", "zh"], ["h_new"]),
        mm("Mul", ["h_new", "gain"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "gru_step",
        [
            helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", H]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN]),
            helper.make_tensor_value_info("gain", TensorProto.FLOAT, [H]),
        ],
        [
            helper.make_tensor_value_info("h_new", TensorProto.FLOAT, ["batch", H]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", H]),
        ],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), w


Arrays = dict[str, np.ndarray]


def host_loop(
    step_model: onnx.ModelProto,
    xs: np.ndarray,
    state: Arrays,
    pairs: dict[str, str],
    consts: Arrays | None = None,
) -> tuple[dict[str, list[np.ndarray]], Arrays]:
    """Runs the step T times in ONNX Runtime, feeding each state output back."""
    sess = session(step_model)
    names = [o.name for o in sess.get_outputs()]
    per_step: dict[str, list[np.ndarray]] = {n: [] for n in names if n not in pairs.values()}
    state = dict(state)
    for t in range(xs.shape[0]):
        out = dict(zip(names, sess.run(None, {"x": xs[t], **state, **(consts or {})}), strict=True))
        for n in per_step:
            per_step[n].append(out[n])
        state = {s: out[o] for s, o in pairs.items()}
    return per_step, state


def test_lstm_scan_equals_a_host_loop_with_symbolic_time_and_batch() -> None:
    step_model, _ = lstm_step()
    seq = onnax.scan(step_model)
    dims = lambda vi: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]  # noqa: E731
    assert dims(seq.graph.input[0]) == ["time", "batch", IN]
    assert dims(seq.graph.output[0]) == ["time", "batch", OUT]
    assert dims(seq.graph.output[1]) == ["batch", H]
    for t, b in ((1, 1), (7, 3)):
        xs = RNG.standard_normal((t, b, IN)).astype(np.float32)
        h0, c0 = (RNG.standard_normal((b, H)).astype(np.float32) for _ in range(2))
        y, h, c = run(seq, {"x": xs, "h": h0, "c": c0})
        per_step, final = host_loop(step_model, xs, {"h": h0, "c": c0}, {"h": "h_next", "c": "c_next"})
        np.testing.assert_allclose(y, np.stack(per_step["y"]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(h, final["h"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c, final["c"], rtol=1e-5, atol=1e-6)


def test_gru_with_named_roles_and_fixed_length() -> None:
    step_model, _ = gru_step()
    seq = onnax.scan(step_model, state={"h": "h_new"}, constants=["gain"], length=6)
    assert seq.graph.input[1].type.tensor_type.shape.dim[0].dim_value == 6
    assert [d.dim_value or d.dim_param for d in seq.graph.input[2].type.tensor_type.shape.dim] == [H]
    xs = RNG.standard_normal((6, 4, IN)).astype(np.float32)
    h0 = RNG.standard_normal((4, H)).astype(np.float32)
    gain = RNG.standard_normal(H).astype(np.float32)
    h, y = run(seq, {"h": h0, "x": xs, "gain": gain})
    per_step, final = host_loop(step_model, xs, {"h": h0}, {"h": "h_new"}, {"gain": gain})
    np.testing.assert_allclose(y, np.stack(per_step["y"]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h, final["h"], rtol=1e-5, atol=1e-6)
    sig = onnax.signature(seq)
    assert (sig.kind, sig.state_names, sig.constants, sig.sequence_length) == ("sequence", ["h"], ["gain"], 6)
    back = onnax.step(seq)
    assert [i.name for i in back.graph.input] == ["h", "x", "gain"]
    one = {"h": h0, "x": xs[0], "gain": gain}
    for a, b in zip(run(back, one), run(step_model, one), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def jax_lstm(w: dict[str, np.ndarray], xs: Any, h0: Any, c0: Any) -> Any:
    import jax
    import jax.numpy as jnp

    def cell(carry: Any, x: Any) -> Any:
        h, c = carry
        z = x @ w["W"] + h @ w["U"] + w["b"]
        i, f, g, o = jnp.split(z, 4, axis=1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h @ w["V"]

    (h, c), ys = jax.lax.scan(cell, (h0, c0), xs)
    return ys, h, c


def test_lstm_bptt_and_per_example_gradients_against_jax() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    step_model, w = lstm_step()
    seq = onnax.scan(step_model)
    loss_model = append_half_sum_of_squares(seq, "y")
    g = onnax.grad(loss_model, inputs=["W", "U", "x"], output="loss")
    t, b = 5, 3
    xs = RNG.standard_normal((t, b, IN)).astype(np.float32)
    h0, c0 = (RNG.standard_normal((b, H)).astype(np.float32) for _ in range(2))
    values = dict(zip([o.name for o in g.graph.output], run(g, {"x": xs, "h": h0, "c": c0}), strict=True))
    w64 = {k: jnp.asarray(v.astype(np.float32), jnp.float64) for k, v in w.items()}

    def loss(wd: dict[str, Any], x: Any, h: Any, c: Any) -> Any:
        ys, _, _ = jax_lstm(wd, x, h, c)
        return 0.5 * jnp.sum(ys**2)

    x64, h64, c64 = (jnp.asarray(a, jnp.float64) for a in (xs, h0, c0))
    dw, dx = jax.grad(loss, argnums=(0, 1))(w64, x64, h64, c64)
    np.testing.assert_allclose(values["loss"], loss(w64, x64, h64, c64), rtol=1e-5)
    np.testing.assert_allclose(values["W_grad"], dw["W"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(values["U_grad"], dw["U"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(values["x_grad"], dx, rtol=1e-4, atol=1e-5)

    # vmap of the sequence model and of its gradient: per-example runs / per-example gradients.
    n = 4
    xs_n = RNG.standard_normal((n, t, b, IN)).astype(np.float32)
    batched = onnax.vmap(seq, in_axes={"x": 0})
    ys_n = run(batched, {"x": xs_n, "h": h0, "c": c0})[0]
    for k in range(n):
        np.testing.assert_allclose(
            ys_n[k], run(seq, {"x": xs_n[k], "h": h0, "c": c0})[0], rtol=1e-5, atol=1e-6
        )
    per_example = onnax.vmap(g, in_axes={"x": 0})
    names = [o.name for o in per_example.graph.output]
    out = dict(zip(names, run(per_example, {"x": xs_n, "h": h0, "c": c0}), strict=True))
    for k in range(n):
        ref = jax.grad(loss)(w64, jnp.asarray(xs_n[k], jnp.float64), h64, c64)
        np.testing.assert_allclose(out["W_grad"][k], ref["W"], rtol=1e-4, atol=1e-5)


# --- selections and refusals ---


def test_role_errors_name_the_fix() -> None:
    step_model, _ = lstm_step()
    with pytest.raises(onnax.OnnaxError, match=r"state input 'hh' is not a runtime input.*'x', 'h', 'c'"):
        onnax.scan(step_model, state=["hh"])
    with pytest.raises(onnax.OnnaxError, match=r"state input 'h' is float32\[batch, 5\] but output 'y'.*Fix"):
        onnax.scan(step_model, state={"h": "y", "c": "c_next"})
    with pytest.raises(onnax.OnnaxError, match=r"no sequence to read the number of steps.*--length"):
        onnax.scan(step_model, constants=["x"])
    with pytest.raises(onnax.OnnaxError, match=r"length 0 is not a number of steps"):
        onnax.scan(step_model, length=0)
    with pytest.raises(onnax.OnnaxError, match=r"'h' is named both as state and as constant"):
        onnax.scan(step_model, constants=["h"])
    with pytest.raises(onnax.OnnaxError, match=r"step: the model is not a sequence model.*no top-level Loop"):
        onnax.step(step_model)


def test_step_refuses_a_while_loop_and_reads_of_the_step_number() -> None:
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "one"], ["s_out"]),
            helper.make_node("Less", ["s_out", "limit"], ["go"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("go", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2]),
        ],
        [
            numpy_helper.from_array(np.ones(2, np.float32), "one"),
            numpy_helper.from_array(np.full(2, 5, np.float32), "limit"),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "s"], ["s_final"], body=body)],
        "while",
        [
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("s_final", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    with pytest.raises(onnax.OnnaxError, match=r"condition is computed in the body \(a while loop\)"):
        onnax.step(model)
    with pytest.raises(onnax.OnnaxError, match=r"signature: the model has a top-level Loop.*--state"):
        onnax.signature(model)


# --- the command line ---


def test_cli_scan_step_signature(tmp_path: Path) -> None:
    step_path, seq_path = SPYX / "lif_step.onnx", SPYX / "lif_seq.onnx"
    cli = [sys.executable, "-m", "onnax"]

    def ok(*args: str) -> str:
        r = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr
        return r.stdout

    ok("scan", str(step_path), "-o", str(tmp_path / "seq.onnx"), "--length", "12")
    ok("step", str(seq_path), "-o", str(tmp_path / "step.onnx"))
    _, seq_model, ref, sig = spyx("lif")
    feeds = {"x": ref["x_seq"], **zero_state(ref)}
    for a, b in zip(run(onnx.load(tmp_path / "seq.onnx"), feeds), run(seq_model, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    one = {"x": ref["steprand_x"], "state_0": ref["steprand_state_0"], "state_1": ref["steprand_state_1"]}
    for a, b in zip(run(onnx.load(tmp_path / "step.onnx"), one), run(onnx.load(step_path), one), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    printed = json.loads(ok("signature", str(seq_path)))
    assert printed["state_shapes"] == sig["seq"]["state_shapes"]
    assert printed["sequence_length"] == 12 and printed["kind"] == "sequence"
    ok("signature", str(step_path), "-o", str(tmp_path / "sig.json"), "--zeros", str(tmp_path / "z.npz"))
    assert json.loads((tmp_path / "sig.json").read_text())["state_names"] == ["state_0", "state_1"]
    with np.load(tmp_path / "z.npz") as z:
        assert {k: z[k].shape for k in z.files} == {"state_0": (2, 16), "state_1": (2, 4)}
        assert not any(z[k].any() for k in z.files)
    bad = [*cli, "scan", str(step_path), "-o", str(tmp_path / "x.onnx"), "--state", "nope"]
    r = subprocess.run(bad, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1 and "not a runtime input" in r.stderr and "Fix" in r.stderr


@pytest.mark.parametrize(("t", "k"), [(6, 2), (3, 3), (2, 5)])
def test_truncated_bptt_against_jax(t: int, k: int) -> None:
    """scan(truncate=K): the same forward pass; gradients through the last K steps only, as JAX
    computes them with stop_gradient on everything the first T - K steps produce."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    step_model, w = lstm_step()
    full, truncated = onnax.scan(step_model), onnax.scan(step_model, truncate=k)
    b = 2
    xs = RNG.standard_normal((t, b, IN)).astype(np.float32)
    h0, c0 = (RNG.standard_normal((b, H)).astype(np.float32) for _ in range(2))
    feeds = {"x": xs, "h": h0, "c": c0}
    for a, r in zip(run(truncated, feeds), run(full, feeds), strict=True):
        np.testing.assert_array_equal(a, r)
    g = onnax.grad(append_half_sum_of_squares(truncated, "y"), inputs=["W", "x", "h"], output="loss")
    values = dict(zip([o.name for o in g.graph.output], run(g, feeds), strict=True))
    w64 = {n: jnp.asarray(v.astype(np.float32), jnp.float64) for n, v in w.items()}
    sg = jax.lax.stop_gradient

    def loss(wd: dict[str, Any], x: Any, h: Any, c: Any) -> Any:
        early = max(t - k, 0)
        ys1, h1, c1 = jax_lstm(wd, x[:early], h, c)
        ys2, _, _ = jax_lstm(wd, x[early:], sg(h1), sg(c1))
        return 0.5 * (jnp.sum(sg(ys1) ** 2) + jnp.sum(ys2**2))

    x64, h64, c64 = (jnp.asarray(a, jnp.float64) for a in (xs, h0, c0))
    dw, dx, dh = jax.grad(loss, argnums=(0, 1, 2))(w64, x64, h64, c64)
    np.testing.assert_allclose(values["W_grad"], dw["W"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(values["x_grad"], dx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(values["h_grad"], dh, rtol=1e-4, atol=1e-5)
    if t > k:
        assert not values["x_grad"][: t - k].any() and not values["h_grad"].any()


def test_large_weights_from_python() -> None:
    """Weights of 1024+ elements cross into the core as data-less stand-ins: scan, step and
    signature must read them as the weights they stand for."""
    step_model, _ = lstm_step()
    big = RNG.standard_normal((IN, 512)).astype(np.float32)
    step_model.graph.initializer.append(numpy_helper.from_array(big, "P"))
    step_model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "ax"))
    step_model.graph.node.extend(
        [
            helper.make_node("MatMul", ["x", "P"], ["xp"]),
            helper.make_node("ReduceSum", ["xp", "ax"], ["xs"], keepdims=1),
        ]
    )
    step_model.graph.output.append(helper.make_tensor_value_info("xs", TensorProto.FLOAT, ["batch", 1]))
    seq = onnax.scan(step_model, state={"h": "h_next", "c": "c_next"})
    stored = {t.name: numpy_helper.to_array(t) for t in seq.graph.initializer}
    np.testing.assert_array_equal(stored["P"], big)
    xs = RNG.standard_normal((3, 2, IN)).astype(np.float32)
    h0 = np.zeros((2, H), np.float32)
    got = dict(zip([o.name for o in seq.graph.output], run(seq, {"x": xs, "h": h0, "c": h0}), strict=True))
    np.testing.assert_allclose(got["xs"], (xs @ big).sum(-1, keepdims=True), rtol=1e-4, atol=1e-4)
    back = onnax.step(seq)
    assert {t.name for t in back.graph.initializer} >= {"P", "W"}
    assert onnax.signature(seq).state_names == ["h", "c"]


def test_step_records_its_roles_for_scan_and_signature() -> None:
    """A sequence whose weight is a graph input: step finds it constant, and scan of that step
    reads it so again (not by the default roles)."""
    step_model, _ = gru_step()
    seq = onnax.scan(step_model, state={"h": "h_new"}, constants=["gain"])
    back = onnax.step(seq)
    sig = onnax.signature(back)
    assert (sig.state_names, sig.state_output_names, sig.constants) == (["h"], ["h_new"], ["gain"])
    again = onnax.scan(back)
    assert not any(p.key.startswith("onnax.step.") for p in again.metadata_props)
    xs = RNG.standard_normal((4, 2, IN)).astype(np.float32)
    feeds = {
        "h": RNG.standard_normal((2, H)).astype(np.float32),
        "x": xs,
        "gain": RNG.standard_normal(H).astype(np.float32),
    }
    for a, b in zip(run(again, feeds), run(seq, feeds), strict=True):
        np.testing.assert_array_equal(a, b)


def test_states_pair_with_outputs_named_after_them() -> None:
    step_model, _ = lstm_step()  # outputs y, h_next, c_next
    seq = onnax.scan(step_model, state=["c", "h"])  # not in output order: paired by name
    assert [o.name for o in seq.graph.output] == ["y", "h_next", "c_next"]
    sig = onnax.signature(step_model, state=["c", "h"])
    assert sig.state_output_names == ["c_next", "h_next"]


def test_identity_outputs_and_the_time_axis_name() -> None:
    step_model, _ = lstm_step()
    seq = onnax.scan(step_model)
    # Outputs renamed through Identity nodes, as exporters write them.
    for o in seq.graph.output:
        seq.graph.node.append(helper.make_node("Identity", [o.name], [o.name + "_out"]))
        o.name += "_out"
    back = onnax.step(seq)
    assert [o.name for o in back.graph.output] == ["y_out", "h_next_out", "c_next_out"]
    one = {
        "x": RNG.standard_normal((2, IN)).astype(np.float32),
        "h": np.ones((2, H), np.float32),
        "c": np.ones((2, H), np.float32),
    }
    for a, b in zip(run(back, one), run(step_model, one), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    with pytest.raises(onnax.OnnaxError, match=r"time axis name 'batch' is already a dim.*Fix"):
        onnax.scan(step_model, length_name="batch")


def test_zeros_command_errors_follow_the_contract(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "onnax", "signature"]
    step_path = SPYX / "lif_step.onnx"

    def fails(*args: str) -> str:
        r = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode in (1, 2) and "Traceback" not in r.stderr, r.stderr
        return r.stderr

    (tmp_path / "trunc.onnx").write_bytes(step_path.read_bytes()[:100])
    assert "not a valid ONNX model" in fails(str(tmp_path / "trunc.onnx"), "--zeros", str(tmp_path / "z.npz"))
    assert "is a directory" in fails(str(step_path), "--zeros", str(tmp_path))
    assert "no state's shape has" in fails(str(step_path), "--zeros", str(tmp_path / "z.npz"), "--dim", "M=2")
    assert "NAME=SIZE" in fails(str(step_path), "--zeros", str(tmp_path / "z.npz"), "--dim", "batch=-1")
    r = subprocess.run(
        [*cli, str(step_path), "--zeros", str(tmp_path / "state0")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0 and (tmp_path / "state0").exists() and not (tmp_path / "state0.npz").exists()
    with np.load(tmp_path / "state0") as z:
        assert sorted(z.files) == ["state_0", "state_1"]


def test_an_input_with_a_default_is_a_constant() -> None:
    k = np.array([0.5, 2.0], np.float32)
    graph = helper.make_graph(
        [helper.make_node("Mul", ["h", "k"], ["hk"]), helper.make_node("Add", ["hk", "x"], ["h_next"])],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "h", "k")],
        [helper.make_tensor_value_info("h_next", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(k, "k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    seq = onnax.scan(model, state=["h"], constants=["k"])
    assert [i.name for i in seq.graph.input] == ["x", "h", "k"]
    xs, h0 = np.ones((3, 2), np.float32), np.zeros(2, np.float32)
    expected = h0
    for t in range(3):
        expected = expected * k + xs[t]
    np.testing.assert_allclose(run(seq, {"x": xs, "h": h0})[0], expected, rtol=1e-6)
