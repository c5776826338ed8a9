"""``onnax.testing.validate``: the four-step validation of a model onnax generated."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from onnax import _core
from onnax.testing._chain import describe_chain, parse_chain
from onnax.testing._compare import OutputComparison
from onnax.testing._env import versions
from onnax.testing._evaluate import Progress, evaluate, start_exact
from onnax.testing._inputs import Feeds, index_ranges, load_inputs, make_feeds, np_dtype, random_tensor
from onnax.testing._models import ModelLike, ValidationInputError, load, op_counts, opsets, runtime_inputs
from onnax.testing._reference import Budget, Reference, build_reference
from onnax.testing._runtime import Session, choose_backend, runtime_log

STEPS = ("checker", "strict shape inference", "runtime", "numerical parity")


@dataclass
class StepResult:
    name: str
    status: str  # "pass", "FAIL" or "skip"
    detail: str = ""


@dataclass
class ValidationReport:
    """Everything ``onnax validate`` prints; ``ok`` is True when all four steps pass."""

    source: str
    generated: str
    transform: str
    versions: dict[str, str]
    opsets: dict[str, dict[str, int]]
    op_counts: dict[str, dict[str, int]]
    backend: str = ""
    reference: str = ""
    inputs: str = ""
    steps: list[StepResult] = field(default_factory=list)
    outputs: list[OutputComparison] = field(default_factory=list)
    web_outputs: list[OutputComparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the reader should know (fallbacks, skips)
    runtime_log: list[str] = field(default_factory=list)  # the runtimes' own log lines, captured
    source_problem: str = ""  # set when the SOURCE model does not run on the inputs
    timed_out: str = ""  # set when max_seconds stopped it before a step completed: what was not run

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.status == "pass" for s in self.steps)

    @property
    def failed_step(self) -> str | None:
        return next((s.name for s in self.steps if s.status == "FAIL"), None)

    @property
    def message(self) -> str:
        """One line: the verdict, and the first failure's diagnostic."""
        if self.ok:
            return f"all {len(self.steps)} steps passed ({self.transform})"
        step = next((s for s in self.steps if s.status == "FAIL"), None)
        if step is None:
            return f"incomplete: {self.timed_out or 'a step did not run'}"
        return f"step '{step.name}' failed: {step.detail}"

    def verdict(self) -> str:
        if self.ok:
            return "PASSED"
        if self.failed_step is None:
            return f"INCOMPLETE ({self.timed_out or 'a step did not run'})"
        return f"FAILED at step {self.failed_step!r}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["failed_step"] = self.failed_step
        return d

    def format(self) -> str:
        ops = {k: sum(v.values()) for k, v in self.op_counts.items()}
        lines = [
            f"onnax validate: {self.verdict()}",
            f"  source     {self.source} ({ops['source']} nodes: {_ops(self.op_counts['source'])}; "
            f"opsets {_opsets(self.opsets['source'])})",
            f"  generated  {self.generated} ({ops['generated']} nodes: {_ops(self.op_counts['generated'])}; "
            f"opsets {_opsets(self.opsets['generated'])})",
            f"  transform  {self.transform}",
            "  versions   " + ", ".join(f"{k} {v}" for k, v in self.versions.items()),
        ]
        if self.backend:
            lines.append(f"  runtime    {self.backend}")
        if self.reference:
            lines.append(f"  reference  {self.reference}")
        if self.inputs:
            lines.append(f"  inputs     {self.inputs}")
        lines.extend(f"  note       {n}" for n in self.notes)
        if self.runtime_log:
            lines.append(f"  runtime log ({len(self.runtime_log)} lines, captured)")
            lines.extend(f"    {line[:300]}" for line in self.runtime_log[:20])
        for i, s in enumerate(self.steps, 1):
            lines.append(f"  [{s.status}] {i}. {s.name}" + (f": {s.detail}" if s.detail else ""))
        if self.outputs:
            lines.append("  outputs")
            lines.extend(f"    {c.line()}" for c in self.outputs)
        if self.web_outputs:
            lines.append("  outputs on onnxruntime-web (wasm)")
            lines.extend(f"    {c.line()}" for c in self.web_outputs)
        return "\n".join(lines)


def _ops(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _opsets(o: Mapping[str, int]) -> str:
    return ", ".join(f"{k}:{v}" for k, v in o.items())


def _name(model: ModelLike) -> str:
    return os.fspath(model) if isinstance(model, str | os.PathLike) else f"<{type(model).__name__}>"


def _describe_feeds(feeds: Feeds, given: Mapping[str, np.ndarray], seed: int) -> str:
    parts = [f"{n} {v.dtype}{list(v.shape)}" + (" (given)" if n in given else "") for n, v in feeds.items()]
    return f"seed {seed}: " + ", ".join(parts)


def validate(
    source: ModelLike,
    generated: ModelLike,
    *,
    inputs: Mapping[str, np.ndarray] | str | os.PathLike[str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    backend: str | None = None,
    max_coords: int | None = 64,
    steps: tuple[str, ...] = STEPS,
    web: bool = False,
    max_seconds: float | None = None,
    progress: Progress | None = None,
    exact: bool = True,
) -> ValidationReport:
    """Validates ``generated`` (a model onnax wrote from ``source``) in four steps:

    1. the ONNX checker; 2. strict shape inference (both through the ONNX C++ library, as
    ``onnax check``); 3. loading and running on ONNX Runtime (opset <= 26) or the ONNX
    reference evaluator (newer opsets; ``backend`` forces one); 4. numerical parity with the
    transform chain recorded in the generated model, computed from ``source`` independently
    of onnax (per-example loops for vmap, float64 central differences for derivatives).

    Args:
        source: the model the chain started from (path, ``onnx.ModelProto`` or ``onnx_ir.Model``).
        generated: the model to validate.
        inputs: values by generated-model input name (a mapping or an ``.npz`` path); the rest
            are seeded random (standard normal floats), symbolic dims of length ``dims[name]``
            (default 3).
        rtol, atol: override the dtype-aware defaults (see ``onnax.testing.default_tolerance``).
        max_coords: reverse-mode references differentiate at most this many coordinates per
            selected input (a seeded sample; ``None`` for all).
        web: add a fifth step: run the generated model on onnxruntime-web's WASM backend in
            Node.js and compare it with the same reference (needs ``./setup.sh``'s npm install).
        max_seconds: stop computing finite-difference coordinates after this long and check
            those computed (the report says so).
        progress: called with a line before each part that may take a while.
        exact: use the exact JAX float64 reference when JAX is importable (else, or when the
            interpreter lacks an op of the source, finite differences; the report says which).

    Returns:
        A ``ValidationReport``; it stops at the first failing step (later steps "skip").

    Raises:
        ValidationInputError: a model or input file cannot be used (missing, unreadable, names
        that do not match), as opposed to a failed check.
    """
    src = load(source, "source")
    gen = load(generated, "generated")
    chain = parse_chain(gen)
    report = ValidationReport(
        source=_name(source),
        generated=_name(generated),
        transform=describe_chain(chain) if chain else "none recorded (compared with the source as is)",
        versions=versions(),
        opsets={"source": opsets(src), "generated": opsets(gen)},
        op_counts={"source": op_counts(src), "generated": op_counts(gen)},
    )
    if web:
        from onnax.testing._web import unavailable, web_version

        reason = unavailable()
        if reason:
            raise ValidationInputError(f"--web: {reason}")
        report.versions["onnxruntime-web"] = web_version()
    given = load_inputs(inputs)
    say = progress or (lambda _msg: None)
    budget = Budget(max_seconds, say)
    say("preparing the reference (the first use of JAX imports it: a few seconds)" if exact else "preparing")
    # Problems with the inputs or with the chain are usage errors, raised before any step runs.
    reference = build_reference(
        src, gen, chain, max_coords=max_coords, seed=seed, backend=backend, budget=budget, exact=exact
    )
    feeds = make_feeds(gen, given, seed, dims, index_ranges(src, dims))
    # The source runs first on these inputs: if it does not, the source or the inputs are at
    # fault, and the directions (tangents, cotangents) take the shapes the source computes.
    say("running the source model on the chosen inputs")
    try:
        reference.forward(reference.complete(reference.example_feeds(feeds, -1)))
        _redraw_directions(gen, reference, feeds, given, seed)
    except ValidationInputError as err:
        report.source_problem = str(err)
    report.inputs = _describe_feeds(feeds, given, seed)
    data = gen.SerializeToString()

    def run_step(name: str, body: Any) -> bool:
        if any(s.status != "pass" for s in report.steps):
            why = "the time limit was reached" if report.timed_out else "an earlier step failed"
            report.steps.append(StepResult(name, "skip", why))
            return False
        detail = body()
        if isinstance(detail, StepResult):  # (a step that ran out of time)
            report.steps.append(detail)
            return False
        report.steps.append(StepResult(name, "FAIL" if detail else "pass", detail or ""))
        return not detail

    if "checker" in steps:
        run_step("checker", lambda: _core.checker(data))
    if "strict shape inference" in steps:
        run_step("strict shape inference", lambda: _core.strict_shape_inference(data))
    actual: dict[str, np.ndarray] = {}
    chosen = choose_backend(gen, backend)
    report.backend = {
        "ort": "onnxruntime (CPUExecutionProvider)",
        "ref": "onnx.reference.ReferenceEvaluator",
    }[chosen]

    def execute() -> str:
        say(f"running the generated model on {report.backend}")
        try:
            with runtime_log(report.runtime_log):
                sess = Session(gen, chosen)
        except Exception as err:
            if report.source_problem or _refused(reference, chosen):
                return f"{report.backend} cannot load the generated model ({_short(err)}), and " + _blame(
                    report, reference, chosen
                )
            return (
                f"{report.backend} cannot load the generated model: {_short(err)}. Fix: if the opset or an "
                "operator is beyond this runtime, run the model on a runtime that supports it (--backend ref "
                "uses the ONNX reference evaluator); if onnax wrote this model, report it with this output"
            )
        try:
            with runtime_log(report.runtime_log):
                actual.update(sess.run(feeds))
        except Exception as err:
            if report.source_problem or _refused(reference, chosen):
                return f"{report.backend} fails to run the generated model ({_short(err)}), and " + _blame(
                    report, reference, chosen
                )
            return (
                f"{report.backend} loads the generated model but fails to run it on the inputs above: "
                f"{_short(err)}. Fix: check the input shapes (--inputs FILE.npz, --dim NAME=N); if they are "
                "valid, report it with this output"
            )
        return ""

    if "numerical parity" in steps and not report.source_problem and report.ok:
        # (the exact reference compiles in the background while ONNX Runtime loads and runs
        # the generated model)
        start_exact(reference, feeds)
    run_step("runtime", execute)
    if "numerical parity" in steps:
        run_step("numerical parity", lambda: _parity(report, reference, feeds, actual, rtol, atol, progress))
    if web:
        run_step("onnxruntime-web (wasm)", lambda: _web_parity(report, gen, reference, feeds, rtol, atol))
    report.runtime_log = reference.forward.log + reference.source.log + report.runtime_log
    return report


def _blame_source(report: ValidationReport) -> str:
    return f"{report.source_problem[0].lower()}{report.source_problem[1:]}"


def _refused(reference: Reference, chosen: str) -> list[str]:
    """Why the runtime ``chosen`` refused the SOURCE model, when the source had to run
    elsewhere (the reference evaluator) instead."""
    src = reference.forward
    if not src.backend or src.backend == chosen:
        return []
    name = {"ort": "ONNX Runtime", "ref": "the ONNX reference evaluator"}[chosen]
    return [e for e in src.errors if f" on {name}: " in e]


def _blame(report: ValidationReport, reference: Reference, chosen: str) -> str:
    if report.source_problem:
        return _blame_source(report)
    runtime = "ONNX Runtime" if chosen == "ort" else "the ONNX reference evaluator"
    other = "--backend ref" if chosen == "ort" else "--backend ort"
    return (
        f"{runtime} also refuses the SOURCE model on these inputs "
        f"({'; '.join(_refused(reference, chosen))}): "
        "the source uses something this runtime does not implement, not an onnax problem. Fix: run both on "
        f"another runtime ({other})"
    )


def _redraw_directions(
    gen: onnx.ModelProto, reference: Reference, feeds: Feeds, given: Mapping[str, np.ndarray], seed: int
) -> None:
    """Tangent / cotangent inputs get the shapes the source implies (a declared shape may have
    lost a static dim), drawn again from their own seeded stream when those differ."""
    declared = {v.name: np_dtype(v.type.tensor_type.elem_type) for v in runtime_inputs(gen)}
    rng = np.random.default_rng([seed, 1])
    for name, shape in reference.direction_shapes(feeds).items():
        if name in given or name not in feeds or tuple(feeds[name].shape) == tuple(shape):
            continue
        feeds[name] = random_tensor(rng, declared[name], shape)


def _short(err: Exception) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:400]}"


def parity(
    reference: Reference,
    feeds: Feeds,
    actual: Mapping[str, np.ndarray],
    rtol: float | None = None,
    atol: float | None = None,
) -> list[OutputComparison]:
    """Compares every output of the generated model that the reference defines."""
    return evaluate(reference, feeds, actual, rtol, atol).comparisons


def _parity(
    report: ValidationReport,
    reference: Reference,
    feeds: Feeds,
    actual: Mapping[str, np.ndarray],
    rtol: float | None,
    atol: float | None,
    progress: Progress | None,
) -> str | StepResult:
    if report.source_problem:
        return _blame_source(report)
    result = evaluate(reference, feeds, actual, rtol, atol, progress)
    report.outputs = result.comparisons
    report.reference = result.description
    report.notes.extend(result.notes)
    if result.incomplete:
        report.timed_out = result.incomplete
        failures = [c.problem for c in report.outputs if not c.ok]
        if failures:  # (primal outputs, compared without the exact reference)
            return "; ".join(failures) + ". " + result.diagnosis
        return StepResult("numerical parity", "skip", f"not completed: {result.incomplete}")
    failures = [c.problem for c in report.outputs if not c.ok]
    if not failures:
        return ""
    return "; ".join(failures) + ". " + result.diagnosis


def _web_parity(
    report: ValidationReport,
    gen: onnx.ModelProto,
    reference: Reference,
    feeds: Feeds,
    rtol: float | None,
    atol: float | None,
) -> str:
    from onnax.testing._web import run_web

    try:
        outputs = run_web(gen, feeds)
    except RuntimeError as err:
        return (
            f"onnxruntime-web (WASM) cannot load or run the generated model: {err}. Fix: check that "
            "onnxruntime-web supports its opset and operators; if onnax wrote this model, report it with "
            "this output"
        )
    report.web_outputs = parity(reference, feeds, outputs, rtol, atol)
    failures = [c.problem for c in report.web_outputs if not c.ok]
    missing = sorted({c.name for c in report.outputs} - set(outputs))
    if missing:
        failures.append(f"onnxruntime-web returned no outputs {missing}")
    return "; ".join(failures) + (". Fix: report it with this output" if failures else "")


def allclose(
    source: ModelLike,
    model: ModelLike,
    inputs: Mapping[str, np.ndarray] | list[np.ndarray] | str | os.PathLike[str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> tuple[bool, str]:
    """Runs ``model`` on ``inputs`` and compares it with the recorded transform of ``source``
    (numerics only: runtime execution and parity). ``inputs`` may be a list in the order of
    the model's runtime inputs. Returns ``(ok, message)`` like jax2onnx's ``allclose``."""
    if isinstance(inputs, list | tuple):
        names = [v.name for v in runtime_inputs(load(model, "generated"))]
        if len(inputs) != len(names):
            return False, f"{len(inputs)} inputs given, the model has {len(names)} runtime inputs {names}"
        inputs = dict(zip(names, (np.asarray(a) for a in inputs), strict=True))
    report = validate(source, model, inputs=inputs, rtol=rtol, atol=atol, steps=("numerical parity",))
    return report.ok, report.message


def allclose_web(
    source: ModelLike,
    model: ModelLike,
    inputs: Mapping[str, np.ndarray] | str | os.PathLike[str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> tuple[bool, str]:
    """Like :func:`allclose`, and also runs ``model`` on onnxruntime-web's WASM backend in
    Node.js (as jax2onnx's ``allclose_onnxruntime_web``); both must match the reference."""
    report = validate(
        source, model, inputs=inputs, rtol=rtol, atol=atol, steps=("numerical parity",), web=True
    )
    return report.ok, report.message


def report_json(report: ValidationReport) -> str:
    return json.dumps(report.to_dict(), indent=2)
