"""``python -m conformance.corpus``: run the corpus and write ``conformance/corpus_results.md``.

Runs the committed entries (``conformance/corpus/models/``) and the onnx package's "light"
architectures (generated into ``conformance/corpus/.light/`` when missing, a minute or two;
``--no-light`` skips them). ``--regenerate`` first re-exports the JAX models and recomputes
their references (jax, flax, jax2onnx from requirements.txt) and rebuilds the graph network;
the PyTorch entries are regenerated separately (see ``conformance/corpus/torch_export.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from conformance.corpus import artifacts, onnx_light, report, runner

DEFAULT_MD = Path(__file__).resolve().parents[1] / "corpus_results.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.corpus", description=__doc__)
    parser.add_argument("names", nargs="*", help="committed corpus models to run (default: all)")
    parser.add_argument("--regenerate", action="store_true", help="re-export models and references first")
    parser.add_argument("--quick", action="store_true", help="only the models marked quick (the CI subset)")
    parser.add_argument("--no-light", action="store_true", help="skip the onnx backend 'light' models")
    parser.add_argument(
        "--validate", action="store_true", help="also run onnax.testing.validate on every result (slow)"
    )
    parser.add_argument("--md", type=Path, default=DEFAULT_MD, help="markdown output (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)

    if args.regenerate:
        from conformance.corpus import gnn, jax_export

        jax_export.generate()
        gnn.generate()
    names = args.names or artifacts.list_entries()
    manifests = {n: artifacts.read_manifest(artifacts.paths(n)[1]) for n in names}
    if args.quick:
        manifests = {n: m for n, m in manifests.items() if m.quick}

    def progress(name: str) -> None:
        print(f"ran {name}", file=sys.stderr)

    rows = runner.run_corpus(list(manifests), progress=progress, validate=args.validate)
    if not (args.no_light or args.quick or args.names):
        light = onnx_light.generate()
        rows += runner.run_corpus(light, root=onnx_light.CACHE_DIR, progress=progress, validate=args.validate)
        for n in light:
            manifests[n] = artifacts.read_manifest(artifacts.paths(n, onnx_light.CACHE_DIR)[1])
    args.md.write_text(report.markdown(rows, manifests))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    t = report.totals(rows)
    print(", ".join(f"{t[s]} {s}" for s in report.STATUSES))
    print(f"wrote {args.md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
