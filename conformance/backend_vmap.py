"""vmap conformance over the ONNX backend node tests.

For every applicable node-test model (``onnx/backend/test/data/node/<test>/model.onnx`` with
``test_data_set_0``) this runs ``onnax.vmap`` with several ``in_axes`` variants, feeds a batch of
B perturbed copies of the test inputs to the vmapped model and compares the result with B
per-example runs of the original model:

* ``all``   -- ``in_axes=0`` (every graph input batched)
* ``first`` -- ``in_axes=[0, None, ...]`` (first input batched, the rest shared); >= 2 inputs
* ``last``  -- ``in_axes={name: None, ..., last: 0}`` (dict form; last input batched); >= 2 inputs

Each case is classified as

* ``passed``      -- the vmapped model matches the per-example loop,
* ``failed``      -- wrong numbers/shapes, the vmapped model does not load or run, a crash of the
  worker process, a timeout, or an exception other than ``onnax.OnnaxError``,
* ``unsupported`` -- ``onnax.vmap`` raised ``onnax.OnnaxError``,

and models that cannot be used at all (sequence/optional/map inputs or outputs, random or
otherwise non-deterministic operators, no graph inputs, a source model that neither ONNX Runtime
nor the ONNX reference evaluator can run) are recorded once as ``skipped`` with a reason.

Runtimes: ONNX Runtime (CPU) for models at opset <= 26, ``onnx.reference.ReferenceEvaluator`` for
opset 27-28 or when ONNX Runtime cannot run the original model; the vmapped model always runs in
the same runtime as its original.

The onnx wheel does not ship the node-test data, so it is generated once from the test-case
generators in ``onnx.backend.test.case.node`` into ``conformance/.node_data/onnx-<version>/``
(same layout as upstream).  Cases run in a pool of worker processes; a case that hangs or crashes
its worker is recorded as failed and the worker is replaced, so nothing can stall the run.

Usage::

    python -m conformance.backend_vmap                 # full run, writes the reports
    python -m conformance.backend_vmap -k 'gemm|conv'  # only matching test names
    python -m conformance.backend_vmap --help
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import sys
import tempfile
import time
import traceback
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
DEFAULT_MD = HERE / "vmap_backend_results.md"
DEFAULT_JSON = HERE / "vmap_backend_results.json"
DEFAULT_CACHE = HERE / ".node_data"

BATCH = 3
SEED = 0
ORT_MAX_OPSET = 26
DEFAULT_TIMEOUT = 30.0

STATUSES = ("passed", "failed", "unsupported", "skipped")

# Operators whose outputs are random (a vmapped model cannot reproduce per-example draws).
RANDOM_OPS = frozenset(
    {
        "Bernoulli",
        "Multinomial",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
    }
)

# Per-dtype comparison tolerances (rtol, atol); anything not listed is compared exactly.
_TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
    "float32": (1e-3, 1e-5),
    "float64": (1e-6, 1e-9),
    "complex64": (1e-3, 1e-5),
    "complex128": (1e-6, 1e-9),
}


# --------------------------------------------------------------------------------------------
# Node-test data
# --------------------------------------------------------------------------------------------


def upstream_node_dir() -> Path:
    return Path(onnx.__file__).resolve().parent / "backend" / "test" / "data" / "node"


def _write_value(path: Path, value: Any, value_info: onnx.ValueInfoProto) -> None:
    kind = value_info.type.WhichOneof("value")
    if isinstance(value, onnx.TensorProto):
        proto: Any = value
    elif kind == "sequence_type":
        proto = numpy_helper.from_list(value, value_info.name)
    elif kind == "optional_type":
        proto = numpy_helper.from_optional(value, value_info.name)
    elif kind == "map_type":
        proto = numpy_helper.from_dict(value, value_info.name)
    else:
        proto = numpy_helper.from_array(np.asarray(value), value_info.name)
    path.write_bytes(proto.SerializeToString())


def generate_node_data(dest: Path) -> int:
    """Write every node test case of the installed onnx package below ``dest``."""
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np_err = np.seterr(all="ignore")
        try:
            cases = node_cases.collect_testcases(None)
        finally:
            np.seterr(**np_err)
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    for case in cases:
        if case.kind != "node" or case.model is None:
            continue
        case_dir = dest / case.name
        case_dir.mkdir(parents=True, exist_ok=True)
        (case_dir / "model.onnx").write_bytes(case.model.SerializeToString())
        graph = case.model.graph
        for k, (inputs, outputs) in enumerate(case.data_sets or []):
            ds = case_dir / f"test_data_set_{k}"
            ds.mkdir(exist_ok=True)
            for j, value in enumerate(inputs):
                _write_value(ds / f"input_{j}.pb", value, graph.input[j])
            for j, value in enumerate(outputs):
                _write_value(ds / f"output_{j}.pb", value, graph.output[j])
        count += 1
    return count


def ensure_node_data(data_dir: Path | None = None, verbose: bool = True) -> Path:
    """Directory with ``<test>/model.onnx`` node tests: given, shipped by onnx, or generated."""
    if data_dir is not None:
        data_dir = Path(data_dir)
        if not any(data_dir.glob("*/model.onnx")):
            raise FileNotFoundError(f"no */model.onnx below {data_dir}")
        return data_dir
    upstream = upstream_node_dir()
    if upstream.is_dir() and any(upstream.glob("*/model.onnx")):
        return upstream
    cache = DEFAULT_CACHE / f"onnx-{onnx.__version__}"
    marker = cache / ".complete"
    if marker.exists():
        return cache
    if verbose:
        print(
            f"onnx {onnx.__version__} ships no node-test data; generating it into {cache} ...",
            file=sys.stderr,
            flush=True,
        )
    tmp = Path(tempfile.mkdtemp(prefix="gen-", dir=_mkdir(DEFAULT_CACHE)))
    n = generate_node_data(tmp)
    if cache.exists():
        import shutil

        shutil.rmtree(cache)
    tmp.rename(cache)
    marker.write_text(f"{n} node tests generated from onnx {onnx.__version__}\n")
    if verbose:
        print(f"generated {n} node tests", file=sys.stderr, flush=True)
    return cache


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


# --------------------------------------------------------------------------------------------
# Case planning (parent process)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ModelInfo:
    name: str
    path: str
    op: str
    opset: int | None
    input_names: list[str]
    skip_reason: str | None = None


def _opset(model: onnx.ModelProto) -> int | None:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return None


def _op_label(node: onnx.NodeProto) -> str:
    return f"{node.domain}:{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def _single_op(model: onnx.ModelProto) -> str | None:
    nodes = [n for n in model.graph.node if n.op_type != "Constant"] or list(model.graph.node)
    return _op_label(nodes[0]) if len(nodes) == 1 else None


def _main_op(model: onnx.ModelProto, name: str, single_ops: dict[str, str]) -> str:
    single = _single_op(model)
    if single is not None:
        return single
    if "_expanded" in name:
        base = name.split("_expanded")[0]
        if base in single_ops:
            return f"{single_ops[base]} (expanded)"
    producers = {o: n for n in model.graph.node for o in n.output}
    if model.graph.output and model.graph.output[0].name in producers:
        return _op_label(producers[model.graph.output[0].name])
    return model.graph.node[0].op_type if model.graph.node else "<empty>"


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_nodes(g)


def _static_skip_reason(model: onnx.ModelProto, case_dir: Path) -> str | None:
    graph = model.graph
    for vi in list(graph.input) + list(graph.output):
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            return f"non-tensor graph input/output ({kind} '{vi.name}')"
    for node in _all_nodes(graph):
        if node.op_type in RANDOM_OPS:
            return f"random operator {node.op_type}"
        if node.op_type == "Dropout" and len(node.input) >= 3 and node.input[2]:
            return "Dropout in training mode (random)"
    if len(graph.input) == 0:
        return "no graph inputs to batch"
    ds = case_dir / "test_data_set_0"
    if not ds.is_dir():
        return "no test_data_set_0"
    n_files = len(list(ds.glob("input_*.pb")))
    if n_files != len(graph.input):
        return f"{n_files} input files for {len(graph.input)} graph inputs"
    return None


def discover_models(data_dir: Path, pattern: str | None = None) -> list[ModelInfo]:
    dirs = sorted(p.parent for p in Path(data_dir).glob("*/model.onnx"))
    rx = re.compile(pattern) if pattern else None
    loaded: list[tuple[Path, onnx.ModelProto]] = []
    single_ops: dict[str, str] = {}
    for d in dirs:
        model = onnx.load(str(d / "model.onnx"), load_external_data=False)
        loaded.append((d, model))
        op = _single_op(model)
        if op is not None:
            single_ops[d.name] = op
    infos = []
    for d, model in loaded:
        if rx is not None and not rx.search(d.name):
            continue
        infos.append(
            ModelInfo(
                name=d.name,
                path=str(d),
                op=_main_op(model, d.name, single_ops),
                opset=_opset(model),
                input_names=[i.name for i in model.graph.input],
                skip_reason=_static_skip_reason(model, d),
            )
        )
    return infos


def variants_for(input_names: list[str]) -> list[tuple[str, Any]]:
    """The in_axes variants exercised for a model with these graph inputs."""
    n = len(input_names)
    out: list[tuple[str, Any]] = [("all", 0)]
    if n >= 2:
        out.append(("first", [0] + [None] * (n - 1)))
        out.append(("last", {name: (0 if i == n - 1 else None) for i, name in enumerate(input_names)}))
    return out


def batched_flags(in_axes: Any, input_names: list[str]) -> list[bool]:
    if isinstance(in_axes, int):
        return [True] * len(input_names)
    if isinstance(in_axes, dict):
        return [in_axes.get(name) is not None for name in input_names]
    return [a is not None for a in in_axes]


def select_subset(infos: list[ModelInfo], keep_every: int, always_ops: set[str]) -> list[ModelInfo]:
    """Deterministic representative subset: every model of ``always_ops`` (incl. their
    expanded forms) plus every ``keep_every``-th other model in name order."""
    out = []
    others = 0
    for info in infos:
        base_op = info.op.removesuffix(" (expanded)")
        if base_op in always_ops:
            out.append(info)
            continue
        if others % keep_every == 0:
            out.append(info)
        others += 1
    return out


# --------------------------------------------------------------------------------------------
# Worker process
# --------------------------------------------------------------------------------------------


class _SourceError(Exception):
    """The original model cannot be run (or is non-deterministic): skip the model."""


def _first_line(exc: BaseException | str) -> str:
    text = exc if isinstance(exc, str) else (str(exc) or type(exc).__name__)
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:400]
    return text.strip()[:400]


def _load_tensor(path: Path) -> np.ndarray:
    proto = onnx.TensorProto()
    proto.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(proto)


def _is_plain_float(a: np.ndarray) -> bool:
    return a.dtype in (np.float16, np.float32, np.float64)


_SPEC_LOOP: type | None = None


def _spec_loop() -> type:
    """A ReferenceEvaluator ``Loop`` implementation following the ONNX spec.

    onnx 1.23's reference ``Loop`` deviates from the spec (and from ONNX Runtime) in two ways
    that matter for vmapped models, which express per-example fallbacks as
    ``Loop(M=batch, cond="")`` with a scan output: an omitted ``cond`` is taken as false (zero
    iterations instead of M), and scan outputs are joined with ``np.vstack`` (concatenated along
    axis 0 instead of stacked along a new leading axis).  This override is used for every model
    run on the reference evaluator, original and vmapped alike.
    """
    global _SPEC_LOOP
    if _SPEC_LOOP is not None:
        return _SPEC_LOOP
    from onnx.reference.ops.op_loop import Loop as _RefLoop

    class Loop(_RefLoop):
        op_domain = ""

        def _run(self, M, cond, *initial, context=None, body=None, attributes=None, bindings=None):
            graph = self.body
            names_in = list(graph.input_names)
            names_out = list(graph.output_names)
            n_carried = len(names_in) - 2
            n_scan = len(names_out) - 1 - n_carried
            carried = list(initial[:n_carried])
            running = True if cond is None else bool(np.asarray(cond))
            limit = None if M is None else int(np.asarray(M))
            it_dtype = np.int64 if M is None else np.asarray(M).dtype
            scans: list[list[np.ndarray]] = [[] for _ in range(n_scan)]
            feeds = dict(context or {})
            it = 0
            while running and (limit is None or it < limit):
                feeds[names_in[0]] = np.array(it, dtype=it_dtype)
                feeds[names_in[1]] = np.array(running)
                feeds.update(zip(names_in[2:], carried, strict=True))
                outs = self._run_body(feeds, attributes=attributes, bindings=bindings)
                running = bool(np.asarray(outs[0]))
                carried = list(outs[1 : 1 + n_carried])
                for k in range(n_scan):
                    scans[k].append(np.asarray(outs[1 + n_carried + k]))
                it += 1
            results = carried + [
                np.stack(vals, axis=0) if vals else np.empty((0,), dtype=np.float32) for vals in scans
            ]
            return self._check_and_fix_outputs(tuple(results))

    _SPEC_LOOP = Loop
    return Loop


class _Runner:
    """Runs a model with one runtime: 'ort' or 'ref' (the reference evaluator, see _spec_loop)."""

    def __init__(self, model: onnx.ModelProto, kind: str):
        self.kind = kind
        self.output_names = [o.name for o in model.graph.output]
        if kind == "ort":
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.log_severity_level = 3
            so.intra_op_num_threads = 1
            so.inter_op_num_threads = 1
            self._sess = ort.InferenceSession(
                model.SerializeToString(), so, providers=["CPUExecutionProvider"]
            )
        else:
            from onnx.reference import ReferenceEvaluator

            self._ref = ReferenceEvaluator(model, new_ops=[_spec_loop()])

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.kind == "ort":
            outs = self._sess.run(self.output_names, feeds)
        else:
            outs = self._ref.run(self.output_names, feeds)
        return [np.asarray(o) for o in outs]


def _arrays_equal_exact(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    if a.dtype.kind in "biuUSO?":
        return bool(np.array_equal(a, b))
    return bool(np.array_equal(_as_comparable(a), _as_comparable(b), equal_nan=True))


def _as_comparable(a: np.ndarray) -> np.ndarray:
    """ml_dtypes (bfloat16, float8, int4, ...) -> float32 / int64 for numpy comparisons."""
    if a.dtype.kind != "V":
        return a
    try:
        return a.astype(np.float32)
    except (TypeError, ValueError):
        return a.astype(np.int64)


def _compare(expected: np.ndarray, actual: np.ndarray, name: str) -> str | None:
    """None if equal within tolerance, else a one-line description of the mismatch."""
    if expected.shape != actual.shape:
        return f"output '{name}': shape expected {expected.shape}, got {actual.shape}"
    if expected.dtype != actual.dtype and not (expected.dtype.kind in "USO" and actual.dtype.kind in "USO"):
        return f"output '{name}': dtype expected {expected.dtype}, got {actual.dtype}"
    if expected.size == 0:
        return None
    rtol, atol = _TOLERANCES.get(expected.dtype.name, (0.0, 0.0))
    if expected.dtype.kind in "USO":
        ok = np.asarray(expected == actual)
        if ok.all():
            return None
        bad = int((~ok).sum())
        return f"output '{name}': {bad}/{expected.size} string elements differ"
    e = _as_comparable(expected)
    a = _as_comparable(actual)
    if e.dtype.kind in "biu?":
        diff = e != a
        if not diff.any():
            return None
        idx = tuple(int(i) for i in np.argwhere(diff)[0])
        return (
            f"output '{name}': {int(diff.sum())}/{e.size} elements differ; first at {idx}: "
            f"expected {e[idx]!r}, got {a[idx]!r}"
        )
    close = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    idx = tuple(int(i) for i in np.argwhere(~close)[0])
    with np.errstate(all="ignore"):
        err = np.abs(a.astype(np.complex128 if e.dtype.kind == "c" else np.float64) - e)
        finite = np.isfinite(err)
        max_err = float(err[finite].max()) if finite.any() else float("nan")
    return (
        f"output '{name}': {int((~close).sum())}/{e.size} elements differ (max abs err "
        f"{max_err:.3g}, rtol={rtol}, atol={atol}); first at {idx}: expected {e[idx]!r}, "
        f"got {a[idx]!r}"
    )


class _Worker:
    def __init__(self, conn, batch: int, seed: int, check_model: bool):
        self.conn = conn
        self.batch = batch
        self.seed = seed
        self.check_model = check_model
        import onnax

        self.onnax = onnax

    def send(self, *msg: Any) -> None:
        self.conn.send(msg)

    def stage(self, variant: str, stage: str) -> None:
        self.send("stage", variant, stage)

    def record(
        self,
        info: dict,
        variant: str,
        in_axes: Any,
        status: str,
        message: str = "",
        seconds: float | None = None,
        note: str = "",
    ) -> None:
        self.send(
            "case",
            {
                "model": info["name"],
                "op": info["op"],
                "variant": variant,
                "in_axes": _fmt_axes(in_axes),
                "status": status,
                "message": message,
                "note": note,
                "vmap_seconds": seconds,
            },
        )

    # -- source model --------------------------------------------------------------------

    def _source_runner(
        self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], opset: int | None
    ) -> tuple[_Runner, list[np.ndarray]]:
        errors = []
        kinds = ["ort", "ref"] if (opset is None or opset <= ORT_MAX_OPSET) else ["ref"]
        for kind in kinds:
            try:
                runner = _Runner(model, kind)
                outs = runner.run(feeds)
                return runner, outs
            except Exception as exc:
                errors.append(f"{kind}: {_first_line(exc)}")
        raise _SourceError("runtime cannot run source: " + " | ".join(errors))

    # Noise levels tried in order: perturb every batched float input; only "large" ones (more
    # than 8 elements: small 1-D float inputs are often parameters such as Resize scales, where
    # noise changes output shapes or is rejected by the runtime); none (identical copies).
    NOISE_MODES = ("all", "large", "none")

    def _examples(
        self, name: str, variant: str, inputs: list[np.ndarray], flags: list[bool], noise: str
    ) -> list[list[np.ndarray]]:
        """examples[b][i]: input i of example b (shared inputs are the original data)."""
        rng = np.random.default_rng([self.seed, zlib.crc32(f"{name}/{variant}".encode())])
        examples = []
        for b in range(self.batch):
            row = []
            for x, batched in zip(inputs, flags, strict=True):
                perturb = (
                    batched
                    and b > 0
                    and _is_plain_float(x)
                    and (noise == "all" or (noise == "large" and x.size > 8))
                )
                if perturb and x.size > 0:
                    with np.errstate(all="ignore"):
                        y = x.astype(np.float64) + 1e-2 * rng.standard_normal(x.shape)
                    row.append(np.asarray(y, dtype=x.dtype))
                else:
                    row.append(x)
            examples.append(row)
        return examples

    # -- one model -----------------------------------------------------------------------

    def process(self, task: dict) -> None:
        variants: list[tuple[str, Any]] = task["variants"]
        try:
            self._process(task, variants)
        except _SourceError as exc:
            self.record(task, "-", None, "skipped", _first_line(exc))

    def _process(self, info: dict, variants: list[tuple[str, Any]]) -> None:
        onnax = self.onnax
        case_dir = Path(info["path"])
        self.stage(variants[0][0], "source")
        model = onnx.load(str(case_dir / "model.onnx"))
        names = [i.name for i in model.graph.input]
        out_names = [o.name for o in model.graph.output]
        ds = case_dir / "test_data_set_0"
        inputs = [_load_tensor(ds / f"input_{j}.pb") for j in range(len(names))]
        base_feeds = dict(zip(names, inputs, strict=True))
        runner, outs0 = self._source_runner(model, base_feeds, info["opset"])
        again = runner.run(base_feeds)
        if not all(_arrays_equal_exact(a, b) for a, b in zip(outs0, again, strict=True)):
            raise _SourceError("non-deterministic outputs (two runs of the source model differ)")
        source_checks = True
        if self.check_model:
            try:
                onnx.checker.check_model(model)
            except Exception:
                source_checks = False

        for variant, in_axes in variants:
            self.stage(variant, "source")
            flags = batched_flags(in_axes, names)
            note = ""
            problems = []
            for mode in self.NOISE_MODES:
                examples = self._examples(info["name"], variant, inputs, flags, noise=mode)
                expected, problem = self._per_example(runner, names, examples)
                if expected is not None:
                    break
                problems.append(f"noise={mode}: {problem}")
            if expected is None:
                raise _SourceError("runtime cannot run source: " + " | ".join(problems))
            if problems:
                note = f"noise={mode} (" + "; ".join(problems) + ")"

            self.stage(variant, "vmap")
            src = onnx.ModelProto()
            src.CopyFrom(model)
            t0 = time.perf_counter()
            try:
                vm = onnax.vmap(src, in_axes=in_axes)
            except onnax.OnnaxError as exc:
                self.record(info, variant, in_axes, "unsupported", _first_line(exc), note=note)
                continue
            except Exception as exc:
                self.record(
                    info,
                    variant,
                    in_axes,
                    "failed",
                    f"crash in vmap: {type(exc).__name__}: {_first_line(exc)}",
                    note=note,
                )
                continue
            seconds = time.perf_counter() - t0

            self.stage(variant, "check")
            structure = self._check_structure(vm, names, out_names, source_checks)
            if structure is not None:
                self.record(info, variant, in_axes, "failed", structure, seconds, note)
                continue

            self.stage(variant, "run")
            feeds = {}
            for i, name in enumerate(names):
                if flags[i]:
                    feeds[name] = np.stack([ex[i] for ex in examples], axis=0)
                else:
                    feeds[name] = inputs[i]
            try:
                vrunner = _Runner(vm, runner.kind)
            except Exception as exc:
                self.record(
                    info,
                    variant,
                    in_axes,
                    "failed",
                    f"vmapped model fails to load ({runner.kind}): {_first_line(exc)}",
                    seconds,
                    note,
                )
                continue
            try:
                got = vrunner.run(feeds)
            except Exception as exc:
                self.record(
                    info,
                    variant,
                    in_axes,
                    "failed",
                    f"vmapped model fails to run ({runner.kind}): {_first_line(exc)}",
                    seconds,
                    note,
                )
                continue

            self.stage(variant, "compare")
            mismatch = self._compare_all(expected, got, out_names)
            if mismatch is not None and runner.kind == "ort":
                # Cross-check on the reference evaluator: if original and vmapped model agree
                # there, ONNX Runtime computed the vmapped model wrongly (seen: string scan
                # outputs of Loop).  Recorded as passed with the ORT discrepancy in the note.
                cross = self._cross_check_ref(model, vm, names, examples, feeds, out_names)
                if cross is None:
                    note = (note + "; " if note else "") + (
                        f"ORT mismatch ({mismatch[:160]}) but the ReferenceEvaluator run of the "
                        "same vmapped model matches: ORT bug suspected"
                    )
                    mismatch = None
            if mismatch is None:
                self.record(info, variant, in_axes, "passed", "", seconds, note)
            else:
                self.record(info, variant, in_axes, "failed", f"mismatch: {mismatch}", seconds, note)

    def _compare_all(
        self, expected: list[list[np.ndarray]], got: list[np.ndarray], out_names: list[str]
    ) -> str | None:
        for k, oname in enumerate(out_names):
            want = np.stack([expected[b][k] for b in range(self.batch)], axis=0)
            problem = _compare(want, got[k], oname)
            if problem is not None:
                return problem
        return None

    def _cross_check_ref(self, model, vm, names, examples, feeds, out_names) -> str | None:
        """None if the reference evaluator's per-example and vmapped results agree."""
        try:
            ref = _Runner(model, "ref")
            expected, why = self._per_example(ref, names, examples)
            if expected is None:
                return why
            got = _Runner(vm, "ref").run(feeds)
        except Exception as exc:
            return _first_line(exc)
        return self._compare_all(expected, got, out_names)

    def _per_example(
        self, runner: _Runner, names: list[str], examples: list[list[np.ndarray]]
    ) -> tuple[list[list[np.ndarray]] | None, str]:
        """Per-example outputs of the source model, or (None, why) if unusable."""
        try:
            outs = [runner.run(dict(zip(names, ex, strict=True))) for ex in examples]
        except Exception as exc:
            return None, _first_line(exc)[:200]
        for k in range(len(outs[0])):
            shapes = {o[k].shape for o in outs}
            dtypes = {o[k].dtype for o in outs}
            if len(shapes) > 1 or len(dtypes) > 1:
                return (
                    None,
                    f"per-example output {k} shapes/dtypes differ: {sorted(map(str, shapes))}",
                )
        return outs, ""

    def _check_structure(
        self, vm: Any, names: list[str], out_names: list[str], source_checks: bool
    ) -> str | None:
        if not isinstance(vm, onnx.ModelProto):
            return f"vmap returned {type(vm).__name__}, expected onnx.ModelProto"
        got_in = [i.name for i in vm.graph.input]
        init_names = {t.name for t in vm.graph.initializer}
        got_in = [n for n in got_in if n not in init_names]
        if got_in != names:
            return f"graph inputs changed: expected {names}, got {got_in}"
        got_out = [o.name for o in vm.graph.output]
        if got_out != out_names:
            return f"graph outputs changed: expected {out_names}, got {got_out}"
        if self.check_model and source_checks:
            try:
                onnx.checker.check_model(vm)
            except Exception as exc:
                return f"vmapped model fails onnx.checker: {_first_line(exc)}"
        return None


def _fmt_axes(in_axes: Any) -> str:
    return "-" if in_axes is None else repr(in_axes)


def serve(conn, make_worker: Any, log_path: str | None) -> None:
    """A worker process's loop: build the worker, then process tasks until told to stop.
    Shared by every conformance module (each brings its own worker class)."""
    if log_path:
        # Keep runtime/onnax chatter (e.g. version-converter notices) out of the console.
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    try:
        worker = make_worker()
    except BaseException as exc:
        conn.send(("fatal", f"{type(exc).__name__}: {_first_line(exc)}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            worker.process(task)
        except Exception as exc:
            tb = traceback.format_exc(limit=3)
            conn.send(("error", f"{type(exc).__name__}: {_first_line(exc)}", tb))
        conn.send(("done",))


def _worker_main(conn, batch: int, seed: int, check_model: bool, log_path: str | None) -> None:
    serve(conn, lambda: _Worker(conn, batch, seed, check_model), log_path)


# --------------------------------------------------------------------------------------------
# Pool with per-case timeouts (parent process)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Slot:
    proc: Any
    conn: Any
    ready: bool = False
    task: dict | None = None
    remaining: list = dataclasses.field(default_factory=list)
    variant: str = ""
    stage: str = ""
    deadline: float = 0.0


class _Pool:
    STARTUP_S = 180
    # The worker process's entry point (module-level, so the spawn context can pickle it).
    worker_main = staticmethod(_worker_main)

    def __init__(
        self,
        jobs: int,
        timeout: float,
        batch: int,
        seed: int,
        check_model: bool,
        log_dir: str | None,
    ):
        self.ctx = multiprocessing.get_context("spawn")
        self.jobs = jobs
        self.timeout = timeout
        self.args = (batch, seed, check_model)
        self.log_dir = log_dir
        self.slots: list[_Slot] = []
        self._n_started = 0

    def _start(self) -> _Slot:
        parent, child = self.ctx.Pipe()
        log = None
        if self.log_dir:
            log = os.path.join(self.log_dir, f"worker-{self._n_started}.log")
        self._n_started += 1
        proc = self.ctx.Process(target=type(self).worker_main, args=(child, *self.args, log), daemon=True)
        proc.start()
        child.close()
        return _Slot(proc, parent, deadline=time.monotonic() + self.STARTUP_S)

    def _kill(self, slot: _Slot) -> None:
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(5)
        slot.conn.close()

    def run(self, tasks: list[dict], on_case, on_progress=None) -> None:
        pending = collections.deque(tasks)
        self.slots = [self._start() for _ in range(max(1, min(self.jobs, len(tasks))))]
        try:
            while pending or any(s.task is not None for s in self.slots):
                now = time.monotonic()
                for s in self.slots:
                    if s.ready and s.task is None and pending:
                        task = pending.popleft()
                        s.task = task
                        s.remaining = [v for v, _ in task["variants"]]
                        s.variant, s.stage = s.remaining[0], "source"
                        s.deadline = now + self.timeout
                        s.conn.send(task)
                waits = [s.conn for s in self.slots] + [s.proc.sentinel for s in self.slots]
                deadlines = [s.deadline for s in self.slots if s.task is not None or not s.ready]
                timeout = max(0.0, min(deadlines) - now) if deadlines else 1.0
                ready = multiprocessing.connection.wait(waits, timeout=min(timeout, 5.0) + 0.01)
                for i, s in enumerate(list(self.slots)):
                    if s.conn in ready or s.proc.sentinel in ready:
                        self._drain(i, s, pending, on_case, on_progress)
                now = time.monotonic()
                for i, s in enumerate(list(self.slots)):
                    if s.task is not None and now > s.deadline:
                        why = f"timeout after {self.timeout:g}s"
                        self._lost(i, s, pending, on_case, on_progress, why)
                    elif not s.ready and now > s.deadline:
                        raise RuntimeError(f"conformance worker did not start within {self.STARTUP_S}s")
        finally:
            for s in self.slots:
                with contextlib.suppress(OSError, ValueError):
                    s.conn.send(None)
            for s in self.slots:
                s.proc.join(2)
                self._kill(s)

    def _drain(self, i: int, s: _Slot, pending, on_case, on_progress) -> None:
        eof = False
        while True:
            try:
                if not s.conn.poll():
                    break
                msg = s.conn.recv()
            except (EOFError, OSError):
                eof = True
                break
            kind = msg[0]
            if kind == "ready":
                s.ready = True
            elif kind == "fatal":
                raise RuntimeError(f"conformance worker failed to start: {msg[1]}")
            elif kind == "stage":
                if msg[1] != s.variant:
                    s.deadline = time.monotonic() + self.timeout
                s.variant, s.stage = msg[1], msg[2]
            elif kind == "case":
                rec = msg[1]
                if rec["variant"] in s.remaining:
                    s.remaining.remove(rec["variant"])
                elif rec["variant"] == "-":
                    s.remaining = []
                on_case(rec)
            elif kind == "error":
                task = s.task or {}
                for v in s.remaining:
                    on_case(_synthetic(task, v, "failed", f"harness error: {msg[1]}"))
                s.remaining = []
                print(f"[conformance] harness error on {task.get('name')}:\n{msg[2]}", file=sys.stderr)
            elif kind == "done":
                s.task = None
                if on_progress:
                    on_progress()
        if eof or not s.proc.is_alive():
            s.proc.join(1)
            if not s.ready and s.task is None:
                raise RuntimeError(
                    f"conformance worker died during start-up ({_describe_exit(s.proc.exitcode)})"
                )
            why = f"worker died ({_describe_exit(s.proc.exitcode)})"
            self._lost(i, s, pending, on_case, on_progress, why)

    def _lost(self, i: int, s: _Slot, pending, on_case, on_progress, why: str) -> None:
        """The worker hung or died while running s.task: record, requeue the rest, replace it."""
        task = s.task
        self._kill(s)
        self.slots[i] = self._start()
        if task is None:
            return
        if s.stage == "source":
            on_case(_synthetic(task, "-", "skipped", f"runtime cannot run source: {why}"))
        else:
            on_case(_synthetic(task, s.variant, "failed", f"crash/hang in stage '{s.stage}': {why}"))
            rest = [v for v in task["variants"] if v[0] in s.remaining and v[0] != s.variant]
            if rest:
                pending.appendleft({**task, "variants": rest})
                return
        if on_progress:
            on_progress()


def _synthetic(task: dict, variant: str, status: str, message: str) -> dict:
    axes = dict(task.get("variants", [])).get(variant)
    return {
        "model": task.get("name", "?"),
        "op": task.get("op", "?"),
        "variant": variant,
        "in_axes": _fmt_axes(axes),
        "status": status,
        "message": message,
        "note": "",
        "vmap_seconds": None,
    }


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        import signal

        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# --------------------------------------------------------------------------------------------
# Running and reporting
# --------------------------------------------------------------------------------------------


def run_conformance(
    models: list[ModelInfo] | None = None,
    *,
    data_dir: Path | None = None,
    pattern: str | None = None,
    jobs: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    batch: int = BATCH,
    seed: int = SEED,
    check_model: bool = True,
    quiet_workers: bool = True,
    progress: bool = True,
) -> dict:
    """Run the conformance; returns ``{"meta": ..., "cases": [...]}`` (see ``summarize``)."""
    import onnax  # noqa: F401 - fail early, in the parent, if the package is missing

    t0 = time.monotonic()
    if models is None:
        models = discover_models(ensure_node_data(data_dir, verbose=progress), pattern)
    cases: list[dict] = []
    tasks = []
    for info in models:
        if info.skip_reason is not None:
            cases.append(
                {
                    "model": info.name,
                    "op": info.op,
                    "variant": "-",
                    "in_axes": "-",
                    "status": "skipped",
                    "message": info.skip_reason,
                    "note": "",
                    "vmap_seconds": None,
                }
            )
            continue
        tasks.append(
            {
                "name": info.name,
                "path": info.path,
                "op": info.op,
                "opset": info.opset,
                "variants": variants_for(info.input_names),
            }
        )
    jobs = jobs or os.cpu_count() or 1
    done = [0]
    last_print = [0.0]

    def on_progress() -> None:
        done[0] += 1
        now = time.monotonic()
        if progress and (now - last_print[0] > 5 or done[0] == len(tasks)):
            last_print[0] = now
            counts = collections.Counter(c["status"] for c in cases)
            print(
                f"[conformance] {done[0]}/{len(tasks)} models, "
                + ", ".join(f"{k}={counts.get(k, 0)}" for k in STATUSES),
                file=sys.stderr,
                flush=True,
            )

    log_dir = tempfile.mkdtemp(prefix="onnax-conformance-logs-") if quiet_workers else None
    pool = _Pool(jobs, timeout, batch, seed, check_model, log_dir)
    pool.run(tasks, cases.append, on_progress)
    inputs_of = {info.name: info.input_names for info in models}
    opset_of = {info.name: info.opset for info in models}
    for c in cases:
        c["opset"] = opset_of.get(c["model"])
        names = inputs_of.get(c["model"], [])
        axes = dict(variants_for(names)).get(c["variant"]) if names else None
        c["batched_inputs"] = (
            [i for i, b in enumerate(batched_flags(axes, names)) if b] if axes is not None else []
        )
    cases.sort(key=lambda c: (c["model"], c["variant"]))
    return {
        "meta": {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "onnx": onnx.__version__,
            "onnxruntime": _version("onnxruntime"),
            "onnax": _version("onnax"),
            "batch": batch,
            "seed": seed,
            "jobs": jobs,
            "timeout_s": timeout,
            "models": len(models),
            "wall_s": round(time.monotonic() - t0, 1),
            "worker_logs": log_dir,
        },
        "cases": cases,
    }


def _version(mod: str) -> str:
    try:
        m = __import__(mod)
        return str(getattr(m, "__version__", "?"))
    except Exception:
        return "not importable"


def summarize(result: dict) -> dict:
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    totals: collections.Counter = collections.Counter()
    for c in result["cases"]:
        per_op[c["op"]][c["status"]] += 1
        totals[c["status"]] += 1
    return {
        "totals": {k: totals.get(k, 0) for k in STATUSES},
        "per_op": {op: {k: cnt.get(k, 0) for k in STATUSES} for op, cnt in sorted(per_op.items())},
    }


def format_table(summary: dict) -> str:
    rows: list[tuple[str, ...]] = [("operator", "passed", "failed", "unsupported", "skipped")]
    for op, cnt in summary["per_op"].items():
        rows.append((op, *(str(cnt[k]) for k in STATUSES)))
    t = summary["totals"]
    rows.append(("TOTAL", *(str(t[k]) for k in STATUSES)))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def format_markdown(result: dict, summary: dict) -> str:
    meta = result["meta"]
    t = summary["totals"]
    out = [
        "# onnax.vmap conformance over the ONNX backend node tests",
        "",
        (
            "Generated by `python -m conformance.backend_vmap` "
            f"({meta['date']}; onnx {meta['onnx']}, onnxruntime {meta['onnxruntime']}, "
            f"onnax {meta['onnax']}; batch size {meta['batch']}, seed {meta['seed']}, "
            f"{meta['models']} models, {meta['wall_s']} s on {meta['jobs']} workers)."
        ),
        "",
        (
            "Cases per model: `all` (`in_axes=0`); with two or more inputs also `first` "
            "(`[0, None, ...]`) and `last` (`{name: None, ..., last: 0}`). Counts are "
            "cases; skipped counts models."
        ),
        "",
        (
            f"**Totals:** passed {t['passed']}, failed {t['failed']}, unsupported "
            f"{t['unsupported']}, skipped {t['skipped']}."
        ),
        "",
        "| operator | passed | failed | unsupported | skipped |",
        "|---|---:|---:|---:|---:|",
    ]
    for op, cnt in summary["per_op"].items():
        out.append(f"| {_md_escape(op)} | " + " | ".join(str(cnt[k]) for k in STATUSES) + " |")
    out.append("| **TOTAL** | " + " | ".join(f"**{t[k]}**" for k in STATUSES) + " |")

    failed = [c for c in result["cases"] if c["status"] == "failed"]
    out += ["", f"## Failed cases ({len(failed)})", ""]
    if failed:
        out += ["| model | variant | in_axes | message |", "|---|---|---|---|"]
        for c in failed:
            out.append(
                f"| {c['model']} | {c['variant']} | `{_md_escape(c['in_axes'])}` | "
                f"{_md_escape(c['message'])} |"
            )
    else:
        out.append("None.")

    ort_bugs = [c for c in result["cases"] if "ORT bug suspected" in c.get("note", "")]
    out += ["", f"## Passed only on the reference evaluator ({len(ort_bugs)})", ""]
    if ort_bugs:
        out += [
            "ONNX Runtime computed these vmapped models wrongly while the ReferenceEvaluator "
            "run of the same vmapped model matches the per-example loop (counted as passed).",
            "",
            "| model | variant | note |",
            "|---|---|---|",
        ]
        out += [f"| {c['model']} | {c['variant']} | {_md_escape(c['note'])} |" for c in ort_bugs]
    else:
        out.append("None.")

    unsup = collections.Counter(
        (c["op"], _message_category(c["message"])) for c in result["cases"] if c["status"] == "unsupported"
    )
    out += [
        "",
        f"## Unsupported (OnnaxError) messages ({sum(unsup.values())} cases)",
        "",
        "Grouped by operator and message, with node/value names, shapes and opset numbers "
        "elided (the JSON report has every message verbatim).",
        "",
    ]
    if unsup:
        out += ["| operator | cases | message |", "|---|---:|---|"]
        for (op, msg), n in sorted(unsup.items()):
            out.append(f"| {_md_escape(op)} | {n} | {_md_escape(msg)} |")
    else:
        out.append("None.")

    skipped = collections.Counter(
        _skip_category(c["message"]) for c in result["cases"] if c["status"] == "skipped"
    )
    out += ["", "## Skipped models by reason", "", "| reason | models |", "|---|---:|"]
    for reason, n in skipped.most_common():
        out.append(f"| {_md_escape(reason)} | {n} |")
    out.append("")
    return "\n".join(out)


def _message_category(message: str) -> str:
    """A message with the case-specific details elided, for grouping."""
    m = re.sub(r" \(per-example shape \[[^\]]*\][^)]*\)", "", message)
    m = re.sub(r" at (output|node) '[^']*'", "", m)
    m = re.sub(r"'[^']*'", "'…'", m)
    m = re.sub(r"\(opset \d+\)", "(opset N)", m)
    m = re.sub(r"opset is \d+", "opset is N", m)
    return m


def _skip_category(message: str) -> str:
    m = re.match(r"(non-tensor graph input/output \(\w+)", message)
    if m:
        return m.group(1) + ")"
    if message.startswith("runtime cannot run source"):
        return "runtime cannot run source"
    return message


def write_reports(
    result: dict,
    md_path: Path | None = DEFAULT_MD,
    json_path: Path | None = DEFAULT_JSON,
    *,
    summarize: Any = summarize,
    format_markdown: Any = format_markdown,
) -> dict:
    """Writes the markdown and JSON reports; other conformance modules pass their own
    summary and markdown formatters."""
    summary = summarize(result)
    if md_path is not None:
        Path(md_path).write_text(format_markdown(result, summary))
    if json_path is not None:
        payload = {"meta": result["meta"], **summary, "cases": result["cases"]}
        Path(json_path).write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m conformance.backend_vmap",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="node-test directory (default: shipped by onnx, else generated)",
    )
    p.add_argument("-k", "--filter", default=None, help="regex on test names")
    p.add_argument("-j", "--jobs", type=int, default=None, help="worker processes (default: cores)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per case")
    p.add_argument("--batch", type=int, default=BATCH, help="batch size B")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--no-checker", action="store_true", help="do not run onnx.checker on the vmapped models")
    p.add_argument(
        "--show-worker-stderr",
        action="store_true",
        help="let workers write to this terminal's stderr",
    )
    p.add_argument("--md", type=Path, default=DEFAULT_MD, help="markdown report path")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="JSON report path")
    p.add_argument("--no-write", action="store_true", help="only print, write no reports")
    p.add_argument("--generate-only", action="store_true", help="only prepare the node-test data")
    args = p.parse_args(argv)

    if args.generate_only:
        print(ensure_node_data(args.data_dir))
        return 0
    result = run_conformance(
        data_dir=args.data_dir,
        pattern=args.filter,
        jobs=args.jobs,
        timeout=args.timeout,
        batch=args.batch,
        seed=args.seed,
        check_model=not args.no_checker,
        quiet_workers=not args.show_worker_stderr,
    )
    summary = summarize(result) if args.no_write else write_reports(result, args.md, args.json)
    print(format_table(summary))
    failed = [c for c in result["cases"] if c["status"] == "failed"]
    if failed:
        print(f"\n{len(failed)} failed cases:")
        for c in failed:
            print(f"  {c['model']} [{c['variant']}] in_axes={c['in_axes']}: {c['message']}")
    if not args.no_write:
        print(f"\nwrote {args.md} and {args.json}")
    print(f"wall time {result['meta']['wall_s']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
