"""Numerical parity of a generated model with its reference, as ``validate`` and ``bench`` run it.

1. The exact reference (JAX float64, :mod:`onnax.testing._exact`) when available, trusted only
   after its forward pass matches the source run by ONNX Runtime (or the reference evaluator)
   on the same inputs; otherwise finite differences, and the report says why.
2. Coordinates where the source is not smooth are skipped and counted: for the exact reference,
   those whose value jumps when the primal inputs move by a few float rounding units (the
   generated model, rounding differently, may take the other side of a ReLU or max-pool tie);
   for differences, those whose one-sided differences disagree.
3. A mismatch is called an onnax bug only when a second reference confirms it: a failure
   against the exact reference is re-checked against finite differences.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from onnax.testing._compare import OutputComparison, compare, default_tolerance
from onnax.testing._inputs import Feeds
from onnax.testing._reference import Budget, Reference, Value

Progress = Callable[[str], None]

# Default tolerances of a finite-difference reference computed in float32 (a source that does
# not run in float64): eps 1e-2 and float32 rounding leave errors of order 1e-3 of |f|.
FLOAT32_FD_TOL = (1e-2, 1e-2)
# Forward-pass agreement required of the JAX interpreter with the runtime (relative to the
# output's largest magnitude): float64 runtimes agree to rounding; a float32 run to ~1e-5.
FORWARD_TOL = {"float64": 1e-7, "source precision": 2e-3}


@dataclass
class Parity:
    comparisons: list[OutputComparison]
    method: str  # "exact" or "finite differences"
    description: str
    notes: list[str] = field(default_factory=list)
    diagnosis: str = ""  # set when some output fails: whose fault, and what to do
    incomplete: str = ""  # set when the time limit stopped the reference: what was not checked


def _floating(a: np.ndarray) -> bool:
    return bool(np.issubdtype(a.dtype, np.floating))


class TimeLimit(Exception):
    """The time limit was reached before the exact reference finished."""


_RUNNING: set[threading.Thread] = set()


def background_running() -> bool:
    """Whether an abandoned exact reference (time limit, or a step failed before parity) is
    still computing: the interpreter waits for it at exit (the command line exits at once)."""
    return any(t.is_alive() for t in _RUNNING)


class Background:
    """``work()`` in a thread, started now: a JAX compilation releases the GIL, so the exact
    reference compiles while ``validate`` runs ONNX Runtime (two cores). Not a daemon thread:
    a daemon killed inside XLA at interpreter exit aborts the process."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self._box: dict[str, Any] = {}

        def target() -> None:
            try:
                self._box["value"] = work()
            except BaseException as err:  # (re-raised in the caller's thread)
                self._box["error"] = err

        self._thread = threading.Thread(target=target, name="onnax-exact-reference")
        self._thread.start()
        _RUNNING.intersection_update(t for t in _RUNNING if t.is_alive())
        _RUNNING.add(self._thread)

    def result(self, budget: Budget) -> Any:
        """The result, waiting at most until the budget's deadline (then ``TimeLimit``; the
        thread is abandoned: a JAX compilation cannot be interrupted, it finishes in the
        background and its result is unused)."""
        if budget.deadline is None:
            self._thread.join()
        else:
            self._thread.join(max(0.0, budget.deadline - time.monotonic()))
        if self._thread.is_alive():
            budget.hit = True
            raise TimeLimit
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]


def start_exact(reference: Reference, feeds: Feeds) -> None:
    """Starts computing the exact reference on ``feeds`` in the background (``evaluate`` on
    the same ``feeds`` object picks it up)."""
    exact_fn = reference.exact
    if exact_fn is None or not reference.fd_outputs:
        return
    ref_feeds = reference.complete(feeds)
    reference.started = (feeds, Background(lambda: exact_fn(ref_feeds)))


def _exact_values(reference: Reference, feeds: Feeds, ref_feeds: Feeds) -> dict[str, np.ndarray]:
    started = reference.started
    reference.started = None
    if started is not None and started[0] is feeds:
        job = started[1]
    else:
        exact_fn = reference.exact
        assert exact_fn is not None
        if reference.budget.expired():
            raise TimeLimit
        job = Background(lambda: exact_fn(ref_feeds)) if reference.budget.deadline is not None else None
        if job is None:
            return exact_fn(ref_feeds)
    return cast(dict[str, np.ndarray], job.result(reference.budget))


def forward_mismatch(exact: Mapping[str, np.ndarray], forward: Value, skip: set[str], precision: str) -> str:
    """Where the interpreted forward pass differs from the runtime's ('' if nowhere)."""
    tol = FORWARD_TOL.get(precision, 2e-3)
    for name, want in forward.values.items():
        if name in skip or name not in exact:
            continue
        got = exact[name]
        if got.shape != want.shape:
            return f"output '{name}' has shape {list(got.shape)} there, {list(want.shape)} in the runtime"
        if _floating(want):
            scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
            err = float(np.max(np.abs(got.astype(np.float64) - want))) / scale if want.size else 0.0
            if not err <= tol:
                return f"output '{name}' differs by {err:.3g} (relative to its scale; allowed {tol:g})"
        elif not np.array_equal(got, want):
            return f"output '{name}' differs at {int(np.sum(got != want))} positions"
    return ""


def _rough_exact(
    reference: Reference,
    feeds: Feeds,
    expected: Mapping[str, np.ndarray],
    actual: Mapping[str, np.ndarray],
    rtol: float | None,
    atol: float | None,
) -> dict[str, np.ndarray]:
    """Derivative coordinates whose exact value moves by more than a quarter of the tolerance
    when every primal float input moves by ~10 rounding units of the generated model's
    precision (one random direction: a tie is broken by it with probability one): the source
    is not smooth there (ReLU at 0, a max-pool tie), or so ill-conditioned that the generated
    model's own rounding decides the value. Either way its precision cannot be held to it."""
    assert reference.exact is not None
    outs = [o for o in reference.fd_outputs if o in actual and o in expected and _floating(actual[o])]
    if not outs:
        return {}
    rel = max(10 * float(np.finfo(actual[outs[0]].dtype).eps), 1e-13)
    movable = [
        k for k in feeds if (k in reference.source_inputs or k in reference.defaults) and _floating(feeds[k])
    ]
    if not movable:
        return {}
    rng = np.random.default_rng(1)
    rough = {o: np.zeros(expected[o].shape, bool) for o in outs}
    moved = dict(feeds)
    for k in movable:
        v = feeds[k]
        moved[k] = v + rel * (np.abs(v) + 1e-3) * rng.standard_normal(v.shape)
    other = reference.exact(moved)
    for o in outs:
        e = expected[o].astype(np.float64)
        d_rtol, d_atol = default_tolerance(actual[o].dtype, fd=False)
        r, a = (d_rtol if rtol is None else rtol), (d_atol if atol is None else atol)
        scale = max(1.0, float(np.max(np.abs(e)))) if e.size else 1.0
        with np.errstate(invalid="ignore"):
            rough[o] |= np.abs(other[o] - e) > 0.25 * (a * scale + r * np.abs(e))
    return rough


def _compare_all(
    reference: Reference,
    expected: Value,
    actual: Mapping[str, np.ndarray],
    rtol: float | None,
    atol: float | None,
    *,
    exact: bool,
    atols: Mapping[str, float] | None = None,
) -> list[OutputComparison]:
    float32_fd = not exact and reference.source.precision != "float64"
    method = "exact (JAX float64)" if exact else "finite differences"
    out = []
    for name, value in actual.items():
        if name not in expected.values:
            continue
        derivative = name in reference.fd_outputs
        out.append(
            compare(
                name,
                value,
                expected.values[name],
                expected.checked.get(name),
                fd=derivative and not exact,
                rtol=rtol,
                atol=(atols or {}).get(name, atol),
                method=method if derivative else "exact",
                defaults=FLOAT32_FD_TOL if float32_fd and derivative else None,
                rough=expected.rough.get(name),
            )
        )
    return out


def evaluate(
    reference: Reference,
    feeds: Feeds,
    actual: Mapping[str, np.ndarray],
    rtol: float | None = None,
    atol: float | None = None,
    progress: Progress | None = None,
    confirm_seconds: float = 60.0,
) -> Parity:
    """Compares every output of the generated model that the reference defines."""
    say = progress or (lambda _msg: None)
    ref_feeds = reference.complete(feeds)
    notes: list[str] = []
    expected: Value | None = None
    first: list[OutputComparison] | None = None  # the comparisons, when no coordinate is skipped
    atols: dict[str, float] = {}  # widened for ill-conditioning (measured, see _conditioning)
    why_fd = reference.why_not_exact()
    if reference.exact is not None and reference.fd_outputs:
        try:
            say("exact reference: the source interpreted in JAX float64 (compiling)")
            values = _exact_values(reference, feeds, ref_feeds)
            say("checking the interpreted forward pass against the runtime")
            forward = reference.primal(ref_feeds)
            mismatch = forward_mismatch(values, forward, reference.fd_outputs, reference.forward.precision)
            if mismatch:
                why_fd = f"the JAX interpretation's forward pass disagrees with the runtime: {mismatch}"
            else:
                expected = Value(values)
                # Non-smooth coordinates only matter where the generated model disagrees: every
                # coordinate is compared first, and only if a derivative fails are the inputs
                # moved (one more run of the exact reference) to find and skip the kinks.
                first = _compare_all(reference, expected, actual, rtol, atol, exact=True)
                if any(not c.ok and c.name in reference.fd_outputs for c in first):
                    first = None
                    say("looking for non-smooth coordinates (moving the inputs by a few rounding units)")
                    rough = _rough_exact(reference, ref_feeds, values, actual, rtol, atol)
                    for o, mask in rough.items():
                        expected.rough[o] = mask
                        expected.checked[o] = ~mask
                    again = _compare_all(reference, expected, actual, rtol, atol, exact=True)
                    failing = [c.name for c in again if not c.ok]
                    if failing and atol is None and reference.exact_low is not None:
                        say("measuring the rounding error of the chain at the generated model's precision")
                        try:
                            atols, note = _conditioning(reference, ref_feeds, values, actual, failing)
                            notes.append(note)
                        except Exception as err:  # (then the default tolerances stand)
                            text = " ".join(str(err).split())[:200]
                            notes.append(
                                f"rounding error at the generated model's precision not measured: {text}"
                            )
        except TimeLimit:
            return _timed_out(reference, ref_feeds, actual, rtol, atol)
        except Exception as err:  # the interpreter could not follow the graph: say so, use FD
            text = " ".join(str(err).split())[:300]
            why_fd = f"the JAX interpretation failed ({type(err).__name__}: {text})"
            expected = None
    exact = expected is not None
    if expected is None and not reference.fd_outputs:
        # No derivative: the source run as is (per example for vmap) by the runtime of the
        # forward pass, in float64 when that runtime has the kernels, else in the source's
        # precision (ONNX Runtime has no float64 Conv; the reference evaluator would take
        # minutes on a large CNN for nothing the comparison needs).
        expected = reference.primal(ref_feeds)
    elif expected is None:
        say("finite-difference reference (running the source per coordinate)")
        expected = reference.fn(ref_feeds)
    comparisons = (
        first
        if exact and first is not None
        else _compare_all(reference, expected, actual, rtol, atol, exact=exact, atols=atols)
    )
    if not reference.fd_outputs:
        description = f"the source run as is on {_runtime(reference)} (per-example loop for vmap)"
    elif exact:
        description = (
            "exact: the source interpreted op by op in JAX float64, the chain applied by jax.vmap/jvp/vjp "
            f"(forward pass checked against {_runtime(reference)})"
        )
    else:
        description = reference.fd_method() + (f" ({why_fd})" if why_fd else "")
        if reference.source.precision != "float64":
            notes.append(
                f"the source does not run in float64, so the differences are float32 ones: tolerances "
                f"widened to rtol {FLOAT32_FD_TOL[0]:g}, atol {FLOAT32_FD_TOL[1]:g} ({reference.source.note})"
            )
    incomplete = ""
    if reference.budget.hit:
        notes.append(
            f"time limit of {reference.budget.seconds:g} s reached: only the coordinates computed by then "
            "were checked (see 'coordinates checked' per output)"
        )
        unchecked = sorted(c.name for c in comparisons if c.name in reference.fd_outputs and not c.checked)
        if unchecked:
            incomplete = (
                f"time limit of {reference.budget.seconds:g} s reached before any coordinate of {unchecked} "
                "was computed"
            )
    skipped = sum(c.skipped_rough for c in comparisons)
    if skipped:
        if exact:
            why = (
                "their exact value moves by more than a quarter of the tolerance when the inputs move by ten "
                "rounding units: a kink such as ReLU at 0 or a max-pool tie, or ill-conditioning at the "
                "generated model's precision"
            )
        else:
            why = "their one-sided differences disagree: a kink such as ReLU at 0 or a max-pool tie"
        notes.append(f"{skipped} non-smooth coordinates skipped ({why})")
        # An output whose every coordinate was skipped is unchecked, not passed.
        unchecked_rough = sorted(c.name for c in comparisons if c.total and not c.checked and c.skipped_rough)
        if unchecked_rough and not incomplete:
            incomplete = (
                f"every coordinate of {unchecked_rough} is at a non-smooth point of the source, so none was "
                "checked; validate at other inputs (--seed N, or --inputs)"
            )
    result = Parity(comparisons, "exact" if exact else "finite differences", description, notes)
    result.incomplete = incomplete
    failures = [c for c in comparisons if not c.ok]
    if failures:
        result.diagnosis = _diagnose(
            reference, ref_feeds, actual, failures, exact, why_fd, rtol, atol, say, confirm_seconds
        )
    return result


# A derivative is held to this multiple of the error the same chain makes when computed
# independently at the generated model's precision (as the corpus holds onnax to JAX's own
# float32 error): rounding in a different order may err a few times more, an onnax bug far more.
CONDITIONING_FACTOR = 4.0


def _conditioning(
    reference: Reference,
    ref_feeds: Feeds,
    values: Mapping[str, np.ndarray],
    actual: Mapping[str, np.ndarray],
    failing: list[str],
) -> tuple[dict[str, float], str]:
    """How far an independent computation at the generated model's precision (the source
    interpreted in JAX at that precision, the same chain) is from the float64 reference, per
    group of outputs (the primal ones; the results of one step: gradients, or their tangents); each
    failing output's atol becomes the default or CONDITIONING_FACTOR x that error, relative
    to the output's scale as ``compare`` applies atol."""
    assert reference.exact_low is not None
    dtype = actual[failing[0]].dtype
    low_feeds = {k: v.astype(dtype) if _floating(v) else v for k, v in ref_feeds.items()}
    low = reference.exact_low()(low_feeds)
    primal = [o for o in values if o not in reference.fd_outputs]
    groups = [primal] + [lv.added_outputs for lv in reference.levels if lv.added_outputs]
    atols: dict[str, float] = {}
    parts = []
    for group in groups:
        members = [o for o in group if o in values and o in low and values[o].size]
        if not any(o in failing for o in members):
            continue
        err = max(float(np.max(np.abs(low[o].astype(np.float64) - values[o]))) for o in members)
        top = max(float(np.max(np.abs(values[o]))) for o in members)
        for o in members:
            if o in failing:
                d_atol = default_tolerance(actual[o].dtype, fd=False)[1]
                scale = max(1.0, float(np.max(np.abs(values[o]))))
                atols[o] = max(d_atol, CONDITIONING_FACTOR * err / scale)
        parts.append(
            f"{err:.3g} on {members[0]}{' ...' if len(members) > 1 else ''} (largest value {top:.3g})"
        )
    note = (
        f"the same chain computed independently in {np.dtype(dtype).name} (the source interpreted in JAX) is "
        f"off the float64 reference by up to {'; '.join(parts)}: the source is that ill-conditioned at this "
        f"precision, so {sorted(atols)} are held to {CONDITIONING_FACTOR:g}x that error"
    )
    return atols, note


def _timed_out(
    reference: Reference,
    ref_feeds: Feeds,
    actual: Mapping[str, np.ndarray],
    rtol: float | None,
    atol: float | None,
) -> Parity:
    """The time limit passed while the exact reference compiled or ran: the primal outputs are
    compared with the source run as is (cheap), the derivatives are not checked."""
    seconds = reference.budget.seconds
    text = (
        f"time limit of {seconds:g} s reached while the exact reference was compiling or running (a JAX "
        "compilation cannot be interrupted; it finishes in the background): the derivative outputs "
        f"{sorted(o for o in reference.fd_outputs if o in actual)} were not checked. Fix: a larger "
        "--max-seconds, or --reference fd to bound the check by coordinates"
    )
    primal = {k: v for k, v in actual.items() if k not in reference.fd_outputs}
    comparisons = _compare_all(reference, reference.primal(ref_feeds), primal, rtol, atol, exact=False)
    result = Parity(
        comparisons, "none", f"the source run as is on {_runtime(reference)} (primal outputs only)"
    )
    result.incomplete = text
    if any(not c.ok for c in comparisons):
        result.diagnosis = _diagnose(
            reference, ref_feeds, actual, comparisons, False, "", rtol, atol, lambda _m: None, 0
        )
    return result


def _runtime(reference: Reference) -> str:
    return {"ort": "ONNX Runtime", "ref": "the ONNX reference evaluator"}.get(
        reference.forward.backend, "a runtime"
    )


def _diagnose(
    reference: Reference,
    ref_feeds: Feeds,
    actual: Mapping[str, np.ndarray],
    failures: list[OutputComparison],
    exact: bool,
    why_fd: str,
    rtol: float | None,
    atol: float | None,
    say: Progress,
    confirm_seconds: float,
) -> str:
    """Whose fault a mismatch is: confirmed by a second reference or not."""
    primal_only = all(c.name not in reference.fd_outputs for c in failures)
    if primal_only:
        return (
            "Fix: the generated model's primal outputs differ from the source run as is: if onnax generated "
            "this model from SOURCE, this is an onnax bug: report it with this output"
        )
    if not exact:
        second = f"no second reference: {why_fd}" if why_fd else "no second reference"
        return (
            f"Fix: only finite differences disagree ({second}); if the inputs sit at a non-smooth point, "
            "retry with --seed or --inputs; if the mismatch persists, report it with this output"
        )
    say("confirming the mismatch with finite differences (second reference)")
    budget = reference.budget
    deadline = time.monotonic() + confirm_seconds
    budget.deadline = deadline if budget.deadline is None else min(budget.deadline, deadline)
    try:
        fd_values = reference.fn(ref_feeds)
    except Exception as err:
        return (
            f"Fix: not confirmed by a second reference (finite differences failed: {type(err).__name__}: "
            f"{' '.join(str(err).split())[:200]}); if onnax generated this model from SOURCE, report it with "
            "this output"
        )
    again = _compare_all(
        reference, fd_values, {c.name: actual[c.name] for c in failures}, rtol, atol, exact=False
    )
    confirmed = [c.name for c in again if not c.ok]
    if not confirmed and budget.hit:
        checked = sum(c.checked for c in again)
        return (
            f"Fix: not confirmed: the second reference (finite differences) ran out of time after {checked} "
            "coordinates, which agree with the generated model; rerun with a larger --max-seconds. If onnax "
            "generated this model from SOURCE and the mismatch persists, report it with this output"
        )
    if confirmed:
        return (
            f"Fix: finite differences confirm the mismatch of {confirmed}; if onnax generated this model "
            "from SOURCE, this is an onnax bug: report it with this output"
        )
    return (
        "Fix: not confirmed: finite differences agree with the generated model where the exact reference "
        "does not (the source may sit at a non-smooth point, or the JAX interpreter may translate an op "
        "differently): retry with --seed or --inputs; if it persists, report it with this output"
    )
