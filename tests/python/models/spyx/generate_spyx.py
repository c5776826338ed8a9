"""Exports small spyx spiking networks to ONNX with spyx's own exporter and computes spyx/JAX
references for them (``tests/python/conformance_suite/test_spyx_exports.py`` reads what this writes).

Run with a Python that has spyx 1.0.0 and the conversion stack, never the project's .venv
(which has no spyx/flax) and never requirements.txt:

    python3 -m venv /tmp/spyx-venv
    /tmp/spyx-venv/bin/pip install spyx==1.0.0 jax2onnx onnx onnxruntime
    /tmp/spyx-venv/bin/python tests/python/models/spyx/generate_spyx.py [NAME ...]

(used: spyx 1.0.0, jax/jaxlib 0.10.2, flax 0.12.8, jax2onnx 0.17.1, onnx 1.23.2; see README.md.)

Models (NAME): ``lif``, ``alif``, ``rlif``, each
``spyx.nn.Sequential(nnx.Linear(8, 16), NEURON((16,)), nnx.Linear(16, 4), spyx.nn.LI((4,)))``
with NEURON = ``spyx.nn.LIF`` / ``spyx.nn.ALIF`` / ``spyx.nn.RLIF`` built from
``nnx.Rngs(SEEDS[NAME])`` with spyx's default activation (``spyx.axn.superspike(k=25)``).
After initialization the two Linear biases (flax initializes them to zero) and LI's beta (spyx
initializes it to 0.8 everywhere) are perturbed once with a fixed numpy seed, so that every
parameter is non-trivial and findable by value. Batch 2, input width 8, T = 12.

Files written next to this script, for each NAME:

* ``NAME_step.onnx``: ``spyx.experimental.onnx.to_onnx(model, (8,), batch=2)``, the per-timestep
  ``step(x, state_0, state_1, ...) -> (out, new_state_0, ...)``.
* ``NAME_seq.onnx``: ``to_onnx(model, (8,), batch=2, sequence_length=12)``, the whole
  ``spyx.nn.run`` as an ONNX ``Loop``: ``run(x_seq, state_0, ...) -> (out_seq, final_state_0, ...)``.
* ``NAME_signature.json``: ``{"step": SIG, "seq": SIG, "onnx": {...}}`` where SIG has every field
  of ``spyx.experimental.onnx.step_signature(...)`` (shapes as lists, dtypes as strings,
  ``state_treedef`` as ``str()``, plus ``num_state``) and ``onnx`` records the exported graphs'
  real input/output names (jax2onnx does not use the signature's output names).
* ``NAME_ref.npz`` (float32, computed by spyx/JAX, not by ONNX Runtime):
  ``x_seq`` (T, 2, 8) binary spike train; ``state_<i>`` the zero initial state
  (``model.initial_state(2)`` flattened); ``out_seq`` and ``final_state_<i>`` from
  ``spyx.nn.run(model, x_seq)``; ``step1_out`` / ``step1_new_state_<i>`` from one call
  ``model(x_seq[0], initial_state)``; ``steprand_x``, ``steprand_state_<i>``, ``steprand_out``,
  ``steprand_new_state_<i>``: one step from a random non-zero state (the zero state cannot spike
  on the first step, so this exercises the spike path of a single step);
  ``spikes_seq`` (T, 2, 16) the hidden layer's spikes along the run; ``param/<key>`` every
  parameter (``key`` like ``layers.0.kernel``); ``min_margin``, the smallest ``|pre-activation|``
  seen by the spike function along the run and the random step (how far float32 rounding is from
  flipping a spike).
* ``NAME_grads_<surrogate>.npz`` (float64, JAX with ``jax_enable_x64``, params/inputs cast from
  the float32 values to float64): ``loss``, ``out_seq``, ``final_state_<i>``,
  ``grad/<param key>``, ``grad/x_seq``, ``grad/state_<i>`` (w.r.t. the zero initial state), for
  ``loss = 0.5 * sum over t, b, k of out_seq[t, b, k] ** 2`` (a sum, not a mean), with the
  hidden neuron built with ``activation=<surrogate>``.
* ``params_map.json``: for each model and parameter key, its shape, the initializer name holding
  it in the step and in the sequence export (found by exact value), the Loop-body input it enters
  the body as, and how the graph uses it.
* ``surrogates_ref.npz``: for each surrogate, ``x`` (a float64 grid including the kinks),
  ``<surrogate>/fwd`` and ``<surrogate>/grad`` (``jax.grad`` of spyx's activation in float64),
  checked here against the formulas written in README.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from flax import nnx
from onnx import numpy_helper
from spyx import axn
from spyx import nn as snn
from spyx.experimental import onnx as sonnx

HERE = Path(__file__).resolve().parent
T = 12
BATCH = 2
IN = 8
HIDDEN = 16
OUT = 4
SPIKE_PROB = 0.4
SEEDS = {"lif": 0, "alif": 1, "rlif": 4}
MAX_BYTES = 200 * 1024

NEURONS: dict[str, Callable[..., Any]] = {"lif": snn.LIF, "alif": snn.ALIF, "rlif": snn.RLIF}

# name -> (factory call, numpy forward, numpy derivative); the formulas are the ones in README.md.
SURROGATES: dict[str, tuple[Callable[[], Any], Callable[[np.ndarray], np.ndarray]]] = {
    "superspike_k25": (lambda: axn.superspike(k=25.0), lambda x: 1.0 / (1.0 + 25.0 * np.abs(x)) ** 2),
    "arctan_k2": (lambda: axn.arctan(k=2.0), lambda x: 1.0 / ((1.0 + (2.0 * np.pi * x) ** 2) * np.pi)),
    "triangular_k2": (lambda: axn.triangular(k=2.0), lambda x: np.maximum(0.0, 1.0 - np.abs(2.0 * x))),
    "boxcar_w2_h0.5": (
        lambda: axn.boxcar(width=2.0, height=0.5),
        lambda x: np.where(np.abs(x) < 1.0, 0.5, 0.0),
    ),
    "tanh_k1": (lambda: axn.tanh(k=1.0), lambda x: 4.0 / (np.exp(-x) + np.exp(x)) ** 2),
    # axn.custom() with its default bwd (documented as the straight-through estimator, but its
    # default bwd is ``lambda x: x``, so the derivative it gives is x itself, not 1):
    "custom_default": (lambda: axn.custom(), lambda x: np.asarray(x, dtype=np.float64)),
    # the real straight-through estimator, spelled with axn.custom (derivative 1):
    "straight_through": (lambda: axn.custom(bwd=jnp.ones_like), lambda x: np.ones_like(x)),
}


def build(name: str, activation: Any = None) -> snn.Sequential:
    """The model NAME; ``activation=None`` keeps spyx's default (superspike k=25)."""
    rngs = nnx.Rngs(SEEDS[name])
    model = snn.Sequential(
        nnx.Linear(IN, HIDDEN, rngs=rngs),
        NEURONS[name]((HIDDEN,), activation=activation, rngs=rngs),
        nnx.Linear(HIDDEN, OUT, rngs=rngs),
        snn.LI((OUT,), rngs=rngs),
    )
    rs = np.random.RandomState(100 + SEEDS[name])
    layers = model.layers
    layers[0].bias.value = jnp.asarray(rs.normal(0.0, 0.2, HIDDEN).astype(np.float32))
    layers[2].bias.value = jnp.asarray(rs.normal(0.0, 0.2, OUT).astype(np.float32))
    layers[3].beta.value = jnp.asarray((0.8 + rs.uniform(-0.1, 0.1, OUT)).astype(np.float32))
    return model


def save(path: Path, arrays: dict[str, Any]) -> None:
    np.savez_compressed(path, **arrays)


def key_of(path: tuple[Any, ...]) -> str:
    parts = []
    for p in path:
        if isinstance(p, jax.tree_util.DictKey):
            parts.append(str(p.key))
        elif isinstance(p, jax.tree_util.SequenceKey):
            parts.append(str(p.idx))
        elif isinstance(p, jax.tree_util.GetAttrKey):
            if p.name != "value":
                parts.append(p.name)
        else:
            parts.append(str(p))
    return ".".join(parts)


def params_of(model: nnx.Module) -> dict[str, np.ndarray]:
    _, state = nnx.split(model)
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {key_of(p): np.asarray(v) for p, v in leaves}


def with_params(model: nnx.Module, params: dict[str, np.ndarray], dtype: Any) -> tuple[Any, Any]:
    """(graphdef, state) of ``model`` with every parameter replaced by ``params[key]`` cast."""
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
    keys = [key_of(p) for p, _ in leaves]
    assert sorted(keys) == sorted(params), (keys, list(params))
    new = [jnp.asarray(params[k].astype(dtype)) for k in keys]
    return graphdef, jax.tree_util.tree_unflatten(treedef, new)


def sig_json(sig: Any) -> dict[str, Any]:
    return {
        "input_shape": list(sig.input_shape),
        "input_dtype": str(np.dtype(sig.input_dtype)),
        "state_shapes": [list(s) for s in sig.state_shapes],
        "state_dtypes": [str(np.dtype(d)) for d in sig.state_dtypes],
        "output_shape": list(sig.output_shape),
        "output_dtype": str(np.dtype(sig.output_dtype)),
        "input_names": list(sig.input_names),
        "output_names": list(sig.output_names),
        "sequence_length": sig.sequence_length,
        "state_treedef": str(sig.state_treedef),
        "num_state": sig.num_state,
    }


def pre_activations(name: str, model: Any, state: list[Any]) -> np.ndarray:
    """What the hidden neuron hands its spike function in ``model(x, state)`` (the state is
    spyx's list [None, hidden, None, li]); the threshold is 1 in every model here."""
    hidden = np.asarray(state[1])
    if name == "alif":
        v, adapt = np.split(hidden, 2, axis=-1)
        return v - (model.layers[1].threshold + adapt)
    return hidden - model.layers[1].threshold


def run_reference(name: str, model: snn.Sequential, sig: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 + SEEDS[name])
    x_seq = (rng.random((T, BATCH, IN)) < SPIKE_PROB).astype(np.float32)
    state0 = model.initial_state(BATCH)
    flat0, treedef = jax.tree_util.tree_flatten(state0)
    assert str(treedef) == str(sig.state_treedef)
    ref: dict[str, np.ndarray] = {"x_seq": x_seq}
    for i, s in enumerate(flat0):
        ref[f"state_{i}"] = np.asarray(s, dtype=np.float32)
        assert not np.any(ref[f"state_{i}"])

    out_seq, final_state = snn.run(model, jnp.asarray(x_seq))
    ref["out_seq"] = np.asarray(out_seq, dtype=np.float32)
    for i, s in enumerate(jax.tree_util.tree_flatten(final_state)[0]):
        ref[f"final_state_{i}"] = np.asarray(s, dtype=np.float32)

    out1, new1 = model(jnp.asarray(x_seq[0]), state0)
    ref["step1_out"] = np.asarray(out1, dtype=np.float32)
    for i, s in enumerate(jax.tree_util.tree_flatten(new1)[0]):
        ref[f"step1_new_state_{i}"] = np.asarray(s, dtype=np.float32)

    # A host loop in JAX (model called per step) must reproduce run's scan; it also gives the
    # hidden spikes and the margins of every spike decision.
    margins = []
    spikes = []
    state = state0
    for t in range(T):
        margins.append(np.min(np.abs(pre_activations(name, model, state))))
        h = model.layers[0](jnp.asarray(x_seq[t]))
        s_t, _ = model.layers[1](h, state[1])
        spikes.append(np.asarray(s_t, dtype=np.float32))
        out_t, state = model(jnp.asarray(x_seq[t]), state)
        np.testing.assert_allclose(np.asarray(out_t), ref["out_seq"][t], rtol=1e-6, atol=1e-6)
    ref["spikes_seq"] = np.stack(spikes)

    # One step from a random state, with about half the hidden units above threshold.
    srng = np.random.default_rng(2000 + SEEDS[name])
    flat_r = []
    for s in flat0:
        flat_r.append(srng.normal(0.9, 0.5, np.shape(s)).astype(np.float32))
    if name == "alif":  # second half of the ALIF state is the threshold adaptation: keep it >= 0
        flat_r[0][:, HIDDEN:] = np.abs(flat_r[0][:, HIDDEN:]) * 0.3
    state_r = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(s) for s in flat_r])
    x_r = x_seq[5]
    out_r, new_r = model(jnp.asarray(x_r), state_r)
    ref["steprand_x"] = x_r
    for i, s in enumerate(flat_r):
        ref[f"steprand_state_{i}"] = s
    ref["steprand_out"] = np.asarray(out_r, dtype=np.float32)
    for i, s in enumerate(jax.tree_util.tree_flatten(new_r)[0]):
        ref[f"steprand_new_state_{i}"] = np.asarray(s, dtype=np.float32)
    margins.append(np.min(np.abs(pre_activations(name, model, state_r))))
    pre_r = pre_activations(name, model, state_r)
    print(f"  {name}: random step spikes {int(np.sum(pre_r > 0))}/{pre_r.size}")

    ref["min_margin"] = np.asarray(min(margins), dtype=np.float32)
    for k, v in params_of(model).items():
        ref[f"param/{k}"] = v.astype(np.float32)
    n_spk = int(ref["spikes_seq"].sum())
    print(
        f"  {name}: hidden spikes {n_spk}/{ref['spikes_seq'].size}, min margin {float(ref['min_margin']):.3g}"
    )
    assert n_spk >= ref["spikes_seq"].size // 20, "too few spikes for a useful fixture"
    assert float(ref["min_margin"]) > 1e-3, "a spike decision is too close to the threshold"
    return ref


def initializer_values(g: onnx.GraphProto) -> dict[str, np.ndarray]:
    vals = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    vals[n.output[0]] = numpy_helper.to_array(a.t)
    return vals


def find_by_value(g: onnx.GraphProto, value: np.ndarray) -> list[str]:
    return [
        k
        for k, v in initializer_values(g).items()
        if v.shape == value.shape and v.dtype == value.dtype and np.array_equal(v, value)
    ]


def consumers(g: onnx.GraphProto, name: str) -> list[str]:
    return [n.op_type for n in g.node if name in n.input]


def param_map(name: str, params: dict[str, np.ndarray], step: onnx.ModelProto, seq: onnx.ModelProto) -> dict:
    loops = [n for n in seq.graph.node if n.op_type == "Loop"]
    assert len(loops) == 1, [n.op_type for n in seq.graph.node]
    loop = loops[0]
    body = next(a.g for a in loop.attribute if a.name == "body")
    out: dict[str, Any] = {}
    for k, v in params.items():
        s = find_by_value(step.graph, v)
        q = find_by_value(seq.graph, v)
        assert len(s) == 1 and len(q) == 1, (name, k, s, q)
        entry: dict[str, Any] = {
            "shape": list(v.shape),
            "dtype": str(v.dtype),
            "step_initializer": s[0],
            "step_consumers": consumers(step.graph, s[0]),
            "seq_initializer": q[0],
            "seq_consumers": consumers(seq.graph, q[0]),
        }
        if q[0] in loop.input:
            pos = list(loop.input).index(q[0])
            bname = body.input[pos].name
            entry["seq_loop_input_index"] = pos
            entry["seq_loop_body_input"] = bname
            entry["seq_loop_body_consumers"] = consumers(body, bname)
        out[k] = entry
    return out


def export(name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    model = build(name)
    files: dict[str, Any] = {}
    sigs = {
        "step": sonnx.step_signature(model, (IN,), batch=BATCH),
        "seq": sonnx.step_signature(model, (IN,), batch=BATCH, sequence_length=T),
    }
    protos = {
        "step": onnx.load_from_string(sonnx.to_onnx(model, (IN,), batch=BATCH)),
        "seq": onnx.load_from_string(sonnx.to_onnx(model, (IN,), batch=BATCH, sequence_length=T)),
    }
    meta: dict[str, Any] = {"step": sig_json(sigs["step"]), "seq": sig_json(sigs["seq"]), "onnx": {}}
    for kind, m in protos.items():
        onnx.checker.check_model(m, full_check=True)
        path = HERE / f"{name}_{kind}.onnx"
        data = m.SerializeToString()
        assert len(data) < MAX_BYTES, (path, len(data))
        path.write_bytes(data)
        files[path.name] = len(data)
        meta["onnx"][kind] = {
            "input_names": [i.name for i in m.graph.input],
            "output_names": [o.name for o in m.graph.output],
            "opset": [{"domain": o.domain, "version": o.version} for o in m.opset_import],
            "ir_version": m.ir_version,
            "producer": f"{m.producer_name} {m.producer_version}",
        }
    meta["versions"] = versions()
    (HERE / f"{name}_signature.json").write_text(json.dumps(meta, indent=2) + "\n")

    ref = run_reference(name, model, sigs["step"])
    save(HERE / f"{name}_ref.npz", ref)
    params = params_of(model)
    pmap = param_map(name, params, protos["step"], protos["seq"])
    print(f"  {name}: {files}")
    return {k: v.astype(np.float32) for k, v in params.items()}, pmap


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {k: version(k) for k in ("spyx", "jax", "jaxlib", "flax", "jax2onnx", "onnx", "numpy")}


def grads(name: str, params: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    """float64 gradients of loss = 0.5 * sum(out_seq**2) for every surrogate (x64 enabled)."""
    assert jax.config.read("jax_enable_x64")
    x_seq = jnp.asarray(ref["x_seq"].astype(np.float64))
    n_state = sum(1 for k in ref if k.startswith("state_"))
    states = [jnp.asarray(ref[f"state_{i}"].astype(np.float64)) for i in range(n_state)]
    for sname, (make, _) in SURROGATES.items():
        model = build(name, activation=make())
        graphdef, pstate = with_params(model, params, np.float64)
        treedef = jax.tree_util.tree_structure(model.initial_state(BATCH))

        def loss_fn(p: Any, x: Any, *flat: Any, graphdef: Any = graphdef, treedef: Any = treedef) -> Any:
            m = nnx.merge(graphdef, p)
            out, final = snn.run(m, x, jax.tree_util.tree_unflatten(treedef, list(flat)))
            return 0.5 * jnp.sum(out**2), (out, jax.tree_util.tree_flatten(final)[0])

        (loss, (out, final)), g = jax.value_and_grad(
            loss_fn, argnums=tuple(range(2 + n_state)), has_aux=True
        )(pstate, x_seq, *states)
        # everything in float64 (the jaxpr has no narrower float)
        jaxpr = jax.make_jaxpr(loss_fn)(pstate, x_seq, *states)
        assert "f32" not in str(jaxpr), sname
        assert out.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(out), ref["out_seq"], rtol=1e-5, atol=1e-5)
        res: dict[str, np.ndarray] = {"loss": np.asarray(loss), "out_seq": np.asarray(out)}
        for i, f in enumerate(final):
            res[f"final_state_{i}"] = np.asarray(f)
        for p, v in jax.tree_util.tree_flatten_with_path(g[0])[0]:
            res[f"grad/{key_of(p)}"] = np.asarray(v)
        res["grad/x_seq"] = np.asarray(g[1])
        for i in range(n_state):
            res[f"grad/state_{i}"] = np.asarray(g[2 + i])
        for k, v in res.items():
            assert v.dtype == np.float64, (k, v.dtype)
            assert np.all(np.isfinite(v)), k
        assert sorted(k[5:] for k in res if k.startswith("grad/layers")) == sorted(params)
        save(HERE / f"{name}_grads_{sname}.npz", res)
        gn = float(np.sqrt(sum(np.sum(v**2) for k, v in res.items() if k.startswith("grad/"))))
        print(f"  {name} {sname}: loss {float(loss):.6g} |grad| {gn:.6g}")


def surrogate_reference() -> None:
    assert jax.config.read("jax_enable_x64")
    x = np.concatenate(
        [np.linspace(-2.0, 2.0, 81), [0.0, -0.5, 0.5, -1.0, 1.0, 1e-3, -1e-3, 0.04, -0.04]]
    ).astype(np.float64)
    res: dict[str, np.ndarray] = {"x": x}
    for sname, (make, deriv) in SURROGATES.items():
        f = make()
        fwd = np.asarray(jax.vmap(f)(jnp.asarray(x)))
        grad = np.asarray(jax.vmap(jax.grad(f))(jnp.asarray(x)))
        assert fwd.dtype == np.float64 and grad.dtype == np.float64
        np.testing.assert_array_equal(fwd, (x > 0).astype(np.float64))
        np.testing.assert_allclose(grad, deriv(x), rtol=1e-12, atol=1e-15, err_msg=sname)
        res[f"{sname}/fwd"] = fwd
        res[f"{sname}/grad"] = grad
    save(HERE / "surrogates_ref.npz", res)


def main(names: list[str]) -> None:
    assert not jax.config.read("jax_enable_x64")
    print("versions", versions())
    all_params: dict[str, dict[str, np.ndarray]] = {}
    maps: dict[str, Any] = {}
    for name in names:
        all_params[name], maps[name] = export(name)
    map_path = HERE / "params_map.json"
    old = json.loads(map_path.read_text()) if map_path.exists() else {}
    old.update(maps)
    map_path.write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")

    jax.config.update("jax_enable_x64", True)
    for name in names:
        ref = dict(np.load(HERE / f"{name}_ref.npz"))
        grads(name, all_params[name], ref)
    surrogate_reference()


if __name__ == "__main__":
    main(sys.argv[1:] or list(SEEDS))
