"""``python -m conformance.corpus``: run the corpus and write ``conformance/corpus_results.md``.

``--regenerate`` first re-exports the models and recomputes the references (needs jax, flax
and jax2onnx; the GNN needs only onnx); without it the committed artifacts are used.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from conformance.corpus import artifacts, report, runner

DEFAULT_MD = Path(__file__).resolve().parents[1] / "corpus_results.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.corpus", description=__doc__)
    parser.add_argument("names", nargs="*", help="corpus models to run (default: all)")
    parser.add_argument("--regenerate", action="store_true", help="re-export models and references first")
    parser.add_argument("--quick", action="store_true", help="only the models marked quick (the CI subset)")
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
    rows = runner.run_corpus(list(manifests), progress=lambda n: print(f"ran {n}", file=sys.stderr))
    args.md.write_text(report.markdown(rows, manifests))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    t = report.totals(rows)
    print(", ".join(f"{t[s]} {s}" for s in report.STATUSES))
    print(f"wrote {args.md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
