"""``onnax bench``: ONNX Runtime latency of a model and of its transforms, in one report.

Measured the way the seed's validation page describes: session initialization and the first
run are single samples; the warmed latency is the median of per-repeat mean run times after
a warm-up; the optimized graph (for op counts after ORT optimization) comes from a separate
session, so saving it does not inflate the initialization time. Errors are against the
float64 reference of ``onnax validate``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from onnax.testing._chain import parse_chain
from onnax.testing._env import cpu, source_revision, versions
from onnax.testing._evaluate import Progress, evaluate
from onnax.testing._inputs import Feeds, index_ranges, make_feeds
from onnax.testing._models import ModelLike, ValidationInputError, load, op_counts
from onnax.testing._reference import Budget, build_reference
from onnax.testing._runtime import runtime_log

TRANSFORMS = ("vmap", "grad", "jvp", "vjp", "vmap_grad", "hvp")


def _transformed(
    source: onnx.ModelProto, in_axes: Any, inputs: Sequence[str] | None
) -> dict[str, Callable[[], onnx.ModelProto]]:
    from onnax import grad, jvp, vjp, vmap

    sel = list(inputs) if inputs else None
    return {
        "vmap": lambda: vmap(source, in_axes=in_axes),
        "grad": lambda: grad(source, inputs=sel),
        "jvp": lambda: jvp(source, inputs=sel),
        "vjp": lambda: vjp(source, inputs=sel),
        "vmap_grad": lambda: vmap(grad(source, inputs=sel), in_axes=in_axes),
        "hvp": lambda: jvp(grad(source, inputs=sel), inputs=sel),
    }


def _session(
    data: bytes, threads: int, optimized_path: str | None = None, log: list[str] | None = None
) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    if optimized_path:
        opts.optimized_model_filepath = optimized_path
    with runtime_log(log if log is not None else []):
        return ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])


def measure(
    model: onnx.ModelProto, feeds: Feeds, *, warmup: int, iterations: int, repeats: int, threads: int
) -> dict[str, Any]:
    """Latency of ``model`` on ``feeds`` (seconds) and op counts before/after ORT optimization."""
    data = model.SerializeToString()
    t0 = time.perf_counter()
    sess = _session(data, threads)
    init = time.perf_counter() - t0
    t0 = time.perf_counter()
    outputs = sess.run(None, feeds)
    first = time.perf_counter() - t0
    for _ in range(warmup):
        sess.run(None, feeds)
    means = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iterations):
            sess.run(None, feeds)
        means.append((time.perf_counter() - t0) / iterations)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        _session(data, threads, path)
        optimized = op_counts(onnx.load_model(path, load_external_data=False))
    names = [o.name for o in model.graph.output]
    return {
        "latency_s": {
            "session_init": init,
            "first_run": first,
            "warm_median_of_means": statistics.median(means),
            "repeat_means": means,
        },
        "op_counts": {"exported": op_counts(model), "optimized": optimized},
        "outputs": dict(zip(names, (np.asarray(o) for o in outputs), strict=True)),
    }


def _signature(feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    def desc(values: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        return [{"name": n, "dtype": v.dtype.name, "shape": list(v.shape)} for n, v in values.items()]

    return {"inputs": desc(feeds), "outputs": desc(outputs)}


def bench(
    model: ModelLike,
    transforms: Sequence[str] = TRANSFORMS,
    *,
    in_axes: Any = 0,
    inputs: Sequence[str] | None = None,
    batch: int = 8,
    dims: Mapping[str, int] | None = None,
    warmup: int = 10,
    iterations: int = 100,
    repeats: int = 5,
    threads: int = 1,
    seed: int = 0,
    reference: bool = True,
    max_seconds: float | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Benchmarks ``model`` (the forward) and each of ``transforms`` of it on ONNX Runtime.

    Args:
        transforms: any of ``vmap``, ``grad``, ``jvp``, ``vjp``, ``vmap_grad`` (per-example
            gradients) and ``hvp`` (``jvp(grad(f))``).
        in_axes: vmap's ``in_axes``; inputs: the derivative selection (default: onnax's).
        batch: length of the vmap batch axis; dims: lengths of other symbolic dims (default 3).
        threads: ONNX Runtime intra-op threads (0: ORT's default).
        reference: compare each model with the reference of ``onnax validate`` (exact JAX
            float64 when available, else finite differences); ``False`` skips it.
        max_seconds: bound on each model's finite-difference reference (coordinates computed
            by then are compared).
        progress: called with a line before each model's measurement and reference.

    Returns:
        The JSON-ready report: versions, CPU, settings, per-model dtypes, op counts (exported
        and ORT-optimized), latencies, errors against the reference, and ratios.
    """
    unknown = [t for t in transforms if t not in TRANSFORMS]
    if unknown:
        raise ValidationInputError(f"unknown transforms {unknown}; available: {list(TRANSFORMS)}")
    source = load(model, "benchmarked")
    settings = {
        "warmup": warmup,
        "iterations": iterations,
        "repeats": repeats,
        "intra_op_threads": threads,
        "batch": batch,
        "seed": seed,
        "graph_optimization_level": "ORT_ENABLE_ALL",
        "reference": reference,
    }
    report: dict[str, Any] = {
        "model": os.fspath(model) if isinstance(model, str | os.PathLike) else type(model).__name__,
        "versions": versions(),
        "source_revision": source_revision(),
        "cpu": cpu(),
        "settings": settings,
        "models": {},
        "ratios": {},
    }
    # ORT creates its process-wide environment with the first session; do that outside the
    # measurements so the first model's session initialization is not inflated by it.
    say = progress or (lambda _msg: None)
    log: list[str] = []
    _session(source.SerializeToString(), threads, log=log)
    builders: dict[str, Callable[[], onnx.ModelProto]] = {"forward": lambda: source}
    makers = _transformed(source, in_axes, inputs)
    builders.update({t: makers[t] for t in transforms})
    for name, build in builders.items():
        entry: dict[str, Any] = {}
        report["models"][name] = entry
        try:
            say(f"{name}: transforming")
            gen = build()
        except Exception as err:
            entry["error"] = f"{type(err).__name__}: {err}"
            continue
        chain = parse_chain(gen)
        entry["transform"] = " then ".join(s.transform for s in chain) or "none"
        sizes = dict(dims or {})
        for step in chain:
            if step.transform == "vmap":
                sizes.setdefault(step.axis_name, batch)
        feeds = make_feeds(gen, {}, seed, sizes, index_ranges(source, sizes))
        try:
            say(f"{name}: measuring ({warmup} + {repeats} x {iterations} runs)")
            with runtime_log(log):
                m = measure(
                    gen, feeds, warmup=warmup, iterations=iterations, repeats=repeats, threads=threads
                )
        except Exception as err:
            entry["error"] = f"ONNX Runtime: {type(err).__name__}: {' '.join(str(err).split())[:400]}"
            continue
        entry.update(_signature(feeds, m["outputs"]))
        entry["op_counts"] = m["op_counts"]
        entry["latency_s"] = m["latency_s"]
        if not reference:
            continue
        say(f"{name}: reference")
        ref = build_reference(
            source, gen, chain, max_coords=16, seed=seed, backend=None, budget=Budget(max_seconds)
        )

        def said(msg: str, n: str = name) -> None:
            say(f"{n}: {msg}")

        try:
            result = evaluate(ref, feeds, m["outputs"], progress=said)
        except Exception as err:
            entry["reference"] = f"not computed: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
            continue
        log.extend(ref.forward.log + ref.source.log)
        comparisons = result.comparisons
        entry["reference"] = result.description
        if result.notes or result.incomplete:
            entry["reference_notes"] = result.notes + ([result.incomplete] if result.incomplete else [])
        entry["errors"] = [
            {
                "output": c.name,
                "max_abs_error": c.max_abs_error,
                "max_rel_error": c.max_rel_error,
                "index": c.index,
                "method": c.method,
                "within_tolerance": c.ok,
            }
            for c in comparisons
        ]
        if any(s.transform == "vmap" for s in chain):
            entry["batch"] = batch
    report["ratios"] = _ratios(report["models"], batch)
    report["runtime_log"] = log
    return report


def _ratios(models: Mapping[str, Any], batch: int) -> dict[str, float]:
    def warm(name: str) -> float | None:
        lat = models.get(name, {}).get("latency_s")
        return None if lat is None else float(lat["warm_median_of_means"])

    out: dict[str, float] = {}
    pairs = {
        "grad/forward": ("grad", "forward", 1),
        "jvp/forward": ("jvp", "forward", 1),
        "vjp/forward": ("vjp", "forward", 1),
        "vmap per example/forward": ("vmap", "forward", batch),
        "vmap_grad per example/grad": ("vmap_grad", "grad", batch),
        "hvp/grad": ("hvp", "grad", 1),
    }
    for label, (num, den, per) in pairs.items():
        a, b = warm(num), warm(den)
        if a is not None and b is not None and b > 0:
            out[label] = a / per / b
    return out


def format_bench(report: Mapping[str, Any]) -> str:
    """The report as a table: one row per model, ratios side by side."""
    s = report["settings"]
    lines = [
        f"onnax bench {report['model']}  (ORT {report['versions'].get('onnxruntime')}, "
        f"{s['intra_op_threads']} intra-op thread(s), warm-up {s['warmup']}, "
        f"{s['repeats']} x {s['iterations']} runs; CPU {report['cpu']['model']})",
        f"  {'model':<20} {'init ms':>9} {'first ms':>9} {'warm ms':>10} {'ops':>5} {'opt ops':>7}"
        "  max error",
    ]
    for name, e in report["models"].items():
        if "latency_s" not in e:
            lines.append(f"  {name:<20} not measured: {e.get('error', 'unknown error')}")
            continue
        lat = e["latency_s"]
        ops = sum(e["op_counts"]["exported"].values())
        opt = sum(e["op_counts"]["optimized"].values())
        err = max((x["max_abs_error"] for x in e.get("errors", [])), default=0.0)
        bad = "" if all(x["within_tolerance"] for x in e.get("errors", [])) else " (OUT OF TOLERANCE)"
        shown = f"{err:.2e}{bad}" if "errors" in e else "not compared"
        label = f"{name} (batch {e['batch']})" if "batch" in e else name
        lines.append(
            f"  {label:<20} {lat['session_init'] * 1e3:9.2f} {lat['first_run'] * 1e3:9.3f} "
            f"{lat['warm_median_of_means'] * 1e3:10.4f} {ops:5d} {opt:7d}  {shown}"
        )
    if report["ratios"]:
        lines.append("  ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in report["ratios"].items()))
    if report.get("runtime_log"):
        lines.append(f"  runtime log: {len(report['runtime_log'])} lines captured (in the JSON report)")
    return "\n".join(lines)
