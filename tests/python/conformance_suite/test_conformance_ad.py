"""onnax.jvp / onnax.vjp against the ONNX backend node tests (driver: ``conformance/backend_ad.py``).

The whole node-test suite runs once per session (about 15-25 s on 2 cores; every model runs in a
worker process with a timeout, so a hang or a crash becomes a failed case instead of stalling
pytest).  Set ``ONNAX_CONFORMANCE_KEEP_EVERY=N`` to run a deterministic subset instead: every
model of the core operators below plus every N-th other model.

jvp is checked against central finite differences of the original model (kinks and jumps at the
test data are masked, see the driver), vjp with the dot-product test against the jvp model.

Asserted:

* no case is ``failed`` -- a tangent or cotangent that disagrees with the oracle, a derived model
  that fails ``onnx.checker`` or does not load or run, changed primal outputs, a crash, a hang, or
  an exception other than ``onnax.OnnaxError`` is an onnax bug.  An ``OnnaxError`` (e.g. an
  operator without a derivative rule) is fine;
* every core operator below has at least one passing jvp and one passing vjp case, so a broken
  oracle or harness (everything skipped or unsupported) cannot pass silently.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

bad = importlib.import_module("conformance.backend_ad")

CORE_OPS = (
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Log",
    "Sqrt",
    "Softmax",
    "LogSoftmax",
    "MatMul",
    "Gemm",
    "Transpose",
    "Concat",
    "Reshape",
    "Gather",
    "Conv",
    "LayerNormalization",
    "ReduceSum",
    "ReduceMean",
)


def _describe(cases: list[dict], limit: int = 60) -> str:
    lines = [f"  {c['model']} [{c['transform']}]: {c['status']}: {c['message'][:500]}" for c in cases[:limit]]
    if len(cases) > limit:
        lines.append(f"  ... and {len(cases) - limit} more")
    return "\n".join(lines)


@pytest.fixture(scope="session")
def conformance(onnax) -> dict:  # the onnax fixture skips the module if onnax is missing
    keep_every = int(os.environ.get("ONNAX_CONFORMANCE_KEEP_EVERY", "1"))
    data_dir = importlib.import_module("conformance.backend_vmap").ensure_node_data(verbose=False)
    models = bad.discover_models(data_dir)
    if keep_every > 1:
        models = bad.select_subset(models, keep_every, set(CORE_OPS))
    result = bad.run_conformance(models, progress=False)
    summary = bad.summarize(result)
    print("\n" + bad.format_table(summary))
    return {"cases": result["cases"], "summary": summary}


def test_harness_ran_the_suite(conformance: dict) -> None:
    totals = conformance["summary"]["totals"]
    for transform in bad.TRANSFORMS:
        t = totals[transform]
        checked = t["passed"] + t["failed"]
        # Guard against a harness or oracle problem (e.g. everything skipped) passing silently.
        assert checked >= 50, (transform, totals)
        assert t["skipped"] < checked, (transform, totals)


def test_no_failed_cases(conformance: dict) -> None:
    failed = [c for c in conformance["cases"] if c["status"] == "failed"]
    assert not failed, f"{len(failed)} failed jvp/vjp conformance cases:\n{_describe(failed)}"


@pytest.mark.parametrize("transform", bad.TRANSFORMS)
@pytest.mark.parametrize("op", CORE_OPS)
def test_core_operator_passes(conformance: dict, op: str, transform: str) -> None:
    cases = [c for c in conformance["cases"] if c["op"] == op and c["transform"] == transform]
    assert any(c["status"] == "passed" for c in cases), (
        f"no passing {transform} case for {op}:\n{_describe(cases)}"
    )
