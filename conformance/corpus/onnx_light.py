"""The real-architecture models shipped with the ``onnx`` package, made usable for the corpus.

``onnx/backend/test/data/light/`` holds AlexNet, DenseNet-121, Inception v1/v2, ResNet-50,
ShuffleNet, SqueezeNet, VGG-19 and ZFNet-512 as graphs whose weights are ``ConstantOfShape``
fills (the full-weight versions under ``data/real/`` are downloads, which this machine cannot
make). With every weight one constant all channels of a layer are equal and the softmax output
does not depend on the input, so each entry here is the shipped graph with

* the opset upgraded from 9 to 18 (``onnx.version_converter``; onnax accepts 13-28),
* each ``ConstantOfShape`` weight replaced by a seeded random initializer (scale
  ``gain / sqrt(fan_in)``, the gain halved until the forward pass is finite; BatchNorm
  variances uniform in [0.5, 1.5]), and initializers removed from the graph inputs (IR 3
  listed them),
* a scalar ``loss`` output (``ad_oracle.scalarize``: a fixed random weighting of the outputs).

References: the graph evaluated op by op by JAX in float64 (:mod:`conformance.corpus.onnx_jax`),
then ``jax.grad`` / ``jax.jvp`` / ``jax.vjp`` / ``jax.vmap`` of it; the interpreted forward pass
must first match ONNX Runtime's. (ONNX Runtime has no float64 Conv kernel, so float64 finite
differences cannot serve, and the ONNX reference evaluator takes about 10 s per SqueezeNet
run.) jvp and vjp select the image input; grad, jvp(grad) and vmap(grad) every parameter.
VGG-19 (20 GFLOP per forward pass, 140 M parameters) is left out as too heavy for this machine.

Entries are generated into ``conformance/corpus/.light/`` (not committed: the random weights
are tens of MB); ``python -m conformance.corpus`` generates them when missing.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
from onnx import numpy_helper

from conformance.corpus import artifacts, fd_refs, onnx_jax, runner

LIGHT_DIR = Path(onnx.__file__).resolve().parent / "backend" / "test" / "data" / "light"
CACHE_DIR = Path(__file__).resolve().parent / ".light"
MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "zfnet512",
)
VMAP_BATCH = 2
# Interpreted forward pass vs ONNX Runtime's float32 one (the runner's max error).
FORWARD_TOL = 1e-4
FLOOR_FACTOR = 4.0


def materialize(model: onnx.ModelProto, seed: int, gain: float = 1.0) -> onnx.ModelProto:
    """Opset 18, random initializers for the ConstantOfShape weights, a scalar loss."""
    m = onnx.version_converter.convert_version(model, 18)
    m.ir_version = 10
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in m.graph.initializer}
    # BatchNormalization variances must stay positive.
    variances = {n.input[4] for n in m.graph.node if n.op_type == "BatchNormalization"}
    keep = []
    for node in m.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            if node.output[0] in variances:
                w = rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
            else:
                w = (gain * rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float32)
            m.graph.initializer.append(numpy_helper.from_array(w, name=node.output[0]))
        else:
            keep.append(node)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    used = {i for n in m.graph.node for i in n.input}
    live = [t for t in m.graph.initializer if t.name in used]
    del m.graph.initializer[:]
    m.graph.initializer.extend(live)
    names = {t.name for t in m.graph.initializer}
    runtime = [v for v in m.graph.input if v.name not in names and v.name in used]
    del m.graph.input[:]
    m.graph.input.extend(runtime)
    scalar = fd_refs.ad_oracle.scalarize(m, {}, seed, name="loss")
    onnx.checker.check_model(scalar, full_check=True)
    return scalar


def _example(shapes: dict[str, list[int]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def _off_kinks(
    example: dict[str, np.ndarray], on_kink: onnx_jax.KinkCheck, draw: Callable[[], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    for _ in range(10):
        if not on_kink(example):
            return example
        example = draw()
    raise RuntimeError("ten examples in a row sit on a kink; loosen onnx_jax.KinkCheck")


def generate(root: Path = CACHE_DIR, seed: int = 0) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    names = []
    for short in MODELS:
        name = f"onnx_light_{short}"
        names.append(name)
        if all(p.exists() for p in artifacts.paths(name, root)):
            continue
        source = onnx.load(LIGHT_DIR / f"light_{short}.onnx")
        # The shipped BatchNorm statistics with random weights can overflow float32 through
        # deep residual stacks; shrink the weights until the forward pass stays finite.
        for gain in (1.0, 0.5, 0.25, 0.125, 0.0625):
            model = materialize(source, seed, gain)
            rng = np.random.default_rng(seed + 1)
            shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
            draw = functools.partial(_example, shapes, rng)
            base = draw()
            batch = [draw() for _ in range(VMAP_BATCH)]
            arrays = fd_refs.loop_reference(model, base, batch)
            if all(np.all(np.isfinite(v)) for k, v in arrays.items() if "/out/" in k):
                break
        else:
            raise RuntimeError(f"{name}: the source model computes non-finite values")
        params = [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and t.dims]
        params = [p for p in params if not p.startswith("loss_w_")]
        outputs = [o.name for o in model.graph.output]
        # Examples on a kink (a ReLU input or a max-pool tie within float32 rounding) are drawn
        # again: there the float32 graph and the float64 reference may take different branches.
        on_kink = onnx_jax.KinkCheck(model, "loss", params, list(shapes))
        drawn = [base, *batch]
        base, *batch = [_off_kinks(ex, on_kink, draw) for ex in drawn]
        redrawn = sum(a is not b for a, b in zip([base, *batch], drawn, strict=True))
        runner_defaults = runner.DEFAULT_TOL["float32"]
        arrays, in_float32 = onnx_jax.references(model, "loss", params, list(shapes), base, batch, seed + 2)
        # The interpreter must reproduce ONNX Runtime's forward pass before its derivatives count.
        forward = fd_refs.ad_oracle.run(model, base)
        interpreted = [arrays[f"grad/out/{k}"] for k in range(len(outputs))]
        expected = {k: np.asarray(forward[o], np.float64) for k, o in enumerate(outputs)}
        err, where = runner.max_error(interpreted, expected, [range(len(outputs))])
        if err > FORWARD_TOL:
            raise RuntimeError(f"{name}: the JAX interpretation of {where} is off by {err:.3g}")
        manifest = artifacts.Manifest(
            name=name,
            description=f"{short} from onnx's backend test data (light), random weights, scalar loss added",
            origin=f"onnx {onnx.__version__} backend test data light_{short}.onnx, opset 9 upgraded to 18",
            reference="JAX in float64 on the graph interpreted op by op: jax.vmap, jax.grad, jax.jvp, "
            "jax.vjp, jax.jvp(jax.grad)",
            loss="loss",
            params=params,
            jvp_inputs=list(shapes),
            vjp_inputs=list(shapes),
            outputs=outputs,
            batch=VMAP_BATCH,
            quick=False,
            notes=[
                f"{len(model.graph.node)} nodes, {len(params)} parameter initializers, weight gain {gain}",
                f"{redrawn} of {len(drawn)} examples drawn again for sitting on a kink",
            ],
        )
        # The runner's float32 defaults, or 4x the error JAX itself makes in float32 (measured as
        # the runner measures) where the model's conditioning allows no better.
        floors = {}
        for t in artifacts.TRANSFORMS:
            expected = {int(k.rsplit("/", 1)[1]): v for k, v in arrays.items() if k.startswith(f"{t}/out/")}
            groups = runner.output_groups(t, len(outputs), manifest)
            floors[t] = runner.max_error(in_float32[t], expected, groups)[0]
        manifest.tolerances = {
            t: max(runner_defaults[t], FLOOR_FACTOR * floors[t]) for t in artifacts.TRANSFORMS
        }
        manifest.notes.append(
            "JAX's own float32 error against these references: "
            + ", ".join(f"{t} {v:.2g}" for t, v in floors.items())
        )
        onnx_path, _, _ = artifacts.paths(name, root)
        onnx.save(model, onnx_path)
        artifacts.write_manifest(manifest, root)
        artifacts.write_arrays(name, arrays, root)
    return names


if __name__ == "__main__":
    for n in generate(Path(os.environ.get("ONNAX_CORPUS_LIGHT_DIR", CACHE_DIR))):
        print(f"ready {n}")
