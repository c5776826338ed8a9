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
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from conformance.corpus import artifacts, framework_refs
from conformance.corpus.jax_models import MODELS, JaxModel, example
from conformance.corpus.params import locate_params

BATCH_IN_MODEL = 4  # value of the symbolic batch "B" in the reference inputs
VMAP_BATCH = 3  # examples stacked on the new vmap axis
QUICK = {"jax_mlp", "jax_cnn", "jax_cnn_gap", "jax_transformer", "jax_embed_xent", "jax_gru", "jax_gru_scan"}


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

    def f(p_leaves: Arrays, *xs: Any) -> tuple[Any, ...]:
        m = nnx.merge(graphdef, jax.tree.unflatten(p_def, p_leaves), jax.tree.unflatten(r_def, r64))
        return tuple(spec.apply(m, *xs))

    return f, paths, leaves32


Arrays = list[Any]


class JaxFramework:
    """:class:`framework_refs.Framework` by jax.grad / jax.jvp / jax.vjp / jax.vmap."""

    def __init__(self, f: Callable[..., Any], all_params: Arrays, selected: list[int]) -> None:
        self.f, self.all_params, self.selected = f, all_params, selected

    def _f(self, ps: Sequence[Any], *xs: Any) -> tuple[Any, ...]:
        full = list(self.all_params)
        for i, v in zip(self.selected, ps, strict=True):
            full[i] = v
        return self.f(full, *xs)  # type: ignore[no-any-return]

    def _loss_grad(self, ps: Sequence[Any], *xs: Any) -> Any:
        import jax

        return jax.grad(lambda p, *a: self._f(p, *a)[0])(list(ps), *xs)

    def _of_selected(self, xs: Sequence[Any], float_idx: list[int]) -> Callable[..., Any]:
        def g(xf: Sequence[Any], ps: Sequence[Any]) -> tuple[Any, ...]:
            full = list(xs)
            for k, v in zip(float_idx, xf, strict=True):
                full[k] = v
            return self._f(ps, *full)

        return g

    def outputs(self, ps: Arrays, xs: Arrays) -> Arrays:
        return [np.asarray(o) for o in self._f(ps, *xs)]

    def grad(self, ps: Arrays, xs: Arrays) -> Arrays:
        return [np.asarray(g) for g in self._loss_grad(ps, *xs)]

    def jvp(self, ps: Arrays, xs: Arrays, float_idx: list[int], t_x: Arrays, t_p: Arrays) -> Arrays:
        import jax

        _, tan = jax.jvp(self._of_selected(xs, float_idx), ([xs[k] for k in float_idx], list(ps)), (t_x, t_p))
        return [np.asarray(t) for t in tan]

    def vjp(self, ps: Arrays, xs: Arrays, float_idx: list[int], cts: Arrays) -> tuple[Arrays, Arrays]:
        import jax

        _, pullback = jax.vjp(self._of_selected(xs, float_idx), [xs[k] for k in float_idx], list(ps))
        ct_x, ct_p = pullback(tuple(cts))
        return [np.asarray(c) for c in ct_x], [np.asarray(c) for c in ct_p]

    def hvp(self, ps: Arrays, xs: Arrays, v_p: Arrays) -> tuple[Arrays, Arrays]:
        import jax

        g, h = jax.jvp(lambda p: self._loss_grad(p, *xs), (list(ps),), (v_p,))
        return [np.asarray(x) for x in g], [np.asarray(x) for x in h]

    def batched(self, ps: Arrays, batch: Arrays) -> tuple[Arrays, Arrays]:
        import jax

        outs, grads = jax.vmap(lambda *a: (self._f(ps, *a), self._loss_grad(ps, *a)))(*batch)
        return [np.asarray(o) for o in outs], [np.asarray(g) for g in grads]


def references(
    spec: JaxModel, module: Any, proto: onnx.ModelProto, seed: int
) -> tuple[artifacts.Manifest, dict[str, np.ndarray]]:
    import jax

    jax.config.update("jax_enable_x64", True)

    f, paths, leaves32 = _pure(spec, module)
    sites, missing = locate_params(paths, leaves32, proto)
    p64 = [np.asarray(v, np.float64) for v in leaves32]
    fw = JaxFramework(f, p64, [s.index for s in sites])
    rng = np.random.default_rng(seed)
    xs32 = example(spec.inputs, BATCH_IN_MODEL, rng)

    def draw_batch() -> list[np.ndarray]:
        examples = [example(spec.inputs, BATCH_IN_MODEL, rng) for _ in range(VMAP_BATCH)]
        return [np.stack(col) for col in zip(*examples, strict=True)]

    names = [s.name for s in spec.inputs]
    chosen = [p64[s.index] for s in sites]
    arrays = framework_refs.assemble(fw, sites, chosen, names, xs32, draw_batch, spec.outputs, rng)
    versions = ", ".join(f"{p} {metadata.version(p)}" for p in ("jax", "flax", "jax2onnx"))
    manifest = framework_refs.manifest_for(
        spec,
        sites,
        missing,
        names,
        xs32,
        origin=f"jax2onnx export ({versions}), float32, opset 18",
        reference="JAX in float64: jax.vmap, jax.grad, jax.jvp, jax.vjp, jax.jvp(jax.grad)",
        batch=VMAP_BATCH,
        quick=spec.name in QUICK,
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
