"""The spyx fixture corpus (``tests/python/models/spyx``, made by its ``generate_spyx.py`` with spyx 1.0.0
and jax2onnx 0.17.1): spyx's own ONNX exports of small spiking networks, run in ONNX Runtime and
checked against spyx/JAX's numbers. Needs neither spyx nor the network.

* the per-timestep export on the first step (zero state) and on one step from a random state;
* the full-sequence export (a native ONNX ``Loop``) against ``spyx.nn.run``'s ``out_seq`` and
  final states;
* a host loop of the step export over T against the sequence export;
* the fixture's own bookkeeping: signatures, the parameter -> initializer map, the float64
  gradient files and the surrogate formulas written in the README.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

ort = pytest.importorskip("onnxruntime")

DIR = Path(__file__).resolve().parents[1] / "models" / "spyx"
MODELS = ["lif", "alif", "rlif"]
SURROGATES = [
    "superspike_k25",
    "arctan_k2",
    "triangular_k2",
    "boxcar_w2_h0.5",
    "tanh_k1",
    "custom_default",
    "straight_through",
]
T = 12
RTOL = 1e-5
ATOL = 1e-5

# The derivative each surrogate's backward pass uses, as README.md writes it (x = pre-activation).
FORMULAS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "superspike_k25": lambda x: 1.0 / (1.0 + 25.0 * np.abs(x)) ** 2,
    "arctan_k2": lambda x: 1.0 / ((1.0 + (2.0 * np.pi * x) ** 2) * np.pi),
    "triangular_k2": lambda x: np.maximum(0.0, 1.0 - np.abs(2.0 * x)),
    "boxcar_w2_h0.5": lambda x: np.where(np.abs(x) < 1.0, 0.5, 0.0),
    "tanh_k1": lambda x: 4.0 / (np.exp(-x) + np.exp(x)) ** 2,
    "custom_default": lambda x: x,
    "straight_through": lambda x: np.ones_like(x),
}


def _session(path: Path) -> Any:
    so = ort.SessionOptions()
    so.log_severity_level = 3  # the Loop bodies carry unused initializers; ORT warns about each
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _signature(name: str) -> dict[str, Any]:
    sig: dict[str, Any] = json.loads((DIR / f"{name}_signature.json").read_text())
    return sig


def _ref(name: str) -> dict[str, np.ndarray]:
    with np.load(DIR / f"{name}_ref.npz") as f:
        return {k: f[k] for k in f.files}


def _close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert actual.dtype == np.float32, (what, actual.dtype)
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=what)


def _run(sess: Any, x: np.ndarray, states: list[np.ndarray]) -> list[np.ndarray]:
    feeds = {"x": x} | {f"state_{i}": s for i, s in enumerate(states)}
    out: list[np.ndarray] = sess.run(None, feeds)
    return out


def test_files_small() -> None:
    files = sorted(DIR.iterdir())
    assert files
    for f in files:
        assert f.stat().st_size < 200 * 1024, f


@pytest.mark.parametrize("name", MODELS)
def test_signature_matches_graphs(name: str) -> None:
    sig = _signature(name)
    for kind, seq_len in (("step", None), ("seq", T)):
        s = sig[kind]
        model = onnx.load(DIR / f"{name}_{kind}.onnx")
        onnx.checker.check_model(model)
        assert s["sequence_length"] == seq_len
        assert s["num_state"] == len(s["state_shapes"]) == len(s["state_dtypes"])
        assert s["state_treedef"] == "PyTreeDef([None, *, None, *])"
        inputs = model.graph.input
        assert [i.name for i in inputs] == s["input_names"] == ["x", "state_0", "state_1"]
        shapes = [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in inputs]
        assert shapes == [s["input_shape"], *s["state_shapes"]]
        assert all(i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for i in inputs)
        assert s["input_dtype"] == s["output_dtype"] == "float32"
        # the graph's real output names are jax2onnx's, not the signature's (recorded separately)
        assert [o.name for o in model.graph.output] == sig["onnx"][kind]["output_names"]
        assert len(model.graph.output) == len(s["output_names"]) == 1 + s["num_state"]


@pytest.mark.parametrize("name", MODELS)
def test_step_first_step(name: str) -> None:
    ref = _ref(name)
    sig = _signature(name)["step"]
    states = [ref[f"state_{i}"] for i in range(sig["num_state"])]
    for s, shape in zip(states, sig["state_shapes"], strict=True):
        assert list(s.shape) == shape and not s.any()
    out = _run(_session(DIR / f"{name}_step.onnx"), ref["x_seq"][0], states)
    assert len(out) == 1 + sig["num_state"]
    _close(out[0], ref["step1_out"], "out")
    assert list(out[0].shape) == sig["output_shape"]
    for i in range(sig["num_state"]):
        _close(out[1 + i], ref[f"step1_new_state_{i}"], f"new_state_{i}")
    # the first step's output is also the first row of the sequence run
    _close(out[0], ref["out_seq"][0], "out vs out_seq[0]")


@pytest.mark.parametrize("name", MODELS)
def test_step_random_state(name: str) -> None:
    ref = _ref(name)
    n = _signature(name)["step"]["num_state"]
    states = [ref[f"steprand_state_{i}"] for i in range(n)]
    out = _run(_session(DIR / f"{name}_step.onnx"), ref["steprand_x"], states)
    _close(out[0], ref["steprand_out"], "out")
    for i in range(n):
        _close(out[1 + i], ref[f"steprand_new_state_{i}"], f"new_state_{i}")


@pytest.mark.parametrize("name", MODELS)
def test_sequence_matches_spyx_run(name: str) -> None:
    ref = _ref(name)
    sig = _signature(name)["seq"]
    n = sig["num_state"]
    assert list(ref["x_seq"].shape) == sig["input_shape"]
    assert set(np.unique(ref["x_seq"])) <= {0.0, 1.0}
    out = _run(_session(DIR / f"{name}_seq.onnx"), ref["x_seq"], [ref[f"state_{i}"] for i in range(n)])
    assert len(out) == 1 + n
    assert list(out[0].shape) == sig["output_shape"]
    _close(out[0], ref["out_seq"], "out_seq")
    for i in range(n):
        _close(out[1 + i], ref[f"final_state_{i}"], f"final_state_{i}")


@pytest.mark.parametrize("name", MODELS)
def test_step_loop_matches_sequence(name: str) -> None:
    ref = _ref(name)
    n = _signature(name)["step"]["num_state"]
    init = [ref[f"state_{i}"] for i in range(n)]
    seq_out = _run(_session(DIR / f"{name}_seq.onnx"), ref["x_seq"], init)
    step = _session(DIR / f"{name}_step.onnx")
    states = list(init)
    outs = []
    for t in range(T):
        res = _run(step, ref["x_seq"][t], states)
        outs.append(res[0])
        states = res[1:]
    _close(np.stack(outs), seq_out[0], "host loop out_seq")
    for i in range(n):
        _close(states[i], seq_out[1 + i], f"host loop final_state_{i}")


def _initializers(g: onnx.GraphProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in g.initializer}


@pytest.mark.parametrize("name", MODELS)
def test_param_map(name: str) -> None:
    pmap = json.loads((DIR / "params_map.json").read_text())[name]
    ref = _ref(name)
    params = {k[len("param/") :]: v for k, v in ref.items() if k.startswith("param/")}
    assert sorted(pmap) == sorted(params)
    step = onnx.load(DIR / f"{name}_step.onnx")
    seq = onnx.load(DIR / f"{name}_seq.onnx")
    step_init, seq_init = _initializers(step.graph), _initializers(seq.graph)
    (loop,) = [n for n in seq.graph.node if n.op_type == "Loop"]
    body = next(a.g for a in loop.attribute if a.name == "body")
    for key, entry in pmap.items():
        np.testing.assert_array_equal(step_init[entry["step_initializer"]], params[key])
        np.testing.assert_array_equal(seq_init[entry["seq_initializer"]], params[key])
        pos = entry["seq_loop_input_index"]
        assert loop.input[pos] == entry["seq_initializer"]
        assert body.input[pos].name == entry["seq_loop_body_input"]
        # no other initializer holds the same value
        same = [
            k for k, v in step_init.items() if v.shape == params[key].shape and np.array_equal(v, params[key])
        ]
        assert same == [entry["step_initializer"]]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("surrogate", SURROGATES)
def test_gradient_files(name: str, surrogate: str) -> None:
    ref = _ref(name)
    with np.load(DIR / f"{name}_grads_{surrogate}.npz") as f:
        g = {k: f[k] for k in f.files}
    # the float64 forward pass is spyx's float32 one, and the loss is 0.5 * sum(out_seq ** 2)
    np.testing.assert_allclose(g["out_seq"], ref["out_seq"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g["loss"], 0.5 * np.sum(g["out_seq"] ** 2), rtol=1e-12)
    for i in range(2):
        np.testing.assert_allclose(g[f"final_state_{i}"], ref[f"final_state_{i}"], rtol=1e-5, atol=1e-5)
        assert g[f"grad/state_{i}"].shape == ref[f"state_{i}"].shape
    assert g["grad/x_seq"].shape == ref["x_seq"].shape
    params = {k[len("param/") :]: v for k, v in ref.items() if k.startswith("param/")}
    for k, v in params.items():
        assert g[f"grad/{k}"].shape == v.shape
    for k, v in g.items():
        assert v.dtype == np.float64 and np.all(np.isfinite(v)), k
    # layers after the spiking neuron do not see the surrogate: same gradient for every surrogate
    with np.load(DIR / f"{name}_grads_superspike_k25.npz") as f:
        for k in ("grad/layers.2.kernel", "grad/layers.2.bias", "grad/layers.3.beta", "grad/state_1"):
            np.testing.assert_allclose(g[k], f[k], rtol=1e-12, atol=1e-12)
        if surrogate != "superspike_k25":
            assert not np.allclose(g["grad/layers.0.kernel"], f["grad/layers.0.kernel"])


def test_surrogate_formulas() -> None:
    with np.load(DIR / "surrogates_ref.npz") as f:
        x = f["x"]
        for s in SURROGATES:
            np.testing.assert_array_equal(f[f"{s}/fwd"], (x > 0).astype(np.float64))
            np.testing.assert_allclose(f[f"{s}/grad"], FORMULAS[s](x), rtol=1e-12, atol=1e-15, err_msg=s)
