"""Seed inputs for the libFuzzer target fuzz/onnax_fuzz.cc: real models behind its 8-byte header.

Sources: the repository's own small models (tests/python/models/**, conformance/corpus/models,
under 64 KB each) with every entry point of the target, and the ONNX backend node tests (one
model per operator form, as conformance/ generates them from the installed onnx package) with
vmap, jvp and vjp plus one other entry point each. The seeds are written at run time
(scripts/fuzz.sh does, into build-fuzz/seeds/); only the minimized corpus a run merges
(fuzz/corpus/) and crash inputs (fuzz/regressions/) are committed.

    .venv/bin/python fuzz/make_corpus.py --out build-fuzz/seeds [--dict build-fuzz/onnx.dict]

--dict also writes a libFuzzer dictionary: operator, attribute and input names of every ONNX
schema, so byte-level mutations splice in names the checks and rules dispatch on.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIRS = [ROOT / "tests" / "python" / "models", ROOT / "conformance" / "corpus" / "models"]
MAX_MODEL_BYTES = 64 * 1024

# Entry points, as numbered in fuzz/onnax_fuzz.cc (enum Entry).
ENTRY_COUNT = 18
VMAP, JVP, VJP = 0, 1, 2


def header(
    entry: int, flags: int = 0, axis: int = 3, inputs: int = 0xFF, outputs: int = 0xFF, *params: int
) -> bytes:
    """The target's header: entry, flags, in_axis (3: axis 0), input and output masks, 3 params."""
    rest = [*params, 0, 0, 0][:3]
    return bytes([entry, flags, axis, inputs, outputs, *rest])


def repository_headers() -> Iterator[bytes]:
    """Every entry point with default options, and the selection forms of the main transforms."""
    for entry in range(ENTRY_COUNT):
        yield header(entry)
    yield header(VMAP, 0x20, 3, 0xFF, 0xFF, 0x33)  # per-input axes
    yield header(VMAP, 0x40, 3, 0x01, 0xFF, 0x03)  # by name: the first input
    yield header(VMAP, 0x10, 3, 0xFF, 0xFF, 0x06)  # out_axes
    yield header(JVP, 0x03, 3, 0x01, 0x01)
    yield header(VJP, 0x03, 3, 0x01, 0x01)


def repository_models() -> Iterator[tuple[str, bytes]]:
    for folder in MODEL_DIRS:
        for path in sorted(folder.rglob("*.onnx")):
            data = path.read_bytes()
            if len(data) <= MAX_MODEL_BYTES:
                yield path.stem, data


def node_test_models() -> Iterator[tuple[str, bytes]]:
    """The backend node tests' models (conformance/'s cache, generated from onnx if need be)."""
    sys.path.insert(0, str(ROOT))
    from conformance.backend_vmap import ensure_node_data

    for path in sorted(ensure_node_data(verbose=False).glob("*/model.onnx")):
        yield path.parent.name, path.read_bytes()


def dictionary() -> list[str]:
    """Every ai.onnx operator's name and its attribute, input and output names, and domains."""
    import onnx.defs

    words = {"ai.onnx", "ai.onnx.ml", "com.microsoft", "onnax.stop_gradient", "onnax.transforms"}
    for schema in onnx.defs.get_all_schemas_with_history():
        words.add(schema.name)
        words.update(schema.attributes)
        words.update(p.name for p in [*schema.inputs, *schema.outputs])
    return sorted(w for w in words if w.isascii() and w.isprintable() and '"' not in w and "\\" not in w)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the seed files (created)")
    ap.add_argument("--dict", type=Path, help="also write a libFuzzer dictionary here")
    ap.add_argument("--no-node-tests", action="store_true", help="only the repository's own models")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    count = 0

    def write(name: str, data: bytes) -> None:
        nonlocal count
        # Content-addressed, as libFuzzer names corpus files: rerunning adds nothing twice.
        digest = hashlib.sha1(data).hexdigest()[:16]
        (args.out / f"{name[:48]}-{digest}").write_bytes(data)
        count += 1

    for name, model in repository_models():
        for h in repository_headers():
            write(f"{name}-e{h[0]}", h + model)
    if not args.no_node_tests:
        for name, model in node_test_models():
            other = 3 + int(hashlib.sha1(name.encode()).hexdigest(), 16) % (ENTRY_COUNT - 3)
            for entry in (VMAP, JVP, VJP, other):
                write(f"{name}-e{entry}", header(entry) + model)
    if args.dict:
        args.dict.write_text("".join(f'"{w}"\n' for w in dictionary()))
    print(f"make_corpus: {count} seeds in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
