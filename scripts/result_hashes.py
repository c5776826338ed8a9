"""Hash every transform result over the ONNX node tests and the committed models, for checking
that a refactor leaves outputs byte-identical.

Run it once with the old build and once with the new one, then compare the two JSON files:

    python scripts/result_hashes.py --out before.json        # old package on PYTHONPATH
    python scripts/result_hashes.py --out after.json
    python scripts/result_hashes.py --compare before.json after.json

Each entry is ``<model>:<transform>`` -> a SHA-256 prefix of the serialized result (metadata_props
stripped, so provenance changes do not count), or the error text when the transform refuses.
Transforms: vmap, jvp, vjp and vmap(vjp) with their default selections.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]


def _models(node_dir: Path) -> list[Path]:
    return [
        *sorted(node_dir.glob("*/model.onnx")),
        *sorted((ROOT / "tests/python/models").rglob("*.onnx")),
        *sorted((ROOT / "conformance/corpus/models").rglob("*.onnx")),
    ]


def hashes(node_dir: Path) -> dict[str, str]:
    import onnax

    transforms: dict[str, Callable[[onnx.ModelProto], onnx.ModelProto]] = {
        "vmap": lambda m: onnax.vmap(m),
        "jvp": lambda m: onnax.jvp(m),
        "vjp": lambda m: onnax.vjp(m),
        "vmapgrad": lambda m: onnax.vmap(onnax.vjp(m)),
    }
    out: dict[str, str] = {}
    for path in _models(node_dir):
        try:
            model = onnx.load(path)
        except Exception:  # (a few node tests hold models onnx cannot load)
            continue
        label = str(path.relative_to(node_dir) if path.is_relative_to(node_dir) else path.relative_to(ROOT))
        for name, fn in transforms.items():
            try:
                result = fn(model)
                del result.metadata_props[:]
                digest = hashlib.sha256(result.SerializeToString(deterministic=True)).hexdigest()[:16]
            except Exception as err:
                digest = f"ERR {type(err).__name__}: {str(err)[:300]}"
            out[f"{label}:{name}"] = digest
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the hashes here")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        for k in differ:
            print(f"{k}\n  before: {before.get(k)}\n  after:  {after.get(k)}")
        print(f"{len(before)} / {len(after)} results, {len(differ)} differ")
        return 1 if differ else 0
    if not args.out:
        parser.error("give --out FILE or --compare BEFORE AFTER")
    warnings.simplefilter("ignore")
    sys.path.insert(0, str(ROOT))
    from conformance import backend_vmap

    with tempfile.TemporaryDirectory() as tmp:
        backend_vmap.generate_node_data(Path(tmp))
        result = hashes(Path(tmp))
    args.out.write_text(json.dumps(result, indent=0, sort_keys=True))
    print(f"{len(result)} results, {sum(not v.startswith('ERR') for v in result.values())} transformed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
