"""Runs every transform on every corpus entry and compares with the stored references.

For an entry (see :mod:`conformance.corpus.artifacts`) and a transform this

1. builds the transformed model with onnax (timed; ``vmap_grad`` and ``jvp_grad`` time both
   transforms),
2. applies the structural checks (:mod:`conformance.corpus.checks`: ``onnx.checker`` full check,
   strict shape inference; a ``validate`` step can be added there),
3. runs it in ONNX Runtime (one thread) on the stored inputs and compares every output that has
   a reference: ``max_error`` is ``max |actual - expected| / max(max |expected|, 1e-3)`` over the
   outputs, and must not exceed the entry's tolerance for the transform,
4. times it against the source model's forward pass on the per-example inputs (median of
   repeated runs; for ``vmap`` / ``vmap_grad`` the transformed model runs ``batch`` examples).

Statuses: ``passed``; ``failed`` (wrong numbers or shapes or dtypes, a check or ONNX Runtime
rejects the model, any exception other than ``onnax.OnnaxError``, a crash); ``unsupported``
(onnax raised its ``OnnaxError`` diagnostic, recorded); ``skipped`` (nothing to select, e.g. an
entry without parameters for grad).

Each entry runs in a child process so a native crash or a hang becomes a ``failed`` row.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import statistics
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from conformance.corpus import artifacts, checks

# Default allowed max_error against an exact (float64 framework) reference, per source dtype.
# Second-order results (HVPs) accumulate one more level of float32 rounding.
DEFAULT_TOL = {
    "float32": {"vmap": 1e-5, "grad": 1e-5, "jvp": 1e-5, "vjp": 1e-5, "vmap_grad": 1e-5, "jvp_grad": 1e-4},
    "float64": {t: 1e-9 for t in artifacts.TRANSFORMS},
}
ENTRY_TIMEOUT = 600.0


@dataclass
class Row:
    model: str
    transform: str
    status: str
    max_error: float | None = None
    tolerance: float | None = None
    transform_s: float | None = None
    runtime_ratio: float | None = None
    message: str = ""


# --------------------------------------------------------------------------------------------
# Building the transformed model


def runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]


def build(transform: str, model: onnx.ModelProto, m: artifacts.Manifest) -> onnx.ModelProto:
    import onnax

    def grad_of(src: onnx.ModelProto) -> onnx.ModelProto:
        return onnax.grad(src, inputs=m.params, output=m.loss)

    if transform == "vmap":
        return onnax.vmap(model, in_axes=0)
    if transform == "grad":
        return grad_of(model)
    if transform == "jvp":
        return onnax.jvp(model, inputs=m.jvp_inputs, outputs=m.outputs)
    if transform == "vjp":
        return onnax.vjp(model, inputs=m.vjp_inputs, outputs=m.outputs)
    if transform == "vmap_grad":
        return onnax.vmap(grad_of(model), in_axes=0)
    if transform == "jvp_grad":
        return onnax.jvp(grad_of(model), inputs=m.params)
    raise ValueError(f"unknown transform {transform!r}")


def selection(transform: str, m: artifacts.Manifest) -> list[str]:
    """What the transform selects; empty means the case is skipped."""
    if transform in ("grad", "vmap_grad", "jvp_grad"):
        return m.params
    if transform == "jvp":
        return m.jvp_inputs
    if transform == "vjp":
        return m.vjp_inputs
    return [v for v in m.outputs]


def feeds_for(
    transform: str,
    source: onnx.ModelProto,
    result: onnx.ModelProto,
    m: artifacts.Manifest,
    arrays: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """Stored source inputs, then the appended tangent / cotangent inputs in selection order."""
    src = [v.name for v in runtime_inputs(source)]
    res = [v.name for v in runtime_inputs(result)]
    if res[: len(src)] != src:
        raise AssertionError(f"source runtime inputs {src} are not kept first: {res}")
    feeds = {n: arrays[f"{transform}/feed/{n}"] for n in src}
    appended = res[len(src) :]
    if transform == "jvp":
        keys = [f"jvp/tangent/{n}" for n in m.jvp_inputs]
    elif transform == "jvp_grad":
        keys = [f"jvp_grad/tangent/{n}" for n in m.params]
    elif transform == "vjp":
        keys = [f"vjp/cotangent/{n}" for n in m.outputs]
    else:
        keys = []
    if len(keys) != len(appended):
        raise AssertionError(f"{transform} appended inputs {appended}, expected one per {keys}")
    declared = {v.name: v for v in runtime_inputs(result)}
    rng = np.random.default_rng(0)
    for name, key in zip(appended, keys, strict=True):
        if key in arrays:
            feeds[name] = arrays[key]
            continue
        # Entries without references (large models) store no tangents: any direction will do.
        tt = declared[name].type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        feeds[name] = rng.standard_normal(shape).astype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
    return feeds


# --------------------------------------------------------------------------------------------
# Running and timing


def session(model: onnx.ModelProto) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"]
    )


def timed_run(sess: Any, feeds: dict[str, np.ndarray], budget_s: float = 0.3, max_runs: int = 50) -> float:
    """Median wall time of one run (at least 3 runs, then until the budget is spent)."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget_s and len(times) < max_runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def output_groups(transform: str, n_src_out: int, m: artifacts.Manifest) -> list[range]:
    """Output positions of one kind: primal outputs, first derivatives, second derivatives."""
    if transform == "vmap":
        return [range(n_src_out)]
    n_sel = {"jvp": len(m.outputs), "vjp": len(m.vjp_inputs)}.get(transform, len(m.params))
    groups = [range(n_src_out), range(n_src_out, n_src_out + n_sel)]
    if transform == "jvp_grad":
        groups.append(range(n_src_out + n_sel, n_src_out + 2 * n_sel))
    return groups


def max_error(
    actual: Sequence[np.ndarray], expected: dict[int, np.ndarray], groups: Sequence[range]
) -> tuple[float, str]:
    """Largest error over the outputs with a reference, and which output it was.

    An output's error is ``max |actual - expected|`` divided by the largest ``|expected|`` of
    its group (all primal outputs, all first derivatives, all second derivatives; at least
    1e-3). Per group rather than per output because a derivative that is exactly zero by
    cancellation (e.g. the key bias of attention: softmax ignores a per-row shift) carries
    float32 rounding at the scale of the other derivatives, not at its own scale of zero.
    """
    scales: dict[int, float] = {}
    for group in groups:
        members = [expected[k] for k in group if k in expected and expected[k].size]
        scale = max([float(np.max(np.abs(e))) for e in members] + [1e-3])
        for k in group:
            scales[k] = scale
    worst, where = 0.0, ""
    for k, exp in expected.items():
        got = np.asarray(actual[k])
        if got.shape != exp.shape:
            raise AssertionError(f"output {k}: shape {got.shape}, reference {exp.shape}")
        if not np.all(np.isfinite(got)):
            return float("inf"), f"output {k} is not finite"
        diff = np.abs(got.astype(np.float64) - exp.astype(np.float64))
        err = float(np.max(diff)) / scales.get(k, max(float(np.max(np.abs(exp))), 1e-3)) if diff.size else 0.0
        if err >= worst:
            worst, where = err, f"output {k}"
    return worst, where


def tolerance(transform: str, m: artifacts.Manifest, source: onnx.ModelProto) -> float:
    if transform in m.tolerances:
        return m.tolerances[transform]
    types = {v.type.tensor_type.elem_type for v in source.graph.output}
    kind = "float64" if types == {onnx.TensorProto.DOUBLE} else "float32"
    return DEFAULT_TOL[kind][transform]


def run_case(
    transform: str,
    source: onnx.ModelProto,
    m: artifacts.Manifest,
    arrays: dict[str, np.ndarray],
    extra_checks: Sequence[checks.Check] = (),
) -> Row:
    import onnax

    row = Row(m.name, transform, "failed")
    if not selection(transform, m):
        row.status, row.message = "skipped", "nothing to select (no parameters)"
        return row
    expected = {int(k.rsplit("/", 1)[1]): v for k, v in arrays.items() if k.startswith(f"{transform}/out/")}
    # Without a reference the case is still built, checked, run and timed, then "skipped".
    try:
        with warnings.catch_warnings(record=True) as notices:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            result = build(transform, source, m)
            row.transform_s = time.perf_counter() - t0
        # onnax's notices (e.g. an op batched by a per-example Scan) go into the table.
        row.message = "; ".join(str(w.message).removeprefix("onnax: ").split(";")[0] for w in notices)
        row.tolerance = tolerance(transform, m, source) if expected else None
    except onnax.OnnaxError as err:
        row.status, row.message = "unsupported", str(err).strip().splitlines()[0]
        return row
    except Exception as err:
        row.message = f"transform raised {type(err).__name__}: {err}"
        return row
    try:
        feeds = feeds_for(transform, source, result, m, arrays)
        autodiff = transform in ("grad", "jvp", "vjp", "jvp_grad")
        for check in [*checks.DEFAULT_CHECKS, *(checks.AUTODIFF_CHECKS if autodiff else []), *extra_checks]:
            check(source, result, feeds)
        sess = session(result)
        actual = sess.run(None, feeds)
        src_types = {o.name: o.type.tensor_type.elem_type for o in source.graph.output}
        for o, val in zip(result.graph.output, actual, strict=True):
            want = src_types.get(o.name, o.type.tensor_type.elem_type)
            if onnx.helper.np_dtype_to_tensor_dtype(np.asarray(val).dtype) != want:
                raise AssertionError(f"output {o.name!r} has dtype {np.asarray(val).dtype}")
        error, where = 0.0, ""
        if expected:
            error, where = max_error(actual, expected, output_groups(transform, len(source.graph.output), m))
            row.max_error = error
        fwd_key = "vmap" if transform in ("vmap", "vmap_grad") else transform
        src_feeds = {
            n: arrays[f"{fwd_key}/feed/{n}"][0] if fwd_key == "vmap" else arrays[f"{fwd_key}/feed/{n}"]
            for n in (v.name for v in runtime_inputs(source))
        }
        row.runtime_ratio = timed_run(sess, feeds) / timed_run(session(source), src_feeds)
        if not expected:
            why = m.reference_by_transform.get(transform, "none stored")
            row.status, row.message = "skipped", f"no reference: {why}. {row.message}".strip()
        elif row.tolerance is not None and error <= row.tolerance:
            row.status = "passed"
        else:
            row.message = f"max error {error:.3g} at {where} exceeds {row.tolerance:g}. {row.message}".strip()
    except Exception as err:
        row.message = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    return row


def run_entry(
    name: str,
    transforms: Sequence[str] = artifacts.TRANSFORMS,
    root: Path = artifacts.MODELS_DIR,
    extra_checks: Sequence[checks.Check] = (),
) -> list[Row]:
    onnx_path, js, npz = artifacts.paths(name, root)
    m = artifacts.read_manifest(js)
    source = onnx.load(onnx_path)
    arrays = artifacts.read_arrays(npz)
    _warm_up(source)
    return [run_case(t, source, m, arrays, extra_checks) for t in transforms]


def _warm_up(source: onnx.ModelProto) -> None:
    """One untimed transform: the first onnax call of a process pays one-time setup."""
    import onnax

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            onnax.vmap(source, in_axes=0)
    except Exception:
        pass  # the timed cases report any problem


def _entry_worker(name: str, transforms: Sequence[str], root: str, validate: bool) -> list[dict[str, Any]]:
    extra = [checks.onnax_validate] if validate else []
    try:
        return [asdict(r) for r in run_entry(name, transforms, Path(root), extra)]
    except Exception:
        return [
            asdict(Row(name, t, "failed", message=traceback.format_exc(limit=2).splitlines()[-1]))
            for t in transforms
        ]


def run_corpus(
    names: Sequence[str],
    transforms: Sequence[str] = artifacts.TRANSFORMS,
    root: Path = artifacts.MODELS_DIR,
    timeout: float = ENTRY_TIMEOUT,
    progress: Callable[[str], None] | None = None,
    validate: bool = False,
) -> list[Row]:
    """Every entry in its own child process (a crash or a hang fails that entry's rows)."""
    rows: list[Row] = []
    ctx = multiprocessing.get_context("spawn")
    for name in names:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
            fut = pool.submit(_entry_worker, name, list(transforms), str(root), validate)
            try:
                got = [Row(**r) for r in fut.result(timeout=timeout)]
            except concurrent.futures.TimeoutError:
                for p in list(getattr(pool, "_processes", {}).values()):
                    p.kill()
                got = [Row(name, t, "failed", message=f"timed out after {timeout:.0f} s") for t in transforms]
            except concurrent.futures.process.BrokenProcessPool:
                got = [Row(name, t, "failed", message="the worker process crashed") for t in transforms]
        rows.extend(got)
        if progress:
            progress(name)
    return rows
