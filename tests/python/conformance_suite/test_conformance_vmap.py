"""onnax.vmap against the ONNX backend node tests (driver: ``conformance/backend_vmap.py``).

The whole node-test suite runs once per session (about 40 s on 2 cores; every case runs in a
worker process with a timeout, so a hang or a crash becomes a failed case instead of stalling
pytest).  Set ``ONNAX_CONFORMANCE_KEEP_EVERY=N`` to run a deterministic subset instead: every
model of the core operators below plus every N-th other model.

Asserted:

* no case is ``failed`` -- a wrong number or shape, a vmapped model that does not load or run, a
  crash, a hang, or an exception other than ``onnax.OnnaxError`` is an onnax bug.  An
  ``OnnaxError`` for an operator or an input combination vmap does not support is fine;
* every case of the core operators passes.  The only ``OnnaxError``\\s accepted there are the
  documented limits: a model below opset 13, or a batched *parameter* input listed in
  ``CORE_OPS`` (Reshape's ``shape``, a reduction's ``axes``, Conv's weights, ...).  So the
  ``first`` variant (data input batched, the parameters shared) must pass for every core model.
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

bv = importlib.import_module("conformance.backend_vmap")

# Core operator -> input positions that are parameters (shapes, axes, sizes, weights): batching
# one of them may raise OnnaxError by design; batching any other input must work.
CORE_OPS: dict[str, tuple[int, ...]] = {
    "Add": (),
    "Sub": (),
    "Mul": (),
    "Div": (),
    "Pow": (),
    "Relu": (),
    "LeakyRelu": (),
    "Sigmoid": (),
    "Tanh": (),
    "Exp": (),
    "Sqrt": (),
    "Gelu": (),
    "Clip": (),
    "Where": (),
    "Cast": (),
    "Equal": (),
    "Less": (),
    "Max": (),
    "Min": (),
    "Softmax": (),
    "LogSoftmax": (),
    "MatMul": (),
    "Gemm": (),
    "Einsum": (),
    "Reshape": (1,),
    "Transpose": (),
    "Concat": (),
    "Flatten": (),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Slice": (1, 2, 3, 4),
    "Split": (1,),
    "Expand": (1,),
    "Gather": (),
    "GatherElements": (),
    "GatherND": (),
    "Shape": (),
    "Conv": (1, 2),
    "MaxPool": (),
    "AveragePool": (),
    "LayerNormalization": (),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "ReduceMax": (1,),
    "ArgMax": (),
}

MIN_OPSET = 13  # older models are rejected with OnnaxError by design


def _describe(cases: list[dict], limit: int = 60) -> str:
    lines = [
        f"  {c['model']} [{c['variant']}] in_axes={c['in_axes']}: {c['status']}: {c['message']}"
        for c in cases[:limit]
    ]
    if len(cases) > limit:
        lines.append(f"  ... and {len(cases) - limit} more")
    return "\n".join(lines)


@pytest.fixture(scope="session")
def conformance(onnax) -> dict:  # the onnax fixture skips the module if onnax is missing
    keep_every = int(os.environ.get("ONNAX_CONFORMANCE_KEEP_EVERY", "1"))
    models = bv.discover_models(bv.ensure_node_data(verbose=False))
    if keep_every > 1:
        models = bv.select_subset(models, keep_every, set(CORE_OPS))
    result = bv.run_conformance(models, progress=False)
    summary = bv.summarize(result)
    print("\n" + bv.format_table(summary))
    return {"cases": result["cases"], "summary": summary}


def test_harness_ran_the_suite(conformance: dict) -> None:
    totals = conformance["summary"]["totals"]
    ran = totals["passed"] + totals["failed"] + totals["unsupported"]
    # Guard against a harness problem (e.g. every model skipped) passing silently.
    assert ran >= 100, totals
    assert totals["skipped"] < ran, totals


def test_no_failed_cases(conformance: dict) -> None:
    failed = [c for c in conformance["cases"] if c["status"] == "failed"]
    assert not failed, f"{len(failed)} failed vmap conformance cases:\n{_describe(failed)}"


@pytest.mark.parametrize("op", sorted(CORE_OPS))
def test_core_operator_passes(conformance: dict, op: str) -> None:
    params = set(CORE_OPS[op])
    cases = [c for c in conformance["cases"] if c["op"] == op]
    assert any(c["status"] == "passed" for c in cases), f"no passing case for {op}:\n{_describe(cases)}"
    bad = []
    for c in cases:
        if c["status"] in ("passed", "skipped"):
            continue
        if c["status"] == "unsupported":
            if (c.get("opset") or MIN_OPSET) < MIN_OPSET:
                continue
            if params & set(c.get("batched_inputs", [])):
                continue
        bad.append(c)
    assert not bad, f"{op}: cases that must pass but did not:\n{_describe(bad)}"
