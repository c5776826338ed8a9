"""Exports the JAX models with jax2onnx and computes their references with JAX itself.

Run ``python -m conformance.corpus.jax_export`` (needs jax, flax, jax2onnx from
requirements.txt). The models are exported in float32, exactly as a user would; the references
are computed by ``jax.vmap`` / ``jax.grad`` / ``jax.jvp`` / ``jax.vjp`` in float64 (the same
float32 parameter and input values, widened), so they are the exact answers the float32 ONNX
results are measured against.

jax2onnx stores the parameters as initializers under generated names (``const_0``,
``kernel_oih_0``, ...), sometimes transposed (Conv kernels HWIO -> OIHW) or reshaped (attention
kernels ``(in, heads, head_dim)`` -> ``(in, heads * head_dim)``). Each parameter is located by
value, trying every axis permutation followed by a reshape; the reference derivatives are mapped
through the same permutation and reshape.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from conformance.corpus import artifacts
from conformance.corpus.jax_models import MODELS, JaxModel, example

BATCH_IN_MODEL = 4  # value of the symbolic batch "B" in the reference inputs
VMAP_BATCH = 3  # examples stacked on the new vmap axis
QUICK = {"jax_mlp", "jax_cnn", "jax_cnn_gap", "jax_transformer", "jax_embed_xent", "jax_gru"}


@dataclass(frozen=True)
class ParamSite:
    """Where a JAX parameter lives in the ONNX file: ``init = reshape(transpose(p, perm))``."""

    index: int  # position among the JAX parameter leaves
    path: str  # JAX tree path, for the manifest
    init: str
    perm: tuple[int, ...]
    shape: tuple[int, ...]

    def to_onnx(self, value: Any) -> np.ndarray:
        return np.transpose(np.asarray(value), self.perm).reshape(self.shape)


def locate_params(
    paths: Sequence[str], leaves: Sequence[np.ndarray], proto: onnx.ModelProto
) -> tuple[list[ParamSite], list[str]]:
    """Finds each parameter's initializer; returns the sites and the paths not found."""
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    sites: list[ParamSite] = []
    missing: list[str] = []
    for i, (path, leaf) in enumerate(zip(paths, leaves, strict=True)):
        leaf = np.asarray(leaf)
        found = []
        for name, val in inits.items():
            if val.size != leaf.size or val.dtype != leaf.dtype:
                continue
            for perm in itertools.permutations(range(leaf.ndim)):
                if np.array_equal(np.transpose(leaf, perm).reshape(val.shape), val):
                    found.append(ParamSite(i, path, name, perm, tuple(val.shape)))
                    break
        if len(found) > 1:
            raise RuntimeError(f"parameter {path} matches several initializers: {[f.init for f in found]}")
        if found:
            sites.append(found[0])
        else:
            missing.append(path)
    return sites, missing


def export(spec: JaxModel) -> tuple[onnx.ModelProto, Any]:
    import jax
    from jax2onnx import to_onnx

    module = spec.build()
    (b,) = jax.export.symbolic_shape("B")
    shapes = [
        jax.ShapeDtypeStruct(tuple(b if d == "B" else d for d in s.shape), np.dtype(s.dtype))
        for s in spec.inputs
    ]
    proto = to_onnx(
        lambda *xs: spec.apply(module, *xs),
        shapes,
        model_name=spec.name,
        opset=18,
        input_names=[s.name for s in spec.inputs],
        output_names=list(spec.outputs),
    )
    return proto, module


def _pure(spec: JaxModel, module: Any) -> tuple[Callable[..., Any], list[str], list[np.ndarray]]:
    """``f(param_leaves, *inputs)`` in float64, the parameter paths and float32 leaves."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, params, rest = nnx.split(module, nnx.Param, ...)  # type: ignore[misc]
    with_path, p_def = jax.tree_util.tree_flatten_with_path(params)
    paths = [jax.tree_util.keystr(k) for k, _ in with_path]
    leaves32 = [np.asarray(v) for _, v in with_path]
    r_leaves, r_def = jax.tree.flatten(rest)
    r64 = [jnp.asarray(v, jnp.float64) if jnp.issubdtype(v.dtype, jnp.floating) else v for v in r_leaves]

    def f(p_leaves: list[Any], *xs: Any) -> tuple[Any, ...]:
        m = nnx.merge(graphdef, jax.tree.unflatten(p_def, p_leaves), jax.tree.unflatten(r_def, r64))
        return tuple(spec.apply(m, *xs))

    return f, paths, leaves32


def references(
    spec: JaxModel, module: Any, proto: onnx.ModelProto, seed: int
) -> tuple[artifacts.Manifest, dict[str, np.ndarray]]:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    f, paths, leaves32 = _pure(spec, module)
    sites, missing = locate_params(paths, leaves32, proto)
    p64 = [jnp.asarray(v, jnp.float64) for v in leaves32]
    rng = np.random.default_rng(seed)
    xs32 = example(spec.inputs, BATCH_IN_MODEL, rng)
    is_float = [np.issubdtype(x.dtype, np.floating) for x in xs32]
    xs = [jnp.asarray(x, jnp.float64) if fl else jnp.asarray(x) for x, fl in zip(xs32, is_float, strict=True)]
    names = [s.name for s in spec.inputs]
    float_inputs = [n for n, fl in zip(names, is_float, strict=True) if fl]
    sel = [s.index for s in sites]
    arrays: dict[str, np.ndarray] = {}

    def put_feeds(t: str, values: Sequence[np.ndarray]) -> None:
        for n, v in zip(names, values, strict=True):
            arrays[f"{t}/feed/{n}"] = np.asarray(v)

    def put_outs(t: str, values: Sequence[Any]) -> None:
        for k, v in enumerate(values):
            arrays[f"{t}/out/{k}"] = np.asarray(v, dtype=np.float64)

    def with_params(chosen: Sequence[Any]) -> list[Any]:
        full = list(p64)
        for i, v in zip(sel, chosen, strict=True):
            full[i] = v
        return full

    primal = f(p64, *xs)
    loss_grad = jax.grad(lambda ps, *a: f(with_params(ps), *a)[0])
    chosen = [p64[i] for i in sel]
    grads = loss_grad(chosen, *xs)

    # forward and grad
    for t in ("grad", "jvp", "vjp", "jvp_grad"):
        put_feeds(t, xs32)
    put_outs("grad", [*primal, *(s.to_onnx(g) for s, g in zip(sites, grads, strict=True))])

    # jvp over the float runtime inputs, then the parameters; tangents of every output
    float_idx = [k for k, fl in enumerate(is_float) if fl]
    t_x = [rng.standard_normal(xs32[k].shape) for k in float_idx]
    t_p = [rng.standard_normal(p64[i].shape) for i in sel]

    def of_selected(xf: Sequence[Any], ps: Sequence[Any]) -> tuple[Any, ...]:
        full_x = list(xs)
        for k, v in zip(float_idx, xf, strict=True):
            full_x[k] = v
        return f(with_params(ps), *full_x)

    prim, tan = jax.jvp(of_selected, ([xs[k] for k in float_idx], chosen), (t_x, t_p))
    for n, v in zip(float_inputs, t_x, strict=True):
        arrays[f"jvp/tangent/{n}"] = v.astype(np.float32)
    for s, v in zip(sites, t_p, strict=True):
        arrays[f"jvp/tangent/{s.init}"] = s.to_onnx(v).astype(np.float32)
    put_outs("jvp", [*prim, *tan])

    # vjp: cotangents on every output, cotangents of the same selection as jvp
    prim, pullback = jax.vjp(of_selected, [xs[k] for k in float_idx], chosen)
    cts = [rng.standard_normal(np.shape(o)) for o in prim]
    ct_x, ct_p = pullback(tuple(jnp.asarray(c) for c in cts))
    for o, c in zip(spec.outputs, cts, strict=True):
        arrays[f"vjp/cotangent/{o}"] = np.asarray(c, dtype=np.float32)
    put_outs("vjp", [*prim, *ct_x, *(s.to_onnx(c) for s, c in zip(sites, ct_p, strict=True))])

    # jvp(grad): the gradient and its tangent along a parameter direction (an HVP)
    v_p = [rng.standard_normal(p64[i].shape) for i in sel]
    g, hvp = jax.jvp(lambda ps: loss_grad(ps, *xs), (chosen,), (v_p,))
    for s, v in zip(sites, v_p, strict=True):
        arrays[f"jvp_grad/tangent/{s.init}"] = s.to_onnx(v).astype(np.float32)
    put_outs(
        "jvp_grad",
        [
            *primal,
            *(s.to_onnx(x) for s, x in zip(sites, g, strict=True)),
            *(s.to_onnx(x) for s, x in zip(sites, hvp, strict=True)),
        ],
    )

    # vmap and vmap(grad): every runtime input batched on a new leading axis
    batch32 = [
        np.stack(col)
        for col in zip(*(example(spec.inputs, BATCH_IN_MODEL, rng) for _ in range(VMAP_BATCH)), strict=True)
    ]
    batch = [
        jnp.asarray(x, jnp.float64) if fl else jnp.asarray(x) for x, fl in zip(batch32, is_float, strict=True)
    ]
    put_feeds("vmap", batch32)
    put_feeds("vmap_grad", batch32)
    put_outs("vmap", jax.vmap(lambda *a: f(p64, *a))(*batch))
    per_example = jax.vmap(lambda *a: (f(p64, *a), loss_grad(chosen, *a)))(*batch)
    outs, gs = per_example
    put_outs(
        "vmap_grad",
        [*outs, *(np.stack([s.to_onnx(x) for x in np.asarray(gv)]) for s, gv in zip(sites, gs, strict=True))],
    )

    versions = ", ".join(f"{p} {metadata.version(p)}" for p in ("jax", "flax", "jax2onnx"))
    notes = [f"parameters {', '.join(f'{s.path} -> {s.init}' for s in sites)}"]
    if missing:
        notes.append(f"parameters without an initializer of their own (not selected): {', '.join(missing)}")
    manifest = artifacts.Manifest(
        name=spec.name,
        description=spec.description,
        origin=f"jax2onnx export ({versions}), float32, opset 18",
        reference="JAX in float64: jax.vmap, jax.grad, jax.jvp, jax.vjp, jax.jvp(jax.grad)",
        loss=spec.outputs[0],
        params=[s.init for s in sites],
        jvp_inputs=[*float_inputs, *(s.init for s in sites)],
        vjp_inputs=[*float_inputs, *(s.init for s in sites)],
        outputs=list(spec.outputs),
        batch=VMAP_BATCH,
        quick=spec.name in QUICK,
        notes=notes,
    )
    return manifest, arrays


def strip_bad_value_info(proto: onnx.ModelProto) -> str | None:
    """Removes the export's value_info when ONNX's strict shape inference contradicts it.

    jax2onnx 0.17.1 declares some intermediates of a Conv-BatchNorm-ReLU chain in the JAX
    (NHWC) layout although the ONNX graph computes them in NCHW, so the export itself fails
    ``onnx.checker`` full check. The declarations are only hints; the stored model drops them
    and the manifest says so.
    """
    try:
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
        return None
    except Exception as err:
        first = str(err).strip().splitlines()
        detail = first[1] if len(first) > 1 else first[0]
    del proto.graph.value_info[:]
    return (
        "exporter quirk: the export's value_info contradicts shape inference "
        f"({detail.strip()}); value_info removed"
    )


def generate(names: Sequence[str] | None = None, seed: int = 0, root: Path | None = None) -> list[str]:
    root = root or artifacts.MODELS_DIR
    root.mkdir(exist_ok=True)
    done = []
    # Export every model first: references switch JAX to float64 for the rest of the process.
    exported = [(spec, *export(spec)) for spec in MODELS if not names or spec.name in names]
    for spec, proto, module in exported:
        quirk = strip_bad_value_info(proto)
        manifest, arrays = references(spec, module, proto, seed)
        if quirk:
            manifest.notes.append(quirk)
        onnx_path, _, _ = artifacts.paths(spec.name, root)
        onnx.save(proto, onnx_path)
        artifacts.write_manifest(manifest, root)
        artifacts.write_arrays(spec.name, arrays, root)
        done.append(spec.name)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="models to export (default: all)")
    args = parser.parse_args(argv)
    for name in generate(args.names):
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
