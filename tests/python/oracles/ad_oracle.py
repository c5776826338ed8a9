"""Numerical oracles for the onnax autodiff transforms (``jvp``, ``vjp``, ``grad``).

The references are independent of onnax's derivative rules:

* ``jvp``: central finite differences ``(f(x + eps v) - f(x - eps v)) / 2 eps`` in float64;
* ``vjp``: the dot-product test ``<u, J v> == <J^T u, v>`` against the (FD-checked) jvp graph;
* ``grad``: central finite differences of the scalar loss, one input coordinate at a time;
* HVP (``jvp(grad(f))``): finite differences of the gradient graph;
* per-example gradients (``vmap(grad(f))``): a loop of ``grad(f)`` over the examples.

Models are built in DOUBLE precision for the oracle; a FLOAT variant of the same model is
checked against the float64 finite differences with looser tolerances. Input values come from
generators ``gen(rng, dtype) -> ndarray`` that keep away from non-smooth points and domain
edges. Models run on ONNX Runtime (opset <= 26) or the ONNX reference evaluator (27-28, or
when ONNX Runtime has no kernel), through :func:`vmap_oracle.run_model` and its session cache.
The dtype rewriting and initializer lifting are ``onnax.testing``'s (shared with ``onnax validate``).
"""

from __future__ import annotations

import json
import pickle
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnax.testing._inputs import convert_model_dtype, lift_initializers
from onnx import TensorProto, helper, numpy_helper

from oracles.vmap_oracle import assert_vmap_matches, make_model, np_dtype, run_model, to_proto

F = TensorProto.FLOAT
D = TensorProto.DOUBLE
FLOAT_TYPES = (F, D)

ADGen = Callable[[np.random.Generator, np.dtype], np.ndarray]


# --------------------------------------------------------------------------------------------
# Input generators (all keep away from kinks and domain edges)


def normal(shape: Sequence[int], scale: float = 1.0) -> ADGen:
    def gen(rng: np.random.Generator, dtype: np.dtype) -> np.ndarray:
        return np.asarray(rng.standard_normal(tuple(shape)) * scale, dtype=dtype)

    return gen


def uniform(shape: Sequence[int], lo: float, hi: float) -> ADGen:
    def gen(rng: np.random.Generator, dtype: np.dtype) -> np.ndarray:
        return np.asarray(rng.uniform(lo, hi, size=tuple(shape)), dtype=dtype)

    return gen


def avoiding(
    shape: Sequence[int],
    points: Sequence[float] = (0.0,),
    lo: float = -2.0,
    hi: float = 2.0,
    gap: float = 0.15,
) -> ADGen:
    """Uniform in ``[lo, hi]`` but at least ``gap`` away from every kink in ``points``."""

    def gen(rng: np.random.Generator, dtype: np.dtype) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64))
        vals: list[float] = []
        while len(vals) < n:
            cand = rng.uniform(lo, hi, size=4 * n + 4)
            ok = np.all(np.abs(cand[:, None] - np.asarray(points, dtype=np.float64)[None, :]) > gap, axis=1)
            vals.extend(cand[ok].tolist())
        return np.asarray(vals[:n], dtype=dtype).reshape(tuple(shape))

    return gen


def distinct(shape: Sequence[int], spread: float = 1.0, min_gap: float = 0.05) -> ADGen:
    """Values with pairwise gaps of at least ``min_gap`` (no ties for Max/TopK/MaxPool)."""

    def gen(rng: np.random.Generator, dtype: np.dtype) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64))
        base = (np.arange(n) - n / 2) * min_gap * 2 + rng.uniform(-min_gap / 2, min_gap / 2, size=n)
        vals = rng.permutation(base) * spread
        return np.asarray(vals, dtype=dtype).reshape(tuple(shape))

    return gen


def fixed(value: Any) -> ADGen:
    def gen(rng: np.random.Generator, dtype: np.dtype) -> np.ndarray:
        arr = np.asarray(value)
        return arr.astype(dtype) if np.issubdtype(arr.dtype, np.floating) else arr

    return gen


# --------------------------------------------------------------------------------------------
# Crash-isolated transforms
#
# A native crash (SIGSEGV/SIGABRT) inside the core would take down the pytest(-xdist) worker and,
# after a few restarts, stop the whole session. The oracles therefore run each transform in a
# long-lived helper process (restarted after a crash); a crash becomes an ordinary test failure
# naming the transform and the signal.

_WORKER_CODE = r"""
import pickle, struct, sys
import onnx
import onnax

inp, out = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = inp.read(8)
    if len(head) < 8:
        break
    transform, data, kwargs = pickle.loads(inp.read(struct.unpack("<Q", head)[0]))
    try:
        res = getattr(onnax, transform)(onnx.load_from_string(data), **kwargs)
        payload = pickle.dumps(("ok", res.SerializeToString()))
    except BaseException as err:
        try:
            payload = pickle.dumps(("err", err))
        except Exception:
            payload = pickle.dumps(("text", type(err).__name__, str(err)))
    out.write(struct.pack("<Q", len(payload)) + payload)
    out.flush()
"""

_WORKER: subprocess.Popen | None = None


def _worker() -> subprocess.Popen:
    global _WORKER
    if _WORKER is None or _WORKER.poll() is not None:
        _WORKER = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
    return _WORKER


def guarded(transform: str, model: Any, **kwargs: Any) -> onnx.ModelProto:
    """``onnax.<transform>(model, **kwargs)`` in the helper process; returns a ModelProto."""
    global _WORKER
    data = to_proto(model).SerializeToString()
    proc = _worker()
    assert proc.stdin is not None and proc.stdout is not None
    request = pickle.dumps((transform, data, kwargs))
    try:
        proc.stdin.write(struct.pack("<Q", len(request)) + request)
        proc.stdin.flush()
        head = proc.stdout.read(8)
        payload = proc.stdout.read(struct.unpack("<Q", head)[0]) if len(head) == 8 else b""
    except BrokenPipeError:
        payload = b""
    if not payload:
        code = proc.wait()
        _WORKER = None
        name = signal.Signals(-code).name if code < 0 else f"exit status {code}"
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise AssertionError(f"onnax.{transform}({args}) crashed: {name}")
    result = pickle.loads(payload)
    if result[0] == "ok":
        return onnx.load_from_string(result[1])
    if result[0] == "err":
        raise result[1]
    raise RuntimeError(f"{result[1]}: {result[2]}")


def jvp(
    model: Any, inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None
) -> onnx.ModelProto:
    return guarded("jvp", model, inputs=inputs, outputs=outputs)


def vjp(
    model: Any, inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None
) -> onnx.ModelProto:
    return guarded("vjp", model, inputs=inputs, outputs=outputs)


def grad(model: Any, inputs: Sequence[str] | None = None, output: str | None = None) -> onnx.ModelProto:
    return guarded("grad", model, inputs=inputs, output=output)


# --------------------------------------------------------------------------------------------
# Model construction and inspection


def unique_node_names(nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Renames repeated node names (``vmap_oracle.node`` names nodes by op type)."""
    seen: dict[str, int] = {}
    for n in nodes:
        count = seen.get(n.name, 0)
        seen[n.name] = count + 1
        if count:
            n.name = f"{n.name}_{count}"
    return list(nodes)


def make_ad_model(nodes: Sequence[onnx.NodeProto], *args: Any, **kwargs: Any) -> onnx.ModelProto:
    """``vmap_oracle.make_model`` with unique node names."""
    return make_model(unique_node_names(nodes), *args, **kwargs)


def runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]


def elem_type(vi: onnx.ValueInfoProto) -> int:
    return int(vi.type.tensor_type.elem_type)


def default_selection(model: onnx.ModelProto) -> list[str]:
    """The documented default: FLOAT/DOUBLE runtime graph inputs, in graph order."""
    return [v.name for v in runtime_inputs(model) if elem_type(v) in FLOAT_TYPES]


def float_outputs(model: onnx.ModelProto) -> list[str]:
    return [o.name for o in model.graph.output if elem_type(o) in FLOAT_TYPES]


def derivative_outputs(model: onnx.ModelProto) -> list[str] | None:
    """Outputs an earlier onnax transform recorded as generated derivatives, if any."""
    for prop in model.metadata_props:
        if prop.key == "onnax.derivative_outputs":
            return list(json.loads(prop.value))
    return None


def default_jvp_outputs(model: onnx.ModelProto) -> list[str]:
    """The documented jvp default: recorded derivative outputs, else every float output."""
    recorded = derivative_outputs(model)
    return recorded if recorded else float_outputs(model)


def initializer_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def make_feeds(
    model: onnx.ModelProto, gens: Mapping[str, ADGen], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Values for every runtime input: ``gens[name]`` or standard normal of the declared shape."""
    feeds: dict[str, np.ndarray] = {}
    for vi in runtime_inputs(model):
        dtype = np_dtype(elem_type(vi))
        if vi.name in gens:
            feeds[vi.name] = np.asarray(gens[vi.name](rng, dtype))
            continue
        dims = vi.type.tensor_type.shape.dim
        shape = []
        for d in dims:
            if not d.HasField("dim_value"):
                raise ValueError(f"test bug: input {vi.name!r} has a symbolic dim; give a generator")
            shape.append(int(d.dim_value))
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = np.asarray(rng.standard_normal(tuple(shape)), dtype=dtype)
        else:
            raise ValueError(f"test bug: non-float input {vi.name!r} needs a generator")
    return feeds


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in model.graph.output]
    needed = {v.name for v in runtime_inputs(model)}
    vals = run_model(model, {k: np.asarray(v) for k, v in feeds.items() if k in needed})
    return dict(zip(names, vals, strict=True))


# --------------------------------------------------------------------------------------------
# Precision variants


def as_double(model: onnx.ModelProto) -> onnx.ModelProto:
    return convert_model_dtype(model, F, D)


def as_float(model: onnx.ModelProto) -> onnx.ModelProto:
    return convert_model_dtype(model, D, F)


@dataclass(frozen=True)
class Tol:
    rtol: float
    atol: float


TOL64 = Tol(1e-5, 1e-6)
TOL32 = Tol(2e-3, 5e-4)


def tol_for(model: onnx.ModelProto) -> Tol:
    types = {elem_type(v) for v in runtime_inputs(model)} | {t.data_type for t in model.graph.initializer}
    return TOL32 if F in types else TOL64


def assert_close(name: str, actual: np.ndarray, expected: np.ndarray, tol: Tol) -> None:
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape}, expected {expected.shape}"
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    np.testing.assert_allclose(
        actual.astype(np.float64),
        expected.astype(np.float64),
        rtol=tol.rtol,
        atol=tol.atol * scale,
        err_msg=name,
    )


# --------------------------------------------------------------------------------------------
# Helpers shared by the checks


@dataclass
class Prepared:
    """A source model with its selections resolved and float64 oracle inputs drawn."""

    model: onnx.ModelProto  # as given (float32 or float64)
    oracle: onnx.ModelProto  # float64 model with the selected initializers lifted to inputs
    inputs: list[str]
    feeds: dict[str, np.ndarray]  # runtime feeds of ``model``
    oracle_feeds: dict[str, np.ndarray]  # feeds of ``oracle`` (float64 where possible)
    tol: Tol


def prepare(
    model: onnx.ModelProto,
    inputs: Sequence[str] | None,
    gens: Mapping[str, ADGen] | None,
    seed: int,
    oracle_model: onnx.ModelProto | None = None,
) -> Prepared:
    gens = dict(gens or {})
    sel = list(inputs) if inputs is not None else default_selection(model)
    rng = np.random.default_rng(seed)
    feeds = make_feeds(model, gens, rng)
    base = oracle_model if oracle_model is not None else as_double(model)
    oracle = lift_initializers(base, sel)
    inits = initializer_values(base)
    oracle_feeds: dict[str, np.ndarray] = {}
    for vi in runtime_inputs(oracle):
        dtype = np_dtype(elem_type(vi))
        if vi.name in feeds:
            oracle_feeds[vi.name] = np.asarray(feeds[vi.name]).astype(dtype)
        else:
            oracle_feeds[vi.name] = inits[vi.name]
    return Prepared(model, oracle, sel, feeds, oracle_feeds, tol_for(model))


def selected_primal(p: Prepared, name: str) -> np.ndarray:
    """The primal value of a selected input of ``p.model`` (runtime feed or stored value)."""
    if name in p.feeds:
        return p.feeds[name]
    return initializer_values(p.model)[name]


def appended_inputs(source: onnx.ModelProto, result: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Runtime inputs ``result`` appends after the source's runtime inputs (which must be kept)."""
    src = [v.name for v in runtime_inputs(source)]
    res = runtime_inputs(result)
    assert [v.name for v in res[: len(src)]] == src, (
        f"source runtime inputs {src} not kept first: {[v.name for v in res]}"
    )
    return res[len(src) :]


def fd_direction(
    oracle: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    direction: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    eps: float,
) -> dict[str, np.ndarray]:
    """Central finite difference of ``outputs`` along ``direction`` (float64)."""
    plus = dict(feeds)
    minus = dict(feeds)
    for k, v in direction.items():
        plus[k] = np.asarray(feeds[k] + eps * v, dtype=feeds[k].dtype)
        minus[k] = np.asarray(feeds[k] - eps * v, dtype=feeds[k].dtype)
    fp = run(oracle, plus)
    fm = run(oracle, minus)
    return {o: (fp[o].astype(np.float64) - fm[o].astype(np.float64)) / (2 * eps) for o in outputs}


def fd_eps(model: onnx.ModelProto) -> float:
    types = {elem_type(v) for v in runtime_inputs(model)} | {t.data_type for t in model.graph.initializer}
    return 1e-2 if F in types else 1e-6


# --------------------------------------------------------------------------------------------
# jvp


def check_jvp(
    model: onnx.ModelProto,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    *,
    gens: Mapping[str, ADGen] | None = None,
    seed: int = 0,
    tol: Tol | None = None,
    oracle_model: onnx.ModelProto | None = None,
    eps: float | None = None,
) -> onnx.ModelProto:
    """``jvp(model)`` must return the primal outputs, then ``J v`` matching central FD."""

    p = prepare(model, inputs, gens, seed, oracle_model)
    tol = tol or p.tol
    out_sel = list(outputs) if outputs is not None else default_jvp_outputs(model)
    src_bytes = model.SerializeToString()
    jm = jvp(model, inputs=inputs, outputs=outputs)
    assert model.SerializeToString() == src_bytes, "jvp mutated its source model"
    tangents = appended_inputs(model, jm)
    assert len(tangents) == len(p.inputs), (
        f"jvp appended {[t.name for t in tangents]} for selected inputs {p.inputs}"
    )
    n_src_out = len(model.graph.output)
    out_names = [o.name for o in jm.graph.output]
    assert out_names[:n_src_out] == [o.name for o in model.graph.output], (
        f"primal outputs not first: {out_names}"
    )
    assert len(out_names) == n_src_out + len(out_sel), f"jvp outputs {out_names} for selected {out_sel}"

    rng = np.random.default_rng(seed + 1000)
    direction: dict[str, np.ndarray] = {}
    feeds = dict(p.feeds)
    for name, tvi in zip(p.inputs, tangents, strict=True):
        primal = selected_primal(p, name)
        v = rng.standard_normal(primal.shape)
        direction[name] = v
        assert elem_type(tvi) == helper.np_dtype_to_tensor_dtype(primal.dtype), (
            f"tangent input {tvi.name}: dtype {elem_type(tvi)} but primal {name} is {primal.dtype}"
        )
        feeds[tvi.name] = v.astype(primal.dtype)
    got = run(jm, feeds)
    src_out = run(model, p.feeds)
    for o in model.graph.output:
        assert_close(f"primal output {o.name!r}", got[o.name], src_out[o.name], Tol(1e-6, 1e-6))
    fd = fd_direction(p.oracle, p.oracle_feeds, direction, out_sel, eps or fd_eps(p.oracle))
    for oname, tname in zip(out_sel, out_names[n_src_out:], strict=True):
        assert got[tname].dtype == src_out[oname].dtype, (
            f"tangent {tname}: dtype {got[tname].dtype}, primal {src_out[oname].dtype}"
        )
        assert_close(f"tangent {tname!r} of {oname!r} vs finite differences", got[tname], fd[oname], tol)
    return jm


# --------------------------------------------------------------------------------------------
# vjp (dot-product test)


def check_vjp_dot(
    model: onnx.ModelProto,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    *,
    gens: Mapping[str, ADGen] | None = None,
    seed: int = 0,
    trials: int = 2,
    tol: Tol | None = None,
) -> onnx.ModelProto:
    """``<u, J v> == <J^T u, v>`` with ``J v`` from ``jvp`` and ``J^T u`` from ``vjp``."""

    p = prepare(model, inputs, gens, seed)
    tol = tol or p.tol
    out_sel = list(outputs) if outputs is not None else float_outputs(model)
    src_bytes = model.SerializeToString()
    vm = vjp(model, inputs=inputs, outputs=outputs)
    assert model.SerializeToString() == src_bytes, "vjp mutated its source model"
    jm = jvp(model, inputs=inputs, outputs=out_sel)
    cots = appended_inputs(model, vm)
    tans = appended_inputs(model, jm)
    assert len(cots) == len(out_sel), f"vjp appended {[c.name for c in cots]} for outputs {out_sel}"
    n_src_out = len(model.graph.output)
    v_outs = [o.name for o in vm.graph.output]
    j_outs = [o.name for o in jm.graph.output]
    assert v_outs[:n_src_out] == [o.name for o in model.graph.output], f"primal outputs not first: {v_outs}"
    assert len(v_outs) == n_src_out + len(p.inputs), f"vjp outputs {v_outs} for selected inputs {p.inputs}"

    src_out = run(model, p.feeds)
    rng = np.random.default_rng(seed + 2000)
    for trial in range(trials):
        jfeeds = dict(p.feeds)
        vfeeds = dict(p.feeds)
        vs = {}
        for name, tvi in zip(p.inputs, tans, strict=True):
            primal = selected_primal(p, name)
            vs[name] = rng.standard_normal(primal.shape).astype(primal.dtype)
            jfeeds[tvi.name] = vs[name]
        us = {}
        for oname, cvi in zip(out_sel, cots, strict=True):
            prim = src_out[oname]
            us[oname] = rng.standard_normal(prim.shape).astype(prim.dtype)
            assert elem_type(cvi) == helper.np_dtype_to_tensor_dtype(prim.dtype), (
                f"cotangent input {cvi.name}: dtype {elem_type(cvi)}, primal output {oname} is {prim.dtype}"
            )
            vfeeds[cvi.name] = us[oname]
        jres = run(jm, jfeeds)
        vres = run(vm, vfeeds)
        if trial == 0:
            for o in model.graph.output:
                assert_close(f"vjp primal output {o.name!r}", vres[o.name], src_out[o.name], Tol(1e-6, 1e-6))
        lhs = sum(
            float(np.sum(us[o].astype(np.float64) * jres[t].astype(np.float64)))
            for o, t in zip(out_sel, j_outs[n_src_out:], strict=True)
        )
        rhs = 0.0
        for name, cname in zip(p.inputs, v_outs[n_src_out:], strict=True):
            ct = vres[cname]
            assert ct.shape == vs[name].shape, f"cotangent {cname}: shape {ct.shape}, input {vs[name].shape}"
            assert ct.dtype == vs[name].dtype, f"cotangent {cname}: dtype {ct.dtype}, input {vs[name].dtype}"
            rhs += float(np.sum(ct.astype(np.float64) * vs[name].astype(np.float64)))
        scale = max(
            1.0,
            sum(float(np.sum(np.abs(jres[t]))) for t in j_outs[n_src_out:]),
            sum(float(np.sum(np.abs(vres[c]))) for c in v_outs[n_src_out:]),
        )
        assert abs(lhs - rhs) <= tol.rtol * 10 * scale, (
            f"dot-product test failed (trial {trial}): <u, Jv> = {lhs!r}, <J^T u, v> = {rhs!r}"
        )
    return vm


# --------------------------------------------------------------------------------------------
# grad


def scalarize(
    model: onnx.ModelProto, gens: Mapping[str, ADGen] | None = None, seed: int = 0, name: str = "ad_loss"
) -> onnx.ModelProto:
    """Appends ``name = sum_o ReduceSum(o * c_o)`` over the float outputs, with fixed random
    weights ``c_o`` (initializers), and makes it the last graph output."""
    rng = np.random.default_rng(seed + 3000)
    outs = run(model, make_feeds(model, dict(gens or {}), np.random.default_rng(seed)))
    m = onnx.ModelProto()
    m.CopyFrom(model)
    terms = []
    for o in float_outputs(model):
        val = outs[o]
        c = np.asarray(rng.uniform(0.5, 1.5, size=val.shape) * rng.choice([-1.0, 1.0], size=val.shape))
        cname, pname, sname = f"{name}_w_{o}", f"{name}_p_{o}", f"{name}_s_{o}"
        m.graph.initializer.append(numpy_helper.from_array(c.astype(val.dtype), name=cname))
        m.graph.node.append(helper.make_node("Mul", [o, cname], [pname], name=f"{name}_mul_{o}"))
        summed = pname
        if val.dtype != np.float64 and D in {elem_type(x) for x in model.graph.output}:
            summed = f"{name}_c_{o}"
            m.graph.node.append(helper.make_node("Cast", [pname], [summed], to=D, name=f"{name}_cast_{o}"))
        m.graph.node.append(
            helper.make_node("ReduceSum", [summed], [sname], keepdims=0, name=f"{name}_rs_{o}")
        )
        terms.append(sname)
    assert terms, "test bug: no float outputs to scalarize"
    if len(terms) == 1:
        m.graph.node.append(helper.make_node("Identity", terms, [name], name=f"{name}_id"))
    else:
        m.graph.node.append(helper.make_node("Sum", terms, [name], name=f"{name}_sum"))
    out_types = {outs[o].dtype for o in float_outputs(model)}
    dt = np.float64 if np.float64 in out_types and len(out_types) > 1 else next(iter(out_types))
    m.graph.output.append(
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), [])
    )
    return m


def check_grad(
    model: onnx.ModelProto,
    inputs: Sequence[str] | None = None,
    output: str | None = None,
    *,
    gens: Mapping[str, ADGen] | None = None,
    seed: int = 0,
    max_coords: int = 24,
    tol: Tol | None = None,
    oracle_model: onnx.ModelProto | None = None,
    eps: float | None = None,
) -> onnx.ModelProto:
    """``grad(model)`` must return the primal outputs then one gradient per selected input,
    each matching central FD of the loss coordinate by coordinate."""

    p = prepare(model, inputs, gens, seed, oracle_model)
    tol = tol or p.tol
    loss = output
    if loss is None:
        scalars = [o.name for o in model.graph.output if len(o.type.tensor_type.shape.dim) == 0]
        assert len(scalars) == 1, "test bug: pass output="
        loss = scalars[0]
    src_bytes = model.SerializeToString()
    gm = grad(model, inputs=inputs, output=output)
    assert model.SerializeToString() == src_bytes, "grad mutated its source model"
    assert appended_inputs(model, gm) == [], "grad must not add runtime inputs"
    n_src_out = len(model.graph.output)
    outs = [o.name for o in gm.graph.output]
    assert outs[:n_src_out] == [o.name for o in model.graph.output], f"primal outputs not first: {outs}"
    assert len(outs) == n_src_out + len(p.inputs), f"grad outputs {outs} for selected inputs {p.inputs}"
    got = run(gm, p.feeds)
    src_out = run(model, p.feeds)
    for o in model.graph.output:
        assert_close(f"primal output {o.name!r}", got[o.name], src_out[o.name], Tol(1e-6, 1e-6))
    eps = eps or fd_eps(p.oracle)
    rng = np.random.default_rng(seed + 4000)
    for name, gname in zip(p.inputs, outs[n_src_out:], strict=True):
        primal = selected_primal(p, name)
        g = got[gname]
        assert g.shape == primal.shape, f"gradient {gname}: shape {g.shape}, input {primal.shape}"
        assert g.dtype == primal.dtype, f"gradient {gname}: dtype {g.dtype}, input {primal.dtype}"
        n = primal.size
        coords = np.arange(n) if n <= max_coords else np.sort(rng.choice(n, size=max_coords, replace=False))
        fd = np.zeros(len(coords))
        for k, idx in enumerate(coords):
            e = np.zeros(n)
            e[idx] = 1.0
            fd[k] = fd_direction(p.oracle, p.oracle_feeds, {name: e.reshape(primal.shape)}, [loss], eps)[loss]
        assert_close(f"gradient {gname!r} vs finite differences", g.reshape(-1)[coords], fd, tol)
    return gm


# --------------------------------------------------------------------------------------------
# Hessian-vector products: jvp(grad(f))


def check_hvp(
    model: onnx.ModelProto,
    wrt: Sequence[str],
    inputs: Sequence[str] | None = None,
    output: str | None = None,
    *,
    gens: Mapping[str, ADGen] | None = None,
    seed: int = 0,
    tol: Tol | None = None,
    reload: bool = False,
    oracle_model: onnx.ModelProto | None = None,
    eps: float | None = None,
) -> onnx.ModelProto:
    """``jvp(grad(f), inputs=wrt)`` keeps the loss and gradients and appends their tangents,
    which must match central FD of the gradient graph along the tangent direction (the gradient
    graph of ``oracle_model``, a float64 model of the same function, when given: for ops ONNX
    Runtime has no float64 kernel for)."""

    gm = grad(model, inputs=inputs, output=output)
    oracle_gm = None if oracle_model is None else grad(oracle_model, inputs=inputs, output=output)
    if reload:
        gm = onnx.load_from_string(gm.SerializeToString())
    n_g_out = len(gm.graph.output)
    n_src_out = len(model.graph.output)
    grad_outs = [o.name for o in gm.graph.output][n_src_out:]
    hm = jvp(gm, inputs=list(wrt))
    houts = [o.name for o in hm.graph.output]
    assert houts[:n_g_out] == [o.name for o in gm.graph.output], f"grad outputs not kept first: {houts}"
    assert len(houts) == n_g_out + len(grad_outs), (
        f"jvp(grad(f)) should append one tangent per gradient {grad_outs}, got outputs {houts}"
    )
    p = prepare(gm, list(wrt), gens, seed, oracle_gm)
    tol = tol or p.tol
    tangents = appended_inputs(gm, hm)
    assert len(tangents) == len(wrt), f"jvp appended {[t.name for t in tangents]} for {list(wrt)}"
    rng = np.random.default_rng(seed + 5000)
    feeds = dict(p.feeds)
    direction = {}
    for name, tvi in zip(wrt, tangents, strict=True):
        primal = selected_primal(p, name)
        direction[name] = rng.standard_normal(primal.shape)
        feeds[tvi.name] = direction[name].astype(primal.dtype)
    got = run(hm, feeds)
    ref = run(gm, p.feeds)
    for o in gm.graph.output:
        assert_close(f"kept output {o.name!r}", got[o.name], ref[o.name], Tol(1e-6, 1e-6))
    fd = fd_direction(p.oracle, p.oracle_feeds, direction, grad_outs, eps or 10 * fd_eps(p.oracle))
    for gname, tname in zip(grad_outs, houts[n_g_out:], strict=True):
        assert_close(
            f"HVP {tname!r} (tangent of {gname!r}) vs FD of the gradient", got[tname], fd[gname], tol
        )
    return hm


# --------------------------------------------------------------------------------------------
# Per-example gradients: vmap(grad(f))


def vmap_gens(model: onnx.ModelProto, gens: Mapping[str, ADGen]) -> dict[str, Callable]:
    """Adapts ``gen(rng, dtype)`` generators to ``vmap_oracle``'s ``gen(rng)``."""
    out: dict[str, Callable] = {}
    for vi in runtime_inputs(model):
        if vi.name in gens:
            g = gens[vi.name]
            dtype = np_dtype(elem_type(vi))
            out[vi.name] = lambda rng, g=g, dtype=dtype: g(rng, dtype)
    return out


def check_per_example_grad(
    model: onnx.ModelProto,
    in_axes: Sequence[int | None],
    inputs: Sequence[str] | None = None,
    output: str | None = None,
    *,
    gens: Mapping[str, ADGen] | None = None,
    batch_sizes: Sequence[int] = (1, 5),
    tol: Tol | None = None,
) -> onnx.ModelProto:
    """``vmap(grad(f), in_axes)`` must equal a loop of ``grad(f)`` over the examples."""

    gm = grad(model, inputs=inputs, output=output)
    tol = tol or tol_for(model)
    return assert_vmap_matches(
        gm,
        in_axes=tuple(in_axes),
        gens=vmap_gens(gm, dict(gens or {})),
        batch_sizes=batch_sizes,
        rtol=tol.rtol,
        atol=tol.atol,
    )


def check_vmap_of(
    transformed: onnx.ModelProto,
    in_axes: Any,
    *,
    gens: Mapping[str, ADGen] | None = None,
    tol: Tol = TOL64,
) -> onnx.ModelProto:
    """``vmap`` of an already transformed model against a per-example loop."""
    return assert_vmap_matches(
        transformed,
        in_axes=in_axes,
        gens=vmap_gens(transformed, dict(gens or {})),
        batch_sizes=(1, 4),
        rtol=tol.rtol,
        atol=tol.atol,
    )


def battery(
    cases: Sequence[Any],
    ids: Sequence[str],
    *,
    inputs: Callable[[Any], Sequence[str]],
    hvp_wrt: Callable[[Any], Sequence[str]],
    per_example_axes: Callable[[Any], Sequence[int | None]],
    gens: Callable[[Any], Mapping[str, ADGen] | None] = lambda case: getattr(case, "gens", None),
    oracle: Callable[[Any], onnx.ModelProto | None] = lambda case: None,
    loss: str = "loss",
) -> tuple[Callable[..., None], ...]:
    """The derivative checks every rule's cases get, as parametrized pytest functions (assign
    them to module names starting with ``test_``): jvp against FD, vjp by the dot-product test,
    grad against FD, HVP against FD of the gradient, per-example gradients against a loop.
    ``cases`` carry a ``model``; the callables give each case's selected inputs, HVP
    directions, per-example ``in_axes``, input generators and an optional float64 oracle model
    (for ops ONNX Runtime cannot run in float64)."""
    import pytest

    each = pytest.mark.parametrize("case", list(cases), ids=list(ids))

    @each
    def test_jvp(case: Any) -> None:
        check_jvp(case.model, inputs(case), gens=gens(case), oracle_model=oracle(case))

    @each
    def test_vjp_dot(case: Any) -> None:
        check_vjp_dot(case.model, inputs(case), gens=gens(case))

    @each
    def test_grad(case: Any) -> None:
        check_grad(case.model, inputs(case), loss, gens=gens(case), oracle_model=oracle(case))

    @each
    def test_hvp(case: Any) -> None:
        check_hvp(case.model, hvp_wrt(case), inputs(case), loss, gens=gens(case), oracle_model=oracle(case))

    @each
    def test_per_example_grad(case: Any) -> None:
        check_per_example_grad(case.model, per_example_axes(case), inputs(case), loss, gens=gens(case))

    return test_jvp, test_vjp_dot, test_grad, test_hvp, test_per_example_grad


def float32_battery(
    cases: Sequence[Any],
    ids: Sequence[str],
    *,
    inputs: Callable[[Any], Sequence[str]],
    gens: Callable[[Any], Mapping[str, ADGen] | None] = lambda case: getattr(case, "gens", None),
    loss: str = "loss",
) -> Callable[..., None]:
    """jvp and grad of each case's model in float32 against FD of the float64 model."""
    import pytest

    @pytest.mark.parametrize("case", list(cases), ids=list(ids))
    def test_f32(case: Any) -> None:
        check_jvp(as_float(case.model), inputs(case), gens=gens(case), oracle_model=case.model)
        check_grad(as_float(case.model), inputs(case), loss, gens=gens(case), oracle_model=case.model)

    return test_f32


def inline_function_op(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its one function op replaced by the op's ONNX function body (context-
    dependent bodies built for the node's input types), inlined: an oracle for derivatives taken
    through the op that does not go through onnax's own expansion code."""
    import onnx.inliner

    out = onnx.ModelProto()
    out.CopyFrom(model)
    node = out.graph.node[0]
    versions = {o.domain: o.version for o in out.opset_import}
    types = {i.name: i.type for i in out.graph.input}
    # (Any: onnx's type stubs lack the schema's function accessors its bindings have.)
    schema: Any = onnx.defs.get_schema(node.op_type, versions[node.domain], node.domain)
    body = onnx.FunctionProto()
    if schema.has_context_dependent_function:
        body.ParseFromString(
            schema.get_context_dependent_function(
                node.SerializeToString(),
                [types.get(i, onnx.TypeProto()).SerializeToString() for i in node.input],
            )
        )
    else:
        body.CopyFrom(schema.get_function_with_opset_version(versions[node.domain]))
    body.domain = "oracle.fn"
    if not body.opset_import:
        body.opset_import.extend([onnx.helper.make_opsetid("", versions[""])])
    node.domain = "oracle.fn"
    out.functions.append(body)
    out.opset_import.append(onnx.helper.make_opsetid("oracle.fn", 1))
    return onnx.inliner.inline_local_functions(out)


def ad_error(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """Calls an onnax transform expecting ``onnax.OnnaxError`` (a ValueError); returns the text."""
    import onnax
    import pytest

    with pytest.raises(onnax.OnnaxError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, ValueError)
    return str(info.value)
