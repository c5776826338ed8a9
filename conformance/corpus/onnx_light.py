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

References: ``vmap`` against a per-example loop of the source model in ONNX Runtime. The other
transforms are built, checked, run and timed, but have no reference: a finite-difference
reference needs float64, which ONNX Runtime has no Conv kernel for, and the ONNX reference
evaluator takes about 10 s per SqueezeNet run. VGG-19 (20 GFLOP per forward pass, 140 M
parameters) is left out as too heavy for this machine.

Entries are generated into ``conformance/corpus/.light/`` (not committed: the random weights
are tens of MB); ``python -m conformance.corpus`` generates them when missing.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
from onnx import numpy_helper

from conformance.corpus import artifacts, fd_refs

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
NO_FD = "ONNX Runtime has no float64 Conv kernel for a finite-difference reference"


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
            base = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
            batch = [
                {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
                for _ in range(VMAP_BATCH)
            ]
            arrays = fd_refs.loop_reference(model, base, batch)
            if all(np.all(np.isfinite(v)) for k, v in arrays.items() if "/out/" in k):
                break
        else:
            raise RuntimeError(f"{name}: the source model computes non-finite values")
        params = [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and t.dims]
        params = [p for p in params if not p.startswith("loss_w_")]
        outputs = [o.name for o in model.graph.output]
        manifest = artifacts.Manifest(
            name=name,
            description=f"{short} from onnx's backend test data (light), random weights, scalar loss added",
            origin=f"onnx {onnx.__version__} backend test data light_{short}.onnx, opset 9 upgraded to 18",
            reference="vmap: per-example loop in ONNX Runtime; others: none (built, checked, run, timed)",
            loss="loss",
            params=params,
            jvp_inputs=list(shapes),
            vjp_inputs=list(shapes),
            outputs=outputs,
            batch=VMAP_BATCH,
            quick=False,
            notes=[
                f"{len(model.graph.node)} nodes, {len(params)} parameter initializers, weight gain {gain}"
            ],
            reference_by_transform={t: NO_FD for t in artifacts.TRANSFORMS if t != "vmap"} | {"vmap": "loop"},
        )
        onnx_path, _, _ = artifacts.paths(name, root)
        onnx.save(model, onnx_path)
        artifacts.write_manifest(manifest, root)
        artifacts.write_arrays(name, arrays, root)
    return names


if __name__ == "__main__":
    for n in generate(Path(os.environ.get("ONNAX_CORPUS_LIGHT_DIR", CACHE_DIR))):
        print(f"ready {n}")
