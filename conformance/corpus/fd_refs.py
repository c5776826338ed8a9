"""References without a framework: float64 finite differences and per-example loops.

For models built here (the graph network) or shipped without their framework (none of these
has JAX or PyTorch code to run), the expected values come from the existing oracles of the
test suite (``tests/python/oracles/ad_oracle.py``, ``tests/python/oracles/vmap_oracle.py``): the float32 model
is widened to float64 (``as_double``), the selected initializers are lifted to inputs, and

* ``vmap``: the float64 model run once per example, stacked;
* ``grad`` / ``vjp``: central differences coordinate by coordinate of the loss (for vjp, of
  ``sum_o <u_o, f_o>``);
* ``jvp``: central differences along the tangent direction;
* ``vmap_grad``: per-example finite-difference gradients, stacked;
* ``jvp_grad``: central differences along the direction of the finite-difference gradient.

The results are written in the layout of :mod:`conformance.corpus.artifacts`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

_TESTS = Path(__file__).resolve().parents[2] / "tests" / "python"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from oracles import ad_oracle  # noqa: E402  (the shared oracle code lives with the tests)

EPS = 1e-6  # float64 central-difference step (relative to unit-scale inputs)
EPS_OUTER = 1e-4  # step of the difference of differences (HVP)

Feeds = dict[str, np.ndarray]


class Oracle:
    """The float64 twin of a model with ``selected`` initializers lifted to runtime inputs."""

    def __init__(self, model: onnx.ModelProto, selected: Sequence[str]) -> None:
        self.model = ad_oracle.lift_initializers(ad_oracle.as_double(model), list(selected))
        self.inits = ad_oracle.initializer_values(ad_oracle.as_double(model))
        self.outputs = [o.name for o in model.graph.output]

    def feeds(self, base: Mapping[str, np.ndarray]) -> Feeds:
        """Runtime feeds of the twin: ``base`` widened, lifted initializers at stored values."""
        out: Feeds = {}
        for vi in ad_oracle.runtime_inputs(self.model):
            if vi.name in base:
                v = np.asarray(base[vi.name])
                out[vi.name] = v.astype(np.float64) if np.issubdtype(v.dtype, np.floating) else v
            else:
                out[vi.name] = self.inits[vi.name]
        return out

    def run(self, feeds: Feeds) -> list[np.ndarray]:
        res = ad_oracle.run(self.model, feeds)
        return [res[o] for o in self.outputs]

    def directional(
        self, feeds: Feeds, direction: Mapping[str, np.ndarray], eps: float = EPS
    ) -> list[np.ndarray]:
        d = ad_oracle.fd_direction(self.model, feeds, dict(direction), self.outputs, eps)
        return [d[o] for o in self.outputs]

    def gradient(
        self, feeds: Feeds, scalar: Callable[[list[np.ndarray]], float], names: Sequence[str]
    ) -> list[np.ndarray]:
        """Coordinate-wise central differences of ``scalar(outputs)`` for each of ``names``."""
        grads = []
        for name in names:
            base = feeds[name]
            g = np.zeros(base.shape)
            flat = g.reshape(-1)
            for i in range(base.size):
                e = np.zeros(base.size)
                e[i] = 1.0
                plus, minus = dict(feeds), dict(feeds)
                plus[name] = base + EPS * e.reshape(base.shape)
                minus[name] = base - EPS * e.reshape(base.shape)
                flat[i] = (scalar(self.run(plus)) - scalar(self.run(minus))) / (2 * EPS)
            grads.append(g)
        return grads


def write_references(
    model: onnx.ModelProto,
    loss: str,
    params: Sequence[str],
    jvp_inputs: Sequence[str],
    vjp_inputs: Sequence[str],
    base: Feeds,
    batch: Sequence[Feeds],
    seed: int,
) -> dict[str, np.ndarray]:
    """Inputs and expected outputs of every transform (float64 FD and loops)."""
    rng = np.random.default_rng(seed)
    outputs = [o.name for o in model.graph.output]
    li = outputs.index(loss)
    arrays: dict[str, np.ndarray] = {}
    oracle = Oracle(model, sorted({*params, *jvp_inputs, *vjp_inputs}))
    feeds = oracle.feeds(base)
    primal = oracle.run(feeds)

    def put(t: str, src: Feeds, outs: Sequence[np.ndarray]) -> None:
        for n, v in src.items():
            arrays[f"{t}/feed/{n}"] = np.asarray(v)
        for k, v in enumerate(outs):
            arrays[f"{t}/out/{k}"] = np.asarray(v, dtype=np.float64)

    def loss_of(outs: list[np.ndarray]) -> float:
        return float(outs[li])

    grads = oracle.gradient(feeds, loss_of, params)
    put("grad", base, [*primal, *grads])

    tangents = {n: rng.standard_normal(feeds[n].shape) for n in jvp_inputs}
    for n, v in tangents.items():
        arrays[f"jvp/tangent/{n}"] = v.astype(np.float32)
    put("jvp", base, [*primal, *oracle.directional(feeds, tangents)])

    cts = [rng.standard_normal(np.shape(p)) for p in primal]
    for o, c in zip(outputs, cts, strict=True):
        arrays[f"vjp/cotangent/{o}"] = c.astype(np.float32)

    def pairing(outs: list[np.ndarray]) -> float:
        return float(sum(np.sum(c * o) for c, o in zip(cts, outs, strict=True)))

    put("vjp", base, [*primal, *oracle.gradient(feeds, pairing, vjp_inputs)])

    hvp_dir = {n: rng.standard_normal(feeds[n].shape) for n in params}
    for n, d in hvp_dir.items():
        arrays[f"jvp_grad/tangent/{n}"] = d.astype(np.float32)
    plus, minus = dict(feeds), dict(feeds)
    for n, d in hvp_dir.items():
        plus[n] = feeds[n] + EPS_OUTER * d
        minus[n] = feeds[n] - EPS_OUTER * d
    hvp = [
        (gp - gm) / (2 * EPS_OUTER)
        for gp, gm in zip(
            oracle.gradient(plus, loss_of, params), oracle.gradient(minus, loss_of, params), strict=True
        )
    ]
    put("jvp_grad", base, [*primal, *grads, *hvp])

    per_example = [oracle.run(oracle.feeds(ex)) for ex in batch]
    stacked = {n: np.stack([ex[n] for ex in batch]) for n in batch[0]}
    put("vmap", stacked, [np.stack(col) for col in zip(*per_example, strict=True)])
    per_grad = []
    for ex in batch:
        f = oracle.feeds(ex)
        per_grad.append([*oracle.run(f), *oracle.gradient(f, loss_of, params)])
    put("vmap_grad", stacked, [np.stack(col) for col in zip(*per_grad, strict=True)])
    return arrays


def loop_reference(model: onnx.ModelProto, base: Feeds, batch: Sequence[Feeds]) -> dict[str, np.ndarray]:
    """Inputs for every transform, and only the vmap reference: the model itself run once per
    example (its own dtype; for models whose float64 twin cannot run). Tangents and
    cotangents are not stored (the runner draws them for cases without a reference)."""
    arrays: dict[str, np.ndarray] = {}
    stacked = {n: np.stack([ex[n] for ex in batch]) for n in batch[0]}
    for t in artifacts_transforms():
        for n, v in (stacked if t.startswith("vmap") else base).items():
            arrays[f"{t}/feed/{n}"] = np.asarray(v)
    per_example = [ad_oracle.run(model, ex) for ex in batch]
    for k, o in enumerate(model.graph.output):
        arrays[f"vmap/out/{k}"] = np.stack([res[o.name] for res in per_example]).astype(np.float64)
    return arrays


def artifacts_transforms() -> tuple[str, ...]:
    from conformance.corpus.artifacts import TRANSFORMS

    return TRANSFORMS
