"""Corpus references for models that come as ONNX graphs only (the onnx package's light
architectures: AlexNet, DenseNet-121, Inception, ResNet-50, ...): the graph interpreted op by op
in JAX float64 by :mod:`onnax.testing._jax_reference` (the interpreter ``onnax validate`` uses
as its exact reference; each op there is checked against ONNX Runtime), then ``jax.grad``,
``jax.jvp``, ``jax.vjp`` and ``jax.vmap`` of it: the independent float64 answers onnax's
float32 graphs are measured against. ONNX Runtime has no float64 Conv kernel, so neither the
framework nor float64 finite differences can give these derivatives.

The corpus generator compares the interpreted forward pass with ONNX Runtime's before it
trusts the derivatives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnax.testing._jax_reference import OPS, interpret
from onnax.testing._jax_reference import _widen as _widen
from onnx import numpy_helper

__all__ = ["OPS", "KinkCheck", "Selected", "interpret", "references"]


def _initializers(model: onnx.ModelProto, widen: bool) -> dict[str, np.ndarray]:
    """Stored initializer values, float ones widened to float64 when ``widen``."""
    return {
        t.name: _widen(numpy_helper.to_array(t)) if widen else numpy_helper.to_array(t)
        for t in model.graph.initializer
    }


class Selected:
    """The interpreted graph as ``run(params, inputs)`` over the selected initializers and
    runtime inputs (by position), with the loss gradient over the parameters."""

    def __init__(
        self,
        model: onnx.ModelProto,
        loss: str,
        params: Sequence[str],
        inputs: Sequence[str],
        widen: bool = True,
    ) -> None:
        self.f = interpret(model, widen)
        self.params, self.inputs = list(params), list(inputs)
        self.loss = [o.name for o in model.graph.output].index(loss)
        stored = _initializers(model, widen)
        self.initial = [stored[p] for p in params]  # the parameters' stored values

    def run(self, ps: Sequence[Any], xs: Sequence[Any]) -> list[Any]:
        return self.f({**dict(zip(self.params, ps, strict=True)), **dict(zip(self.inputs, xs, strict=True))})

    def loss_grad(self, ps: Sequence[Any], xs: Sequence[Any]) -> Any:
        import jax

        return jax.grad(lambda p: self.run(p, xs)[self.loss])(list(ps))


class KinkCheck:
    """Whether an example sits on a kink: ReLU inputs and max-pool windows so close to a tie
    that float32 rounding in the tested graph may take the other branch than the float64
    reference, and the derivatives differ by O(1) somewhere. Such an example's float64 loss
    gradient jumps under a perturbation of the input far below float32 rounding (relative
    ``rel``), where a smooth point's moves by about ``rel`` times its curvature."""

    def __init__(
        self, model: onnx.ModelProto, loss: str, params: Sequence[str], inputs: Sequence[str]
    ) -> None:
        import jax

        jax.config.update("jax_enable_x64", True)
        selected = Selected(model, loss, params, inputs)
        self.params, self.inputs = selected.initial, selected.inputs
        self.grad = jax.jit(selected.loss_grad)

    def __call__(
        self, example: Mapping[str, np.ndarray], rel: float = 1e-6, tol: float = 1e-5, directions: int = 4
    ) -> bool:
        # (Several random directions: one may move along a tie instead of across it.)
        xs = [np.asarray(example[n], np.float64) for n in self.inputs]
        rng = np.random.default_rng(0)
        g0 = [np.asarray(g) for g in self.grad(self.params, xs)]
        scale = max(float(np.max(np.abs(g))) for g in g0)
        for _ in range(directions):
            moved = [x * (1 + rel * rng.standard_normal(x.shape)) for x in xs]
            g1 = [np.asarray(g) for g in self.grad(self.params, moved)]
            change = max(float(np.max(np.abs(a - b))) for a, b in zip(g1, g0, strict=True))
            if change > tol * max(scale, 1e-3):
                return True
        return False


def references(
    model: onnx.ModelProto,
    loss: str,
    params: Sequence[str],
    inputs: Sequence[str],
    base: Mapping[str, np.ndarray],
    batch: Sequence[Mapping[str, np.ndarray]],
    seed: int,
) -> tuple[dict[str, np.ndarray], dict[str, list[np.ndarray]]]:
    """Every transform's inputs and expected outputs (corpus layout, see artifacts): the loss
    gradient over ``params``; jvp and vjp over the runtime ``inputs`` (every output); the HVP
    along a parameter direction; vmap and vmap(grad) over ``batch``. Expected values are
    stored in float32 (they are compared at float32 tolerances; the largest models' per-example
    gradients run to hundreds of MB).

    Also every transform's outputs as JAX computes them in the model's own float32: how far
    those land from the float64 answers is the error float32 itself allows (deep networks with
    random weights are ill-conditioned in the input: a float32 jvp through ResNet-50 may be
    off by 1e-3 in any implementation)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    outputs = [o.name for o in model.graph.output]
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    feeds32 = [np.asarray(base[n]) for n in inputs]
    stacked = {n: np.stack([ex[n] for ex in batch]) for n in inputs}
    # (Directions drawn in float32, the values the onnax graphs are fed.)
    t_x = [rng.standard_normal(x.shape).astype(np.float32) for x in feeds32]
    cts: list[np.ndarray] | None = None
    v_p = [rng.standard_normal(shapes[p]).astype(np.float32) for p in params]

    def evaluate(widen: bool) -> dict[str, list[np.ndarray]]:
        """Every transform's outputs, in float64 (widen) or in the model's float32."""
        nonlocal cts
        selected = Selected(model, loss, params, inputs, widen)
        run, loss_grad = selected.run, selected.loss_grad
        cast = _widen if widen else (lambda a: a)

        # Compiled (op-by-op dispatch of a large network's derivatives takes minutes), with the
        # parameters as arguments: jit would embed closed-over arrays as constants.
        p0 = selected.initial
        x0 = [cast(x) for x in feeds32]
        like = [np.asarray(x).dtype for x in x0]
        out: dict[str, list[np.ndarray]] = {}
        primal = jax.jit(run)(p0, x0)
        out["grad"] = [*primal, *jax.jit(loss_grad)(p0, x0)]
        ts = [t.astype(d) for t, d in zip(t_x, like, strict=True)]
        _, tangents = jax.jit(lambda ps, xs, ts: jax.jvp(lambda *a: tuple(run(ps, a)), tuple(xs), tuple(ts)))(
            p0, x0, ts
        )
        out["jvp"] = [*primal, *tangents]
        if cts is None:
            cts = [rng.standard_normal(np.shape(o)).astype(np.float32) for o in primal]
        c = [ct.astype(np.asarray(o).dtype) for ct, o in zip(cts, primal, strict=True)]
        pullback = jax.jit(lambda ps, xs, c: jax.vjp(lambda *a: tuple(run(ps, a)), *xs)[1](tuple(c)))
        out["vjp"] = [*primal, *pullback(p0, x0, c)]
        vs = [v.astype(np.asarray(p).dtype) for v, p in zip(v_p, p0, strict=True)]
        g, hvp = jax.jit(lambda ps, xs, vs: jax.jvp(lambda p: loss_grad(p, xs), (ps,), (vs,)))(p0, x0, vs)
        out["jvp_grad"] = [*primal, *g, *hvp]
        xs_b = [cast(stacked[n]) for n in inputs]
        outs_b = jax.jit(jax.vmap(lambda xs, ps: tuple(run(ps, xs)), in_axes=(0, None)))(xs_b, p0)
        out["vmap"] = list(outs_b)
        grads_b = jax.jit(jax.vmap(lambda xs, ps: loss_grad(ps, xs), in_axes=(0, None)))(xs_b, p0)
        out["vmap_grad"] = [*outs_b, *grads_b]
        return {t: [np.asarray(v, np.float64) for v in vals] for t, vals in out.items()}

    exact = evaluate(widen=True)
    for t, vals in exact.items():
        for n, v in (stacked if t.startswith("vmap") else base).items():
            arrays[f"{t}/feed/{n}"] = np.asarray(v)
        for k, v in enumerate(vals):
            arrays[f"{t}/out/{k}"] = v.astype(np.float32)
    for n, v in zip(inputs, t_x, strict=True):
        arrays[f"jvp/tangent/{n}"] = v.astype(np.float32)
    assert cts is not None
    for o, c in zip(outputs, cts, strict=True):
        arrays[f"vjp/cotangent/{o}"] = c.astype(np.float32)
    for n, v in zip(params, v_p, strict=True):
        arrays[f"jvp_grad/tangent/{n}"] = v.astype(np.float32)

    return arrays, evaluate(widen=False)
