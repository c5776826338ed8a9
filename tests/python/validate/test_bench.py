"""``onnax.testing.bench`` on the README model and its transforms: the JSON report carries the
seed's benchmark fields (versions, CPU, settings, dtypes, op counts before/after ORT
optimization, single-sample init/first run, median of per-repeat means) and the outputs agree
with the float64 reference. No timing thresholds: timings only have to be positive."""

from __future__ import annotations

import json

import pytest
from oracles.validate_models import linear_loss

testing = pytest.importorskip("onnax.testing")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def report():
    return testing.bench(linear_loss(), in_axes=(0, None), warmup=2, iterations=5, repeats=3, batch=4)


def test_report_fields(report) -> None:
    json.dumps(report)  # JSON-ready
    assert set(report["models"]) == {"forward", "vmap", "grad", "jvp", "vjp", "vmap_grad", "hvp"}
    assert report["versions"]["onnxruntime"] == "1.31.1"
    assert {"onnax", "onnx", "numpy", "python"} <= set(report["versions"])
    assert report["cpu"]["model"] and report["cpu"]["logical_cores"] >= 1
    assert report["source_revision"]
    assert report["settings"] == {
        "warmup": 2,
        "iterations": 5,
        "repeats": 3,
        "intra_op_threads": 1,
        "batch": 4,
        "seed": 0,
        "graph_optimization_level": "ORT_ENABLE_ALL",
        "reference": True,
    }
    for name, entry in report["models"].items():
        assert "error" not in entry, (name, entry.get("error"))
        lat = entry["latency_s"]
        assert lat["session_init"] > 0 and lat["first_run"] > 0
        assert len(lat["repeat_means"]) == 3
        means = sorted(lat["repeat_means"])
        assert lat["warm_median_of_means"] == means[1]
        assert entry["op_counts"]["exported"] and entry["op_counts"]["optimized"]
        assert all(i["dtype"] == "float32" for i in entry["inputs"])
        assert all(o["dtype"] == "float32" for o in entry["outputs"])
    assert report["models"]["forward"]["op_counts"]["exported"] == {"Mul": 2, "ReduceSum": 1}
    assert report["models"]["vmap"]["inputs"][0] == {"name": "x", "dtype": "float32", "shape": [4, 2]}
    assert report["models"]["vmap"]["batch"] == 4
    for key in (
        "grad/forward",
        "jvp/forward",
        "vjp/forward",
        "vmap per example/forward",
        "vmap_grad per example/grad",
        "hvp/grad",
    ):
        assert report["ratios"][key] > 0


def test_errors_against_reference_are_small(report) -> None:
    expected_outputs = {
        "forward": {"loss"},
        "vmap": {"loss"},
        "grad": {"loss", "x_grad", "weight_grad"},  # default selection: every float input
        "jvp": {"loss", "loss_tangent"},
        "vjp": {"loss", "x_cotangent", "weight_cotangent"},
        "vmap_grad": {"loss", "x_grad", "weight_grad"},
        "hvp": {"loss", "x_grad", "weight_grad", "x_grad_tangent", "weight_grad_tangent"},
    }
    for name, entry in report["models"].items():
        errors = {e["output"]: e for e in entry["errors"]}
        assert set(errors) == expected_outputs[name], name
        for e in errors.values():
            assert e["within_tolerance"], (name, e)
            assert e["max_abs_error"] < 1e-4, (name, e)


def test_table(report) -> None:
    from onnax.testing._bench import format_bench

    text = format_bench(report)
    assert "grad/forward" in text and "hvp" in text and "vmap (batch 4)" in text
