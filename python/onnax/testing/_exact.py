"""The exact reference: the recorded transform chain applied by JAX itself (``jax.vmap``,
``jax.jvp``, ``jax.vjp``) to the SOURCE graph interpreted op by op in float64
(:mod:`onnax.testing._jax_reference`). Used by ``validate`` whenever JAX is importable and the
interpreter covers every op of the source; nothing here comes from onnax."""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from onnax.testing._chain import Step

Env = dict[str, Any]
Feeds = Mapping[str, np.ndarray]
Level = Callable[[Env], Env]


def jax_available() -> bool:
    try:
        import jax  # noqa: F401
    except Exception:
        return False
    return True


def _jax() -> Any:
    import jax

    return jax


# Float initializers at least this large are passed to the compiled function as arguments:
# closed over, XLA would embed them as constants and spend minutes constant-folding a large
# network (ResNet-50) before running it.
ARGUMENT_SIZE = 64


def source_level(source: onnx.ModelProto, widen: bool = True) -> tuple[Level, dict[str, np.ndarray]]:
    """The interpreted source as a level, and its large float initializers (float64; in the
    source's own precision when not ``widen``)."""
    from onnax.testing._jax_reference import interpret

    f = interpret(source, widen=widen)
    names = [o.name for o in source.graph.output]
    stored: Mapping[str, np.ndarray] = getattr(f, "stored", {})  # (widened once, shared)
    weights = {
        t.name: stored[t.name]
        for t in source.graph.initializer
        if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)
        and int(np.prod(t.dims)) >= ARGUMENT_SIZE
        and t.name in stored
    }

    def level(env: Env) -> Env:
        return dict(zip(names, f(env), strict=True))

    return level, weights


def vmap_level(prev: Level, step: Step, outputs: Sequence[str]) -> Level:
    out_axes = step.out_axes if len(step.out_axes) == len(outputs) else [step.out_axes[0]] * len(outputs)
    axes_out = dict(zip(outputs, out_axes, strict=True))

    def level(env: Env) -> Env:
        axes_in = {k: step.in_axes.get(k) for k in env}
        return dict(_jax().vmap(prev, in_axes=(axes_in,), out_axes=axes_out)(env))

    return level


def jvp_level(prev: Level, step: Step, tangents: Sequence[str], results: Sequence[str]) -> Level:
    def level(env: Env) -> Env:
        primal = {k: v for k, v in env.items() if k not in tangents}
        xs = tuple(primal[s] for s in step.inputs)
        ts = tuple(env[t].astype(x.dtype) for t, x in zip(tangents, xs, strict=True))

        def h(*moved: Any) -> Env:
            return prev({**primal, **dict(zip(step.inputs, moved, strict=True))})

        out, tan = _jax().jvp(h, xs, ts)
        res = dict(out)
        for o, r in zip(step.outputs, results, strict=True):
            res[r] = tan[o]
        return res

    return level


def reverse_level(prev: Level, step: Step, cotangents: Sequence[str], results: Sequence[str]) -> Level:
    jnp = _jax().numpy

    def level(env: Env) -> Env:
        primal = {k: v for k, v in env.items() if k not in cotangents}
        xs = tuple(primal[s] for s in step.inputs)

        def h(*moved: Any) -> tuple[tuple[Any, ...], Env]:
            full = prev({**primal, **dict(zip(step.inputs, moved, strict=True))})
            return tuple(full[o] for o in step.outputs), full

        selected, pullback, full = _jax().vjp(h, *xs, has_aux=True)
        if step.transform == "grad":
            cts = tuple(jnp.ones_like(selected[0]) for _ in selected[:1])
        else:
            cts = tuple(
                jnp.asarray(env[c]).astype(s.dtype) for c, s in zip(cotangents, selected, strict=True)
            )
        grads = pullback(cts)
        res = dict(full)
        res.update(zip(results, grads, strict=True))
        return res

    return level


# Compiled references kept across ``validate`` calls in one process (the corpus validates six
# transforms of each model: grad's compiled reference serves vmap(grad) too), keyed by
# everything that decides what they compute: the source's bytes, the replayed chain with its
# names, the static (integer) inputs' values and the traced inputs' shapes and dtypes.
_COMPILED: collections.OrderedDict[bytes, Any] = collections.OrderedDict()
_COMPILED_MAX = 4


def source_digest(source: onnx.ModelProto) -> bytes:
    return hashlib.sha256(source.SerializeToString()).digest()


class ExactFn:
    """The composed level as ``feeds -> outputs`` (NumPy float64), compiled with ``jax.jit``
    once per set of integer inputs (those stay NumPy, so shapes and indices built from them are
    static), under ``jax.enable_x64``. ``key`` names what ``level`` computes (source digest and
    chain): a function compiled under the same key and shapes by an earlier instance is reused."""

    def __init__(
        self, level: Level, batched: set[str], weights: Mapping[str, np.ndarray], key: bytes = b""
    ) -> None:
        self._level = level
        self._batched = batched  # inputs some vmap step batches: they must be traced arguments
        self._weights = dict(weights)  # large initializers, passed as arguments (not constants)
        self._cache: dict[bytes, Any] = {}
        self._key = key

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        jax = _jax()
        with jax.enable_x64(True):
            traced = {k: v for k, v in self._weights.items() if k not in feeds}
            traced.update(
                {k: v for k, v in feeds.items() if np.issubdtype(v.dtype, np.floating) or k in self._batched}
            )
            static = {k: v for k, v in feeds.items() if k not in traced}
            key = b"".join(k.encode() + v.dtype.str.encode() + v.tobytes() for k, v in sorted(static.items()))
            key += repr(sorted((k, v.shape, v.dtype.str) for k, v in traced.items())).encode()
            fn = self._cache.get(key)
            shared = self._key + b"\0" + key if self._key else b""
            if fn is None and shared in _COMPILED:
                fn = self._cache[key] = _COMPILED[shared]
                _COMPILED.move_to_end(shared)
            if fn is None:
                level = self._level

                def run(args: Env) -> Env:
                    return level({**args, **static})

                fn = self._cache[key] = jax.jit(run)
                if shared:
                    _COMPILED[shared] = fn
                    while len(_COMPILED) > _COMPILED_MAX:
                        _COMPILED.popitem(last=False)
            out = fn({k: jax.numpy.asarray(v) for k, v in traced.items()})
            return {k: np.asarray(v) for k, v in out.items()}


class LoopFn:
    """An outermost ``vmap`` step replayed as a loop over the examples, each through ``inner``
    (one compiled function run once per example: vmap's definition, without compiling the
    batched function as well)."""

    def __init__(self, inner: Callable[[Feeds], dict[str, np.ndarray]], step: Step, outputs: Sequence[str]):
        self._inner = inner
        self._step = step
        self._outputs = list(outputs)

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        step = self._step
        out_axes = (
            step.out_axes
            if len(step.out_axes) == len(self._outputs)
            else [step.out_axes[0]] * len(self._outputs)
        )
        batched = {n: a for n, a in step.in_axes.items() if a is not None and n in feeds}
        sizes = {feeds[n].shape[a] for n, a in batched.items()}
        if len(sizes) != 1:
            raise ValueError(f"batched inputs disagree on the batch size: {sizes}")
        results = []
        for i in range(sizes.pop()):
            ex = dict(feeds)
            for n, a in batched.items():
                ex[n] = np.take(feeds[n], i, axis=a)
            results.append(self._inner(ex))
        return {
            o: results[0][o] if axis is None else np.stack([r[o] for r in results], axis=axis)
            for o, axis in zip(self._outputs, out_axes, strict=True)
            if o in results[0]
        }


def compose(
    source: onnx.ModelProto,
    ops: Sequence[tuple[str, tuple[Any, ...]]],
    outer_vmaps: Sequence[tuple[Step, list[str]]],
    batched: set[str],
    widen: bool,
) -> Callable[[Feeds], dict[str, np.ndarray]]:
    """The exact reference from the recorded level applications (``("vmap" | "jvp" |
    "reverse", args)``, innermost first) and the outermost vmaps (loops); ``widen=False``
    interprets the source in its own precision (the same chain, rounded as a float32 model)."""
    level, weights = source_level(source, widen)
    makers: dict[str, Callable[..., Level]] = {"vmap": vmap_level, "jvp": jvp_level, "reverse": reverse_level}
    for kind, args in ops:
        level = makers[kind](level, *args)
    key = source_digest(source) + repr([(kind, args) for kind, args in ops]).encode() + repr(widen).encode()
    fn: Callable[[Feeds], dict[str, np.ndarray]] = ExactFn(level, batched, weights, key=key)
    for step, outputs in outer_vmaps:
        fn = LoopFn(fn, step, outputs)
    return fn
