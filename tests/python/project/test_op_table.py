"""The op table (src/rules/op_table.h) walked entry by entry, and docs/ops.md generated from it.

Every entry must name an operator ONNX defines (a misspelt registration never matches a node),
batching rules must start at versions the operator has, and the rules must compose: a linear
op's transpose is only reached through JVP rules, so it needs a JVP rule (forward over reverse)
and, to batch per-example gradients, a batching rule or an ONNX schema for the per-example Scan.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnax
import onnx.defs
import onnxruntime as ort
import pytest
from onnax import _core
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[3]


def _schema_versions() -> dict[tuple[str, str], set[int]]:
    out: dict[tuple[str, str], set[int]] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        out.setdefault((s.domain, s.name), set()).add(s.since_version)
    return out


TABLE = _core.op_table()
VERSIONS = _schema_versions()


def _label(row: dict) -> str:
    return f"{row['domain']}::{row['op']}" if row["domain"] else row["op"]


def test_table_is_large_and_sorted() -> None:
    keys = [(r["domain"], r["op"]) for r in TABLE]
    assert keys == sorted(keys)
    assert len(keys) == len(set(keys))
    # (Counts as of this table: a sudden drop means a family was not registered.)
    assert sum(bool(r["batch_since"]) for r in TABLE) >= 150
    assert sum(r["jvp"] for r in TABLE) >= 135
    assert sum(r["transpose"] for r in TABLE) >= 45


@pytest.mark.parametrize("row", TABLE, ids=_label)
def test_entry_names_an_onnx_operator(row: dict) -> None:
    versions = VERSIONS.get((row["domain"], row["op"]))
    assert versions, f"{_label(row)} is in the op table but ONNX defines no such operator"
    for since in row["batch_since"]:
        # A batching rule starts at a version the operator has (or at 1: every version).
        assert since == 1 or since in versions, (
            f"{_label(row)}: batching rule from opset {since}, but its schemas start at {sorted(versions)}"
        )
    assert not (row["jvp"] and row["zero"]) or row["jvp_from_body"] is False


@pytest.mark.parametrize("row", [r for r in TABLE if r["transpose"]], ids=_label)
def test_linear_ops_compose(row: dict) -> None:
    assert row["jvp"], f"{_label(row)} has a transpose rule but no JVP rule: jvp(vjp(f)) would stop there"
    assert row["batch_since"] or (row["domain"], row["op"]) in VERSIONS


def test_docs_ops_md_is_generated_from_the_table() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ops_doc.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    text = (ROOT / "docs" / "ops.md").read_text()
    # Spot checks of rows against the table's meaning.
    assert "| ai.onnx | MatMul | 18+ | rule | rule | yes, linear |" in text
    assert "| ai.onnx | NonZero | 18+ | refused | zero | zero |" in text
    assert "| ai.onnx | LpNormalization | 18+ | rule | rule | yes |" in text


def test_lp_normalization_before_opset_22_is_batched_by_its_rule() -> None:
    # Walking the table found LpNormalization's batching rule registered from opset 11, a
    # version it never had: its opset-1 schema (live until opset 22) fell to the per-example
    # Scan. Now the rule covers every version; checked against per-example ONNX Runtime runs.
    node = helper.make_node("LpNormalization", ["x"], ["y"], axis=-1, p=2)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    batched = onnax.vmap(model)
    assert [n.op_type for n in batched.graph.node] == ["LpNormalization"]
    x = np.random.default_rng(0).standard_normal((5, 3, 4)).astype(np.float32)
    run = ort.InferenceSession(batched.SerializeToString(), providers=["CPUExecutionProvider"])
    one = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = run.run(None, {"x": x})[0]
    want = np.stack([one.run(None, {"x": xi})[0] for xi in x])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
