"""The reference a generated model is checked against, computed from the SOURCE model and the
recorded transform chain, never from onnax's own output. Two independent ones:

* **exact** (when JAX is importable and covers every op of the source): the source graph
  interpreted op by op in JAX float64 (:mod:`onnax.testing._jax_reference`), and the chain
  applied by ``jax.vmap`` / ``jax.jvp`` / ``jax.vjp`` themselves (:mod:`onnax.testing._exact`);
* **finite differences**: the source run in float64 (ONNX Runtime, or the reference evaluator
  when ORT has no float64 kernel), selected initializers lifted to inputs so they can be
  perturbed; ``vmap`` a loop over the examples; ``jvp`` central differences along the tangent;
  ``vjp`` / ``grad`` central differences of ``<u, f(x)>`` one coordinate at a time (a seeded
  sample for large inputs). Every difference is Richardson-extrapolated (steps h and h/2), and
  a coordinate whose one-sided differences disagree (a kink within h: ReLU at 0, a max-pool
  tie) is skipped and counted instead of compared. Nested derivatives (HVP) difference the
  inner float64 derivatives with the same small step.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnax.testing._chain import DERIVATIVES, Step
from onnax.testing._inputs import Feeds, convert_model_dtype, lift_initializers, np_dtype
from onnax.testing._models import ValidationInputError, runtime_inputs
from onnax.testing._runtime import Session, choose_backend, runtime_log


class Budget:
    """A deadline (``--max-seconds``; ``None`` never expires), and where long loops report
    how far they are (``say``, at most one line every ``every`` seconds)."""

    def __init__(
        self, seconds: float | None, say: Callable[[str], None] | None = None, every: float = 5.0
    ) -> None:
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.seconds = seconds
        self.hit = False  # set by whoever stopped early because of it
        self.say = say
        self.every = every
        self._last = time.monotonic()

    def progress(self, message: str) -> None:
        now = time.monotonic()
        if self.say is not None and now - self._last >= self.every:
            self._last = now
            self.say(message)

    def expired(self) -> bool:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.hit = True
            return True
        return False


@dataclass
class Value:
    """Reference outputs at one level. ``checked`` masks the coordinates to compare (a sample,
    minus skipped non-smooth ones); ``rough`` marks the non-smooth coordinates skipped."""

    values: dict[str, np.ndarray]
    checked: dict[str, np.ndarray] = field(default_factory=dict)
    rough: dict[str, np.ndarray] = field(default_factory=dict)


Fn = Callable[[Feeds], Value]


def _is_float(a: np.ndarray) -> bool:
    return bool(np.issubdtype(a.dtype, np.floating))


class Differences:
    """How derivatives are differenced: step ``eps`` (and eps/2 for Richardson) and the
    relative size of a one-sided disagreement that marks a coordinate non-smooth. Both follow
    the precision the source actually runs in (known once it has run): float64 takes
    eps = 1e-3 (error ~h^4 truncation + 1e-16/h rounding), a float32-only source eps = 1e-2."""

    def __init__(self, source: SourceFn | None, order: int, enabled: bool = True) -> None:
        self.source = source
        self.order = order
        self.enabled = enabled  # False: derivative levels only pass the primal outputs through

    @property
    def float64(self) -> bool:
        return self.source is None or self.source.precision == "float64"

    @property
    def eps(self) -> float:
        return 1e-3 if self.float64 and self.order <= 2 else 1e-2

    @property
    def rough_tol(self) -> float:
        return 1e-5 if self.float64 else 3e-3


def extrapolated(
    evaluate: Callable[[float], tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
    base: dict[str, np.ndarray],
    d: Differences,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Richardson-extrapolated central differences ``(4 D(h/2) - D(h)) / 3`` (error O(h^4)),
    and where the function is not smooth within h. ``evaluate(h)`` gives ``f(x + h v)`` and
    ``f(x - h v)``; ``base`` is ``f(x)``.

    Smooth: the one-sided asymmetry ``a(h) = (f(x+h) - 2 f(x) + f(x-h)) / h`` is ``h f''``,
    so ``a(h) - 2 a(h/2)`` is O(h^3), and the two central differences agree to O(h^2). A kink
    within h (a derivative jump J) leaves a term of order J in one or the other."""
    p1, m1 = evaluate(d.eps)
    p2, m2 = evaluate(d.eps / 2)
    est, rough = {}, {}
    for k, b in base.items():
        c1 = (p1[k] - m1[k]) / (2 * d.eps)
        c2 = (p2[k] - m2[k]) / d.eps
        est[k] = (4 * c2 - c1) / 3
        a1 = (p1[k] - 2 * b + m1[k]) / d.eps
        a2 = (p2[k] - 2 * b + m2[k]) / (d.eps / 2)
        scale = np.maximum(1.0, np.abs(est[k]))
        with np.errstate(invalid="ignore"):
            # (c1 - c2 is h^2 f'''/8 when smooth, up to J/6 across a kink: a looser bound)
            rough[k] = (np.abs(a1 - 2 * a2) > d.rough_tol * scale) | (
                np.abs(c1 - c2) > 100 * d.rough_tol * scale
            )
    return est, rough


class SourceModels:
    """The source with the selected initializers lifted to runtime inputs, and its float64
    copy, made on first use and shared by every runner of one reference (the copy of a large
    network costs seconds and its size again in memory)."""

    def __init__(self, source: onnx.ModelProto, lift: Sequence[str]) -> None:
        self.lifted = lift_initializers(source, lift)
        wanted = set(lift)
        self.defaults = {
            t.name: numpy_helper.to_array(t).astype(np.float64)
            for t in source.graph.initializer
            if t.name in wanted
        }
        self._double: onnx.ModelProto | None = None

    @property
    def double(self) -> onnx.ModelProto:
        if self._double is None:
            floats = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
            self._double = convert_model_dtype(self.lifted, floats, TensorProto.DOUBLE)
        return self._double

    def get(self, precision: str) -> onnx.ModelProto:
        return self.double if precision == "float64" else self.lifted


class SourceFn:
    """The source model as a function of float64 feeds; picks float64 when it runs."""

    def __init__(
        self,
        source: onnx.ModelProto,
        lift: Sequence[str],
        backend: str | None,
        prefer_ort: bool = False,
        models: SourceModels | None = None,
    ) -> None:
        """``prefer_ort``: ONNX Runtime in the source's precision before the reference evaluator
        in float64 (fast forward passes; differences need float64). ``models``: the lifted
        source (and its float64 copy) shared with another runner."""
        self._models = models or SourceModels(source, lift)
        self.defaults = self._models.defaults
        self.outputs = [o.name for o in source.graph.output]
        self.note = ""
        self.precision = "float64"
        self.backend = ""
        self.errors: list[str] = []  # why a candidate (precision, runtime) was not taken
        self.log: list[str] = []  # the runtimes' own log lines, captured
        self._prefer_ort = prefer_ort
        self._backend = backend
        self._session: Session | None = None
        self._input_dtypes: dict[str, np.dtype] = {}
        self.input_names = [v.name for v in runtime_inputs(self._models.lifted)]

    def _open(self, feeds: Feeds) -> None:
        errors = []
        # (the float64 copy keeps the source's opsets: the same runtime choice)
        tries = [
            (precision, backend)
            for precision in ("float64", "source precision")
            for backend in dict.fromkeys([choose_backend(self._models.lifted, self._backend), "ref"])
        ]
        if self._prefer_ort:
            tries.sort(key=lambda t: t[1] != "ort")
        for precision, backend in tries:
            model = self._models.get(precision)
            try:
                with runtime_log(self.log):
                    sess = Session(model, backend)
                    dtypes = {v.name: np_dtype(v.type.tensor_type.elem_type) for v in runtime_inputs(model)}
                    sess.run(self._cast(feeds, dtypes))
            except ValidationInputError:
                raise
            except Exception as err:
                name = {"ort": "ONNX Runtime", "ref": "the ONNX reference evaluator"}[backend]
                text = " ".join(str(err).split())[:300]
                errors.append(f"{precision} on {name}: {type(err).__name__}: {text}")
                continue
            self._session, self._input_dtypes, self.precision = sess, dtypes, precision
            self.backend = backend
            if precision != "float64":
                self.note = "the source does not run in float64 (" + "; ".join(errors) + ")"
            self.errors = errors
            return
        self.errors = errors
        raise ValidationInputError(
            "the SOURCE model does not run on the chosen inputs, so the problem is the source model or "
            "the inputs, not onnax: "
            + "; ".join(errors)
            + ". Fix: pass the source model the chain started from, with inputs it accepts (--inputs, "
            "--dim); if no runtime implements an operator of the source, validate a model without it"
        )

    @staticmethod
    def _cast(feeds: Feeds, dtypes: dict[str, np.dtype]) -> Feeds:
        out = {}
        for name, dtype in dtypes.items():
            if name not in feeds:
                raise ValidationInputError(
                    f"the source model needs input '{name}', which the generated model does not provide. "
                    "Fix: pass the SOURCE model the generated model was transformed from"
                )
            out[name] = np.asarray(feeds[name]).astype(dtype, copy=False)
        return out

    def __call__(self, feeds: Feeds) -> Value:
        if self._session is None:
            self._open(feeds)
        assert self._session is not None
        with runtime_log(self.log):
            res = self._session.run(self._cast(feeds, self._input_dtypes))
        return Value({k: v.astype(np.float64) if _is_float(v) else v for k, v in res.items()})


def _stack(results: list[Value], outputs: list[str], out_axes: list[int | None]) -> Value:
    out = Value({})
    for o, axis in zip(outputs, out_axes, strict=True):
        if o not in results[0].values:  # (a derivative the primal-only chain does not compute)
            continue
        if axis is None:  # the same for every example: the first example's
            out.values[o] = results[0].values[o]
            for attr in ("checked", "rough"):
                if o in getattr(results[0], attr):
                    getattr(out, attr)[o] = getattr(results[0], attr)[o]
            continue
        out.values[o] = np.stack([r.values[o] for r in results], axis=axis)
        for attr, fill in (("checked", True), ("rough", False)):
            if any(o in getattr(r, attr) for r in results):
                masks = [getattr(r, attr).get(o, np.full(r.values[o].shape, fill)) for r in results]
                getattr(out, attr)[o] = np.stack(masks, axis=axis)
    return out


def _vmap(prev: Fn, step: Step, outputs: list[str]) -> Fn:
    batched = {n: a for n, a in step.in_axes.items() if a is not None}
    out_axes = step.out_axes if len(step.out_axes) == len(outputs) else [step.out_axes[0]] * len(outputs)

    def fn(feeds: Feeds) -> Value:
        if not batched:
            raise ValidationInputError("vmap step with no batched input: the batch size is not defined")
        sizes = {n: feeds[n].shape[a] for n, a in batched.items()}
        if len(set(sizes.values())) != 1:
            raise ValidationInputError(f"batched inputs disagree on the batch size: {sizes}")
        size = next(iter(sizes.values()))
        results = []
        for i in range(size):
            ex = dict(feeds)
            for n, a in batched.items():
                ex[n] = np.take(feeds[n], i, axis=a)
            results.append(prev(ex))
        return _stack(results, outputs, list(out_axes))

    return fn


def _carry(base: Value, out: Value, src: str, dst: str) -> None:
    if src in base.checked:
        out.checked[dst] = base.checked[src]


def _jvp(prev: Fn, step: Step, tangents: list[str], results: list[str], d: Differences) -> Fn:
    def fn(feeds: Feeds) -> Value:
        primal = {k: v for k, v in feeds.items() if k not in tangents}
        base = prev(primal)
        out = Value(dict(base.values), dict(base.checked), dict(base.rough))
        if not d.enabled:
            return out

        def evaluate(h: float) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
            plus, minus = dict(primal), dict(primal)
            for s, t in zip(step.inputs, tangents, strict=True):
                plus[s] = primal[s] + h * feeds[t]
                minus[s] = primal[s] - h * feeds[t]
            vp, vm = prev(plus), prev(minus)
            return {o: vp.values[o] for o in step.outputs}, {o: vm.values[o] for o in step.outputs}

        est, rough = extrapolated(evaluate, {o: base.values[o] for o in step.outputs}, d)
        for o, r in zip(step.outputs, results, strict=True):
            out.values[r] = est[o]
            checked = base.checked.get(o, np.ones(est[o].shape, bool))
            out.checked[r] = checked & ~rough[o]
            out.rough[r] = rough[o]
        return out

    return fn


def _coords(size: int, name: str, max_coords: int | None, seed: int) -> np.ndarray:
    if max_coords is None or size <= max_coords:
        return np.arange(size)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return np.sort(rng.choice(size, size=max_coords, replace=False))


def _reverse(
    prev: Fn,
    step: Step,
    cotangents: list[str],
    results: list[str],
    d: Differences,
    max_coords: int | None,
    seed: int,
    budget: Budget,
) -> Fn:
    def fn(feeds: Feeds) -> Value:
        primal = {k: v for k, v in feeds.items() if k not in cotangents}
        base = prev(primal)
        out = Value(dict(base.values), dict(base.checked), dict(base.rough))
        if not d.enabled:
            return out
        if step.transform == "grad":
            seeds = {step.outputs[0]: np.ones_like(base.values[step.outputs[0]])}
        else:
            seeds = {o: feeds[c] for o, c in zip(step.outputs, cotangents, strict=True)}
        inner0 = sum(float(np.sum(u * base.values[o])) for o, u in seeds.items())
        for s, r in zip(step.inputs, results, strict=True):
            x = primal[s]
            g = np.zeros(x.shape, np.float64)
            checked = np.zeros(x.shape, bool)
            rough = np.zeros(x.shape, bool)
            coords = _coords(x.size, s, max_coords, seed)
            for count, idx in enumerate(coords):
                if budget.expired():
                    break
                budget.progress(f"finite differences of '{s}': coordinate {count + 1} of {len(coords)}")

                def evaluate(
                    h: float, s: str = s, x: np.ndarray = x, idx: int = int(idx)
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
                    plus, minus = dict(primal), dict(primal)
                    e = np.zeros(x.size)
                    e[idx] = h
                    plus[s] = x + e.reshape(x.shape)
                    minus[s] = x - e.reshape(x.shape)
                    vp, vm = prev(plus), prev(minus)
                    ip = sum(float(np.sum(u * vp.values[o])) for o, u in seeds.items())
                    im = sum(float(np.sum(u * vm.values[o])) for o, u in seeds.items())
                    return {"d": np.asarray(ip)}, {"d": np.asarray(im)}

                est, jump = extrapolated(evaluate, {"d": np.asarray(inner0)}, d)
                g.flat[idx] = float(est["d"])
                rough.flat[idx] = bool(jump["d"])
                checked.flat[idx] = not rough.flat[idx]
            out.values[r] = g
            out.checked[r] = checked
            out.rough[r] = rough
        return out

    return fn


@dataclass
class Level:
    """One recorded step as the reference replays it: names before it, names it adds, and the
    (difference-free) reference function of the model it was applied to."""

    step: Step
    inputs: list[str]  # runtime inputs of the model the step was applied to
    outputs: list[str]
    added_inputs: list[str]  # tangents / cotangents it appends
    added_outputs: list[str]
    primal_before: Fn


@dataclass
class Reference:
    """The reference of a generated model, with what a report says about it.

    ``fn`` is the finite-difference reference, ``primal`` the same chain with the derivative
    levels passing only the primal outputs through (the source run as is: the cross-check of
    the exact reference's forward pass), ``exact`` the JAX one when available (else
    ``exact_missing`` or ``exact_note`` says why not)."""

    fn: Fn
    primal: Fn
    defaults: Feeds  # lifted initializer values the feeds are completed with
    fd_outputs: set[str]
    differences: Differences
    source: SourceFn
    forward: SourceFn  # the source for forward passes (ONNX Runtime first, any precision)
    levels: list[Level]
    source_inputs: list[str]
    exact: Callable[[Feeds], dict[str, np.ndarray]] | None = None
    # the same chain on the source interpreted in its own precision (float32): how much an
    # independent implementation at the generated model's precision is off (conditioning)
    exact_low: Callable[[], Callable[[Feeds], dict[str, np.ndarray]]] | None = None
    exact_missing: list[str] = field(default_factory=list)
    exact_note: str = ""
    budget: Budget = field(default_factory=lambda: Budget(None))
    # (feeds, job): the exact reference already computing on those feeds (``start_exact``)
    started: tuple[Feeds, Any] | None = None

    @property
    def eps(self) -> float:
        return self.differences.eps

    def complete(self, feeds: Feeds) -> Feeds:
        """Float feeds in float64, completed with the lifted initializers' values."""
        out = {k: v.astype(np.float64) if _is_float(v) else v for k, v in feeds.items()}
        for k, v in self.defaults.items():
            out.setdefault(k, v)
        return out

    def fd_method(self) -> str:
        src = self.source
        text = f"finite differences (source in {src.precision} on {_backend_name(src.backend)}"
        text += f"; central, Richardson-extrapolated, eps {self.eps:g})"
        return text

    def why_not_exact(self) -> str:
        if self.exact_missing:
            return "JAX interpreter lacks: " + ", ".join(self.exact_missing)
        return self.exact_note

    def example_feeds(self, feeds: Feeds, level: int) -> Feeds:
        """Feeds of the model level ``level`` was applied to: example 0 of every vmap after it,
        the tangents / cotangents of later steps dropped."""
        ex = dict(feeds)
        for lv in reversed(self.levels[level + 1 :]):
            if lv.step.transform == "vmap":
                for n, a in lv.step.in_axes.items():
                    if a is not None and n in ex:
                        ex[n] = np.take(ex[n], 0, axis=a)
            for n in lv.added_inputs:
                ex.pop(n, None)
        return ex

    def direction_shapes(self, feeds: Feeds) -> dict[str, tuple[int, ...]]:
        """The shapes the tangent / cotangent inputs must have given the primal ``feeds``:
        those of the values they pair with, as the source computes them (not as declared), with
        the batch axes of the vmaps applied after their step."""
        shapes: dict[str, tuple[int, ...]] = {}
        for k, lv in enumerate(self.levels):
            if lv.step.transform not in ("jvp", "vjp"):
                continue
            ex = self.complete(self.example_feeds(feeds, k))
            if lv.step.transform == "jvp":
                pairs = dict(zip(lv.added_inputs, (ex[s].shape for s in lv.step.inputs), strict=True))
            else:
                values = lv.primal_before({n: ex[n] for n in lv.inputs if n in ex} | self.defaults)
                pairs = dict(
                    zip(lv.added_inputs, (values.values[o].shape for o in lv.step.outputs), strict=True)
                )
            for name, shape in pairs.items():
                dims = list(shape)
                for later in self.levels[k + 1 :]:
                    axis = later.step.in_axes.get(name) if later.step.transform == "vmap" else None
                    if axis is not None:
                        size = next(
                            feeds[n].shape[a]
                            for n, a in later.step.in_axes.items()
                            if a is not None and n in feeds
                        )
                        dims.insert(axis % (len(dims) + 1), size)
                shapes[name] = tuple(dims)
        return shapes


def _backend_name(backend: str) -> str:
    return {"ort": "ONNX Runtime", "ref": "the ONNX reference evaluator"}.get(backend, "not run")


def build_reference(
    source: onnx.ModelProto,
    generated: onnx.ModelProto,
    chain: list[Step],
    *,
    max_coords: int | None,
    seed: int,
    backend: str | None,
    budget: Budget | None = None,
    exact: bool = True,
) -> Reference:
    """Replays ``chain`` on ``source`` as reference semantics, naming each level's inputs and
    outputs from ``generated`` (every transform keeps the earlier names first and appends)."""
    budget = budget or Budget(None)
    src_inputs = [v.name for v in runtime_inputs(source)]
    gen_inputs = [v.name for v in runtime_inputs(generated)]
    gen_outputs = [o.name for o in generated.graph.output]
    inputs, outputs = list(src_inputs), [o.name for o in source.graph.output]
    src_inits = {t.name for t in source.graph.initializer}
    # (initializers a derivative selects, or a vmap batches: an ensemble)
    lift = sorted(
        {n for s in chain for n in s.inputs if n in src_inits}
        | {
            n
            for s in chain
            if s.transform == "vmap"
            for n, a in s.in_axes.items()
            if a is not None and n in src_inits
        }
    )
    order = sum(1 for s in chain if s.transform in DERIVATIVES)
    models = SourceModels(source, lift)
    src = SourceFn(source, lift, backend, models=models)
    # Extrapolated central differences: error ~h^4 (truncation) + 1e-16/h (float64 rounding);
    # h = 1e-3 balances them, and an outer level differencing inner float64 derivatives
    # (error ~1e-12) keeps the same small step (never a large one, which straddles kinks).
    differences = Differences(src, order)
    primal_only = Differences(None, order, enabled=False)
    fast = SourceFn(source, lift, backend, prefer_ort=True, models=models)
    fn: Fn = src
    pfn: Fn = fast
    fd: set[str] = set()
    levels: list[Level] = []
    jax_ok = False
    pending_vmaps: list[tuple[Step, list[str]]] = []  # vmap steps not yet applied as jax.vmap
    jax_ops: list[tuple[str, tuple[Any, ...]]] = []  # the levels applied to the interpreted source
    exact_note = ""
    missing: list[str] = []
    batched: set[str] = set()
    # (a chain without derivatives is checked against the source run as is: no JAX needed)
    if exact and order:
        from onnax.testing._exact import jax_available

        if not jax_available():
            exact_note = "JAX is not installed"
        else:
            from onnax.testing._jax_reference import missing_ops

            missing = missing_ops(source)
            if not missing:
                jax_ok = True
    for k, step in enumerate(chain):

        def take(
            names: list[str], start: int, count: int, what: str, k: int = k, step: Step = step
        ) -> list[str]:
            got = names[start : start + count]
            if len(got) != count:
                raise ValidationInputError(
                    f"step {k} ({step.transform}) should add {count} {what} after {start}, but the generated "
                    f"model has {len(names)} ({names}). Fix: pass the SOURCE model this chain started from"
                )
            return got

        if step.transform == "vmap":
            # (a batched initializer became a runtime input of this step: appended, as vmap does)
            inputs += [
                n for n in step.in_axes if n not in inputs and n in src_inits and step.in_axes[n] is not None
            ]
            if set(step.in_axes) != set(inputs):
                raise ValidationInputError(
                    f"step {k} (vmap) maps inputs {sorted(step.in_axes)}, but the model at that step has "
                    f"runtime inputs {inputs}. Fix: pass the SOURCE model this chain started from"
                )
            levels.append(Level(step, list(inputs), list(outputs), [], [], pfn))
            fn, pfn = _vmap(fn, step, list(outputs)), _vmap(pfn, step, list(outputs))
            batched |= {n for n, a in step.in_axes.items() if a is not None}
            # (applied by jax.vmap when a later step transforms it; an outermost vmap is a
            # loop over the examples, each through one compiled function)
            pending_vmaps.append((step, list(outputs)))
            continue
        known = set(inputs) | set(lift)
        missing_sel = [n for n in step.inputs if n not in known] + [
            o for o in step.outputs if o not in outputs
        ]
        if missing_sel:
            raise ValidationInputError(
                f"step {k} ({step.transform}) selects {missing_sel}, which the model at that step lacks "
                f"(inputs {inputs}, outputs {outputs}). Fix: pass the SOURCE model this chain started from"
            )
        jax_ops.extend(("vmap", (vstep, vouts)) for vstep, vouts in pending_vmaps)
        pending_vmaps.clear()
        later_derivative = any(s.transform in DERIVATIVES for s in chain[k + 1 :])
        # Sampling coordinates is only sound at the outermost derivative: an outer finite
        # difference over a partly computed gradient would difference the unsampled zeros.
        coords = None if later_derivative else max_coords
        if step.transform == "jvp":
            added = take(gen_inputs, len(inputs), len(step.inputs), "tangent inputs")
            results = take(gen_outputs, len(outputs), len(step.outputs), "tangent outputs")
            levels.append(Level(step, list(inputs), list(outputs), added, results, pfn))
            fn = _jvp(fn, step, added, results, differences)
            pfn = _jvp(pfn, step, added, results, primal_only)
            jax_ops.append(("jvp", (step, added, results)))
        else:
            n_cot = len(step.outputs) if step.transform == "vjp" else 0
            added = take(gen_inputs, len(inputs), n_cot, "cotangent inputs")
            results = take(gen_outputs, len(outputs), len(step.inputs), "derivative outputs")
            levels.append(Level(step, list(inputs), list(outputs), added, results, pfn))
            fn = _reverse(fn, step, added, results, differences, coords, seed, budget)
            pfn = _reverse(pfn, step, added, results, primal_only, coords, seed, budget)
            jax_ops.append(("reverse", (step, added, results)))
        inputs = inputs + added  # (new lists: closures hold the earlier ones)
        outputs = outputs + results
        fd |= set(results)
    gen_inits = {t.name for t in generated.graph.initializer}
    if stored := [n for n in inputs if n not in gen_inputs and n in gen_inits and n in src_inits]:
        raise ValidationInputError(
            f"the generated model stores the batched initializers {stored} (vmap's stored=), which validate "
            "does not replay. Fix: validate the vmap result without stored= (the same graph, the sets fed as "
            "inputs)"
        )
    if inputs != gen_inputs or outputs != gen_outputs:
        raise ValidationInputError(
            f"replaying the recorded chain on the source gives inputs {inputs} and outputs {outputs}, "
            "but the "
            f"generated model has inputs {gen_inputs} and outputs {gen_outputs}. Fix: pass the SOURCE model "
            "this chain started from (and a generated model onnax wrote unchanged)"
        )
    exact_fn: Callable[[Feeds], dict[str, np.ndarray]] | None = None
    exact_low: Callable[[], Callable[[Feeds], dict[str, np.ndarray]]] | None = None
    if jax_ok:
        from onnax.testing._exact import compose

        try:
            exact_fn = compose(source, jax_ops, pending_vmaps, batched, widen=True)
        except NotImplementedError as err:
            exact_note = f"JAX interpreter: {err}"

        def exact_low() -> Callable[[Feeds], dict[str, np.ndarray]]:
            return compose(source, jax_ops, pending_vmaps, batched, widen=False)

    return Reference(
        fn,
        pfn,
        src.defaults,
        fd,
        differences,
        src,
        fast,
        levels,
        src_inputs,
        exact=exact_fn,
        exact_low=exact_low if exact_fn is not None else None,
        exact_missing=missing,
        exact_note=exact_note,
        budget=budget,
    )
