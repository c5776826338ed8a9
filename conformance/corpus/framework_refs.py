"""Reference arrays from a framework's own transforms (JAX, PyTorch), in the corpus layout.

A framework adapter evaluates the model and its derivatives in float64 on numpy arrays; the
parameters are the selected ones (those found among the export's initializers, see
:mod:`conformance.corpus.params`), in the framework's layout. :func:`assemble` draws the
tangents and cotangents, calls the adapter, maps parameter-shaped results into the ONNX
layout and writes every transform's inputs and expected outputs (see
:mod:`conformance.corpus.artifacts`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from conformance.corpus import artifacts
from conformance.corpus.params import ParamSite

Arrays = list[np.ndarray]


class Framework(Protocol):
    """Float64 evaluations; ``xs`` are all runtime inputs, ``float_idx`` the float ones."""

    def outputs(self, ps: Arrays, xs: Arrays) -> Arrays: ...

    def grad(self, ps: Arrays, xs: Arrays) -> Arrays: ...  # d loss / d ps

    def jvp(self, ps: Arrays, xs: Arrays, float_idx: list[int], t_x: Arrays, t_p: Arrays) -> Arrays:
        """Tangents of every output."""
        ...

    def vjp(self, ps: Arrays, xs: Arrays, float_idx: list[int], cts: Arrays) -> tuple[Arrays, Arrays]:
        """Cotangents of the float inputs and of the parameters."""
        ...

    def hvp(self, ps: Arrays, xs: Arrays, v_p: Arrays) -> tuple[Arrays, Arrays]:
        """The loss gradient and its tangent along ``v_p``."""
        ...

    def batched(self, ps: Arrays, batch: Arrays) -> tuple[Arrays, Arrays]:
        """vmap over the leading axis: every output, and the loss gradient, per example."""
        ...


def assemble(
    fw: Framework,
    sites: Sequence[ParamSite],
    ps: Arrays,
    names: Sequence[str],
    xs32: Arrays,
    draw_batch: Callable[[], Arrays],
    output_names: Sequence[str],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Every transform's inputs and expected outputs; ``ps`` are the selected parameters."""
    arrays: dict[str, np.ndarray] = {}
    is_float = [np.issubdtype(x.dtype, np.floating) for x in xs32]
    float_idx = [k for k, fl in enumerate(is_float) if fl]
    xs = [x.astype(np.float64) if fl else x for x, fl in zip(xs32, is_float, strict=True)]
    # Only float inputs get tangents / cotangents.

    def to_onnx(values: Arrays) -> Arrays:
        return [s.to_onnx(v) for s, v in zip(sites, values, strict=True)]

    def put_feeds(t: str, values: Arrays) -> None:
        for n, v in zip(names, values, strict=True):
            arrays[f"{t}/feed/{n}"] = np.asarray(v)

    def put_outs(t: str, values: Arrays) -> None:
        for k, v in enumerate(values):
            arrays[f"{t}/out/{k}"] = np.asarray(v, dtype=np.float64)

    primal = fw.outputs(ps, xs)
    for t in ("grad", "jvp", "vjp", "jvp_grad"):
        put_feeds(t, xs32)
    put_outs("grad", [*primal, *to_onnx(fw.grad(ps, xs))])

    # jvp over the float runtime inputs, then the parameters; tangents of every output
    t_x = [rng.standard_normal(xs32[k].shape) for k in float_idx]
    t_p = [rng.standard_normal(p.shape) for p in ps]
    for k, v in zip(float_idx, t_x, strict=True):
        arrays[f"jvp/tangent/{names[k]}"] = v.astype(np.float32)
    for s, v in zip(sites, to_onnx(t_p), strict=True):
        arrays[f"jvp/tangent/{s.init}"] = v.astype(np.float32)
    put_outs("jvp", [*primal, *fw.jvp(ps, xs, float_idx, t_x, t_p)])

    # vjp: a cotangent on every output; cotangents of the float inputs and the parameters
    cts = [rng.standard_normal(np.shape(o)) for o in primal]
    for o, c in zip(output_names, cts, strict=True):
        arrays[f"vjp/cotangent/{o}"] = c.astype(np.float32)
    ct_x, ct_p = fw.vjp(ps, xs, float_idx, cts)
    put_outs("vjp", [*primal, *ct_x, *to_onnx(ct_p)])

    # jvp(grad): the gradient and its tangent along a parameter direction (an HVP)
    v_p = [rng.standard_normal(p.shape) for p in ps]
    for s, v in zip(sites, to_onnx(v_p), strict=True):
        arrays[f"jvp_grad/tangent/{s.init}"] = v.astype(np.float32)
    g, hvp = fw.hvp(ps, xs, v_p)
    put_outs("jvp_grad", [*primal, *to_onnx(g), *to_onnx(hvp)])

    # vmap and vmap(grad): every runtime input batched on a new leading axis
    batch32 = draw_batch()
    batch = [x.astype(np.float64) if fl else x for x, fl in zip(batch32, is_float, strict=True)]
    put_feeds("vmap", batch32)
    put_feeds("vmap_grad", batch32)
    outs, grads = fw.batched(ps, batch)
    put_outs("vmap", outs)
    per_example = [
        np.stack([s.to_onnx(x) for x in np.asarray(gv)]) for s, gv in zip(sites, grads, strict=True)
    ]
    put_outs("vmap_grad", [*outs, *per_example])
    return arrays


def manifest_for(
    spec: Any,
    sites: Sequence[ParamSite],
    missing: Sequence[str],
    names: Sequence[str],
    xs32: Sequence[np.ndarray],
    *,
    origin: str,
    reference: str,
    batch: int,
    quick: bool,
) -> artifacts.Manifest:
    """The manifest of an exported entry whose parameters were located at ``sites``: float
    runtime inputs and the parameters are differentiated; unlocated ones are noted."""
    float_inputs = [n for n, x in zip(names, xs32, strict=True) if np.issubdtype(x.dtype, np.floating)]
    params = [s.init for s in sites]
    notes = [f"parameters {', '.join(f'{s.path} -> {s.init}' for s in sites)}"]
    if missing:
        notes.append(f"parameters without an initializer of their own (not selected): {', '.join(missing)}")
    return artifacts.Manifest(
        name=spec.name,
        description=spec.description,
        origin=origin,
        reference=reference,
        loss=spec.outputs[0],
        params=params,
        jvp_inputs=[*float_inputs, *params],
        vjp_inputs=[*float_inputs, *params],
        outputs=list(spec.outputs),
        batch=batch,
        quick=quick,
        notes=notes,
    )
