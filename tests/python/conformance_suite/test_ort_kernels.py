"""onnax's results run in ONNX Runtime wherever their source does, in float32, float64 and
float16 (driver: ``conformance/ort_kernels.py``).

Every single-op ONNX backend node test with a float32 input, and its float64 and float16
copies, is transformed by vmap, jvp and vjp wherever ONNX Runtime runs the source; each result
must load and run in ONNX Runtime (no missing kernel: a rule that gathers positions in int64,
say). The node tests run in four shards (by the first letter of the test name) so the workers
share them.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

kernels = importlib.import_module("conformance.ort_kernels")

SHARDS = ["^test_[a-c]", "^test_[d-l]", "^test_[m-r]", "^test_[s-z]"]


@pytest.mark.parametrize("shard", SHARDS)
def test_results_run_where_their_source_runs(shard: str) -> None:
    outcomes = kernels.sweep(shard)
    failed = [f"{o.test} ({o.op}, {o.dtype}) {o.transform}: {o.problem}" for o in outcomes if o.problem]
    assert not failed, "\n".join(failed)
    # The sweep must have run something in each dtype ONNX Runtime runs the sources in.
    dtypes = {o.dtype for o in outcomes}
    assert "float32" in dtypes and len(outcomes) > 100, (shard, len(outcomes), dtypes)


def test_the_sweep_reports_a_missing_kernel() -> None:
    # The detector itself: a model ONNX Runtime has no kernel for (DepthToSpace on int64, what
    # an int64 gather of positions would need) is reported as such.
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    graph = h.make_graph(
        [h.make_node("DepthToSpace", ["x"], ["y"], blocksize=2)],
        "g",
        [h.make_tensor_value_info("x", T.INT64, [1, 4, 2, 2])],
        [h.make_tensor_value_info("y", T.INT64, [1, 1, 4, 4])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    problem = kernels._runs(model)
    assert kernels.MISSING_KERNEL.search(problem), problem
