"""Wall time and verdict of ``onnax.testing.validate`` on every committed corpus model and
transform (``conformance/corpus/models``), on the corpus' stored inputs, as
``python -m conformance.corpus --validate`` runs it (max_coords 16).

    .venv/bin/python bench/validate_time.py [--names jax_mlp,torch_cnn] [--reference auto|fd]
        [--json out.json]

Every transformed model here matches the framework's float64 reference (the corpus' own
check), so any FAIL is a false alarm of validate. Uses only ``validate(source, generated,
inputs=..., max_coords=...)``, so an older onnax.testing can be timed the same way (put it
first on PYTHONPATH); ``--reference fd`` (newer versions) forces finite differences.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import onnx
    from onnax.testing import validate

    from conformance.corpus import artifacts, runner

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--names", default="", help="comma-separated corpus entries (default: all)")
    p.add_argument("--reference", choices=("auto", "fd"), default="auto")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    names = [n for n in a.names.split(",") if n] or artifacts.list_entries()
    extra: dict[str, Any] = {} if a.reference == "auto" else {"exact": False}
    rows: list[dict[str, Any]] = []
    for name in names:
        onnx_path, js, npz = artifacts.paths(name)
        m = artifacts.read_manifest(js)
        source = onnx.load(onnx_path)
        arrays = artifacts.read_arrays(npz)
        for transform in artifacts.TRANSFORMS:
            if not runner.selection(transform, m):
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    gen = runner.build(transform, source, m)
                    feeds = runner.feeds_for(transform, source, gen, m, arrays)
                except Exception as err:  # onnax unsupported: not validate's business
                    print(f"{name:24} {transform:10} not built: {type(err).__name__}", file=sys.stderr)
                    continue
                t0 = time.perf_counter()
                try:
                    report = validate(source, gen, inputs=feeds, max_coords=16, **extra)
                    verdict = "pass" if report.ok else f"FAIL at {report.failed_step}"
                    reference = report.reference
                except Exception as err:
                    verdict, reference = f"error {type(err).__name__}: {str(err)[:120]}", ""
                seconds = time.perf_counter() - t0
            rows.append(
                {
                    "model": name,
                    "transform": transform,
                    "verdict": verdict,
                    "seconds": seconds,
                    "reference": reference,
                }
            )
            print(f"{name:24} {transform:10} {seconds:7.2f} s  {verdict}  [{reference[:60]}]", flush=True)
    times = [float(r["seconds"]) for r in rows]
    fails = [r for r in rows if r["verdict"] != "pass"]
    print(
        f"{len(rows)} validations: {len(rows) - len(fails)} pass, {len(fails)} not (false alarms: every "
        f"model here matches its framework reference); wall time total {sum(times):.1f} s, median "
        f"{statistics.median(times):.2f} s, max {max(times):.1f} s"
    )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
