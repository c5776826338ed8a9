"""The reference a generated model is checked against, computed from the SOURCE model and the
recorded transform chain, never from onnax's own output:

* the source runs in float64 (ONNX Runtime, or the reference evaluator when ORT has no float64
  kernel), selected initializers lifted to inputs so they can be perturbed;
* ``vmap``: a loop over the examples, results stacked at each output's axis;
* ``jvp``: central finite differences along the tangent;
* ``vjp`` / ``grad``: central finite differences of ``<u, f(x)>`` one coordinate at a time
  (a seeded sample of coordinates for large inputs; unchecked ones are masked out);
* every difference is Richardson-extrapolated (steps h and h/2: error O(h^4)), so a
  difference of differences (HVP) is still accurate to ~1e-8 in float64;
* compositions nest: ``vmap(grad(f))`` loops FD gradients, ``jvp(grad(f))`` is FD of FD.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnax.testing._chain import DERIVATIVES, Step
from onnax.testing._inputs import Feeds, convert_model_dtype, lift_initializers, np_dtype
from onnax.testing._models import ValidationInputError, runtime_inputs
from onnax.testing._runtime import Session, choose_backend


@dataclass
class Value:
    """Reference outputs at one level; ``checked`` masks coordinates a sample left out."""

    values: dict[str, np.ndarray]
    checked: dict[str, np.ndarray] = field(default_factory=dict)


Fn = Callable[[Feeds], Value]


def richardson(difference: Callable[[float], dict[str, np.ndarray]], eps: float) -> dict[str, np.ndarray]:
    """``(4 D(eps/2) - D(eps)) / 3`` for a central difference ``D(h)``: the h^2 error term
    cancels, leaving O(h^4)."""
    coarse, fine = difference(eps), difference(eps / 2)
    return {k: (4 * fine[k] - coarse[k]) / 3 for k in coarse}


def _is_float(a: np.ndarray) -> bool:
    return bool(np.issubdtype(a.dtype, np.floating))


class SourceFn:
    """The source model as a function of float64 feeds; picks float64 when it runs."""

    def __init__(self, source: onnx.ModelProto, lift: Sequence[str], backend: str | None) -> None:
        lifted = lift_initializers(source, lift)
        inits = {t.name: numpy_helper.to_array(t) for t in source.graph.initializer}
        self.defaults = {n: inits[n].astype(np.float64) for n in lift if n in inits}
        self.outputs = [o.name for o in source.graph.output]
        self.note = ""
        self.precision = "float64"
        self.backend = ""
        double = lifted
        for t in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16):
            double = convert_model_dtype(double, t, TensorProto.DOUBLE)
        self._candidates = [(double, "float64"), (lifted, "source precision")]
        self._backend = backend
        self._session: Session | None = None
        self._input_dtypes: dict[str, np.dtype] = {}

    def _open(self, feeds: Feeds) -> None:
        errors = []
        for model, precision in self._candidates:
            for backend in dict.fromkeys([choose_backend(model, self._backend), "ref"]):
                try:
                    sess = Session(model, backend)
                    dtypes = {v.name: np_dtype(v.type.tensor_type.elem_type) for v in runtime_inputs(model)}
                    sess.run(self._cast(feeds, dtypes))
                except Exception as err:
                    errors.append(f"{precision} on {backend}: {type(err).__name__}: {str(err)[:160]}")
                    continue
                self._session, self._input_dtypes, self.precision = sess, dtypes, precision
                self.backend = backend
                if precision != "float64":
                    self.note = "the source does not run in float64 (" + "; ".join(errors) + ")"
                return
        raise ValidationInputError(
            "the SOURCE model does not run, so no reference can be computed: "
            + "; ".join(errors)
            + ". Fix: pass the source model the chain started from, with valid inputs"
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
        res = self._session.run(self._cast(feeds, self._input_dtypes))
        return Value({k: v.astype(np.float64) if _is_float(v) else v for k, v in res.items()})


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
        out = Value({})
        for o, axis in zip(outputs, out_axes, strict=True):
            out.values[o] = np.stack([r.values[o] for r in results], axis=axis)
            if any(o in r.checked for r in results):
                masks = [r.checked.get(o, np.ones(r.values[o].shape, bool)) for r in results]
                out.checked[o] = np.stack(masks, axis=axis)
        return out

    return fn


def _jvp(prev: Fn, step: Step, tangents: list[str], results: list[str], eps: float) -> Fn:
    def fn(feeds: Feeds) -> Value:
        primal = {k: v for k, v in feeds.items() if k not in tangents}
        base = prev(primal)

        def difference(h: float) -> dict[str, np.ndarray]:
            plus, minus = dict(primal), dict(primal)
            for s, t in zip(step.inputs, tangents, strict=True):
                plus[s] = primal[s] + h * feeds[t]
                minus[s] = primal[s] - h * feeds[t]
            vp, vm = prev(plus), prev(minus)
            return {o: (vp.values[o] - vm.values[o]) / (2 * h) for o in step.outputs}

        d = richardson(difference, eps)
        out = Value(dict(base.values), dict(base.checked))
        for o, r in zip(step.outputs, results, strict=True):
            out.values[r] = d[o]
            if o in base.checked:
                out.checked[r] = base.checked[o]
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
    eps: float,
    max_coords: int | None,
    seed: int,
) -> Fn:
    def fn(feeds: Feeds) -> Value:
        primal = {k: v for k, v in feeds.items() if k not in cotangents}
        base = prev(primal)
        if step.transform == "grad":
            seeds = {step.outputs[0]: np.ones_like(base.values[step.outputs[0]])}
        else:
            seeds = {o: feeds[c] for o, c in zip(step.outputs, cotangents, strict=True)}
        out = Value(dict(base.values), dict(base.checked))
        for s, r in zip(step.inputs, results, strict=True):
            x = primal[s]
            g = np.zeros(x.shape, np.float64)
            coords = _coords(x.size, s, max_coords, seed)
            for idx in coords:

                def difference(
                    h: float, s: str = s, x: np.ndarray = x, idx: int = int(idx)
                ) -> dict[str, np.ndarray]:
                    plus, minus = dict(primal), dict(primal)
                    e = np.zeros(x.size)
                    e[idx] = h
                    plus[s] = x + e.reshape(x.shape)
                    minus[s] = x - e.reshape(x.shape)
                    vp, vm = prev(plus), prev(minus)
                    inner = sum(float(np.sum(u * (vp.values[o] - vm.values[o]))) for o, u in seeds.items())
                    return {"d": np.asarray(inner / (2 * h))}

                g.flat[idx] = float(richardson(difference, eps)["d"])
            out.values[r] = g
            if len(coords) < x.size:
                mask = np.zeros(x.shape, bool)
                mask.flat[coords] = True
                out.checked[r] = mask
        return out

    return fn


@dataclass
class Reference:
    """The reference function of a generated model, with what a report says about it."""

    fn: Fn
    defaults: Feeds  # lifted initializer values the feeds are completed with
    fd_outputs: set[str]
    eps: float
    source: SourceFn

    def describe(self) -> str:
        src = self.source
        text = f"source in {src.precision} on {src.backend or 'not run'}; "
        text += f"central differences, eps {self.eps:g}" if self.fd_outputs else "no derivatives"
        return text + (f"; note: {src.note}" if src.note else "")


def build_reference(
    source: onnx.ModelProto,
    generated: onnx.ModelProto,
    chain: list[Step],
    *,
    max_coords: int | None,
    seed: int,
    backend: str | None,
) -> Reference:
    """Replays ``chain`` on ``source`` as reference semantics, naming each level's inputs and
    outputs from ``generated`` (every transform keeps the earlier names first and appends)."""
    src_inputs = [v.name for v in runtime_inputs(source)]
    gen_inputs = [v.name for v in runtime_inputs(generated)]
    gen_outputs = [o.name for o in generated.graph.output]
    inputs, outputs = list(src_inputs), [o.name for o in source.graph.output]
    src_inits = {t.name for t in source.graph.initializer}
    lift = sorted({n for s in chain for n in s.inputs if n in src_inits})
    order = sum(1 for s in chain if s.transform in DERIVATIVES)
    src = SourceFn(source, lift, backend)
    # Extrapolated central differences (error ~h^4 + 1e-16/h): h = 1e-3 balances them for one
    # level; an outer difference of inner ones amplifies their ~1e-12 noise by 1/h, so nested
    # levels take h = 1e-2.
    eps = {0: 1e-3, 1: 1e-3, 2: 1e-2}.get(order, 3e-2)
    fn: Fn = src
    fd: set[str] = set()
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
            if set(step.in_axes) != set(inputs):
                raise ValidationInputError(
                    f"step {k} (vmap) maps inputs {sorted(step.in_axes)}, but the model at that step has "
                    f"runtime inputs {inputs}. Fix: pass the SOURCE model this chain started from"
                )
            fn = _vmap(fn, step, list(outputs))
            continue
        known = set(inputs) | set(lift)
        missing = [n for n in step.inputs if n not in known] + [o for o in step.outputs if o not in outputs]
        if missing:
            raise ValidationInputError(
                f"step {k} ({step.transform}) selects {missing}, which the model at that step lacks "
                f"(inputs {inputs}, outputs {outputs}). Fix: pass the SOURCE model this chain started from"
            )
        later_derivative = any(s.transform in DERIVATIVES for s in chain[k + 1 :])
        # Sampling coordinates is only sound at the outermost derivative: an outer finite
        # difference over a partly computed gradient would difference the unsampled zeros.
        coords = None if later_derivative else max_coords
        if step.transform == "jvp":
            tangents = take(gen_inputs, len(inputs), len(step.inputs), "tangent inputs")
            results = take(gen_outputs, len(outputs), len(step.outputs), "tangent outputs")
            fn = _jvp(fn, step, tangents, results, eps)
            inputs = inputs + tangents  # (new lists: closures hold the earlier ones)
        else:
            n_cot = len(step.outputs) if step.transform == "vjp" else 0
            cotangents = take(gen_inputs, len(inputs), n_cot, "cotangent inputs")
            results = take(gen_outputs, len(outputs), len(step.inputs), "derivative outputs")
            fn = _reverse(fn, step, cotangents, results, eps, coords, seed)
            inputs = inputs + cotangents
        outputs = outputs + results
        fd |= set(results)
    if inputs != gen_inputs or outputs != gen_outputs:
        raise ValidationInputError(
            f"replaying the recorded chain on the source gives inputs {inputs} and outputs {outputs}, "
            "but the "
            f"generated model has inputs {gen_inputs} and outputs {gen_outputs}. Fix: pass the SOURCE model "
            "this chain started from (and a generated model onnax wrote unchanged)"
        )
    return Reference(fn, src.defaults, fd, eps, src)
