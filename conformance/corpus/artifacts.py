"""On-disk layout of a corpus entry, shared by the generators and the runner.

Every entry is three files in ``conformance/corpus/models/``:

* ``<name>.onnx`` -- the exported (or built) model, unmodified;
* ``<name>.json`` -- the manifest (:class:`Manifest`): which runtime inputs and initializers
  each transform selects, the loss output, where the references come from;
* ``<name>.npz`` -- inputs and reference results for each transform, keyed
  ``<transform>/feed/<input>`` (runtime inputs of the source model), ``<transform>/tangent/<name>``
  and ``<transform>/cotangent/<output>`` (values for the inputs the transform appends, in
  selection order), and ``<transform>/out/<k>`` (the expected ``k``-th output of the transformed
  model; an output without a reference is left out).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

MODELS_DIR = Path(__file__).resolve().parent / "models"

# The transforms every entry is run through, in table order. "vmap_grad" is vmap(grad(f)) with
# every source runtime input batched; "jvp_grad" is jvp(grad(f)) over the parameters (an HVP).
TRANSFORMS = ("vmap", "grad", "jvp", "vjp", "vmap_grad", "jvp_grad")


@dataclass
class Manifest:
    name: str
    description: str
    origin: str  # exporter / builder with versions
    reference: str  # what computed the expected values
    loss: str  # rank-0 output for grad
    params: list[str]  # initializers grad / vjp / jvp_grad select
    jvp_inputs: list[str]  # selections of jvp and vjp (runtime inputs and/or initializers)
    vjp_inputs: list[str]
    outputs: list[str]  # source outputs jvp / vjp select
    batch: int  # vmap batch size
    quick: bool = False  # part of the default (CI) test subset
    notes: list[str] = field(default_factory=list)
    # Reference kind per transform when not the framework itself (e.g. "fd", "loop").
    reference_by_transform: dict[str, str] = field(default_factory=dict)
    # Allowed max error (see runner.max_error) per transform; the runner has defaults.
    tolerances: dict[str, float] = field(default_factory=dict)


def paths(name: str, root: Path | None = None) -> tuple[Path, Path, Path]:
    root = root or MODELS_DIR
    return root / f"{name}.onnx", root / f"{name}.json", root / f"{name}.npz"


def write_manifest(manifest: Manifest, root: Path | None = None) -> None:
    _, js, _ = paths(manifest.name, root)
    js.write_text(json.dumps(asdict(manifest), indent=1) + "\n")


def read_manifest(path: Path) -> Manifest:
    return Manifest(**json.loads(path.read_text()))


def write_arrays(name: str, arrays: Mapping[str, np.ndarray], root: Path | None = None) -> None:
    _, _, npz = paths(name, root)
    np.savez_compressed(npz, **{k: np.asarray(v) for k, v in arrays.items()})  # type: ignore[arg-type]


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def list_entries(root: Path | None = None) -> list[str]:
    return sorted(p.stem for p in (root or MODELS_DIR).glob("*.json"))
