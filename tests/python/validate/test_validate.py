"""``onnax.testing.validate`` / ``allclose``: the README's transform graphs pass all four steps;
deliberately broken models fail at the right step with a message that names the problem; and
the reference itself matches the closed forms of ``loss = sum((x * w) ** 2)``:

* dloss/dw = 2 x^2 w;  per-example: 2 x_i^2 w for each row;  jvp along v (w.r.t. x):
  sum(2 (x w) w v);  vjp of u (w.r.t. w): u 2 x^2 w;  HVP along v (w.r.t. w): 2 x^2 v.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from oracles.validate_models import (
    README_TRANSFORMS,
    dangling_input,
    flip_sign,
    linear_loss,
    readme_transforms,
    save,
    with_custom_op,
    wrong_declared_shape,
)

testing = pytest.importorskip("onnax.testing")
pytest.importorskip("onnxruntime")

X = np.array([1.0, 2.0], np.float32)
W = np.array([3.0, -1.0], np.float32)


@pytest.fixture(scope="module")
def source():
    return linear_loss()


@pytest.fixture(scope="module")
def generated(source):
    return readme_transforms(source)


@pytest.mark.parametrize("name", README_TRANSFORMS)
def test_readme_transforms_pass(source, generated, name: str) -> None:
    report = testing.validate(source, generated[name])
    assert report.ok, report.format()
    assert [s.name for s in report.steps] == [
        "checker",
        "strict shape inference",
        "runtime",
        "numerical parity",
    ]
    assert {c.name for c in report.outputs} == {o.name for o in generated[name].graph.output}
    text = report.format()
    for needle in ("onnax 0.1.0", "onnx 1.23.2", "onnxruntime 1.31.1", "numpy", "ai.onnx:18", "Mul"):
        assert needle in text, f"{needle!r} missing from the report"


def test_transform_call_is_described(source, generated) -> None:
    report = testing.validate(source, generated["vmap_grad"])
    assert report.transform == (
        "vmap(grad(f, inputs=['weight'], output='loss'), in_axes={'x': 0, 'weight': None}, "
        "out_axes=[0, 0], axis_name='batch')"
    )


def _reference(source, generated, feeds):
    from onnax.testing._chain import parse_chain
    from onnax.testing._reference import build_reference

    ref = build_reference(source, generated, parse_chain(generated), max_coords=None, seed=0, backend=None)
    f64 = {k: np.asarray(v, np.float64) for k, v in feeds.items()}
    return ref.fn(f64).values


def test_reference_matches_closed_forms(source, generated) -> None:
    """The oracle the parity step uses, against hand-derived derivatives (float64)."""
    x, w = X.astype(np.float64), W.astype(np.float64)
    v = np.array([0.5, -2.0])
    u = np.array(1.7)
    xs = np.array([[1.0, 2.0], [-0.5, 0.25], [3.0, 1.0]])
    g = _reference(source, generated["grad"], {"x": x, "weight": w})
    np.testing.assert_allclose(g["loss"], np.sum((x * w) ** 2), rtol=1e-12)
    np.testing.assert_allclose(g["weight_grad"], 2 * x**2 * w, rtol=1e-7)
    pe = _reference(source, generated["vmap_grad"], {"x": xs, "weight": w})
    np.testing.assert_allclose(pe["weight_grad"], 2 * xs**2 * w, rtol=1e-7)
    np.testing.assert_allclose(pe["loss"], np.sum((xs * w) ** 2, axis=1), rtol=1e-12)
    j = _reference(source, generated["jvp"], {"x": x, "weight": w, "x_tangent": v})
    np.testing.assert_allclose(j["loss_tangent"], np.sum(2 * (x * w) * w * v), rtol=1e-7)
    p = _reference(source, generated["vjp"], {"x": x, "weight": w, "loss_cotangent": u})
    np.testing.assert_allclose(p["weight_cotangent"], u * 2 * x**2 * w, rtol=1e-7)
    h = _reference(source, generated["hvp"], {"x": x, "weight": w, "weight_tangent": v})
    np.testing.assert_allclose(h["weight_grad_tangent"], 2 * x**2 * v, rtol=1e-5)
    b = _reference(source, generated["vmap"], {"x": xs, "weight": w})
    np.testing.assert_allclose(b["loss"], np.sum((xs * w) ** 2, axis=1), rtol=1e-12)


def test_flipped_gradient_fails_parity_naming_output_and_worst_error(source, generated) -> None:
    broken = flip_sign(generated["grad"], "weight_grad")
    report = testing.validate(source, broken, inputs={"x": X, "weight": W})
    assert not report.ok
    assert report.failed_step == "numerical parity"
    assert [s.status for s in report.steps] == ["pass", "pass", "pass", "FAIL"]
    # gradient 2 x^2 w = [6, -8]; the flipped graph gives [-6, 8]: errors [12, 16].
    bad = next(c for c in report.outputs if c.name == "weight_grad")
    assert not bad.ok
    assert bad.max_abs_error == pytest.approx(16.0, rel=1e-5)
    assert bad.index == [1]
    assert next(c for c in report.outputs if c.name == "loss").ok
    msg = report.message
    assert "numerical parity" in msg and "'weight_grad'" in msg and "index (1,)" in msg
    assert "Fix:" in msg
    assert "x float32[2] (given)" in report.format()


def test_checker_failure(source, generated) -> None:
    report = testing.validate(source, dangling_input(generated["grad"]))
    assert report.failed_step == "checker"
    assert "undefined_value" in report.message and "Fix:" in report.message
    assert [s.status for s in report.steps] == ["FAIL", "skip", "skip", "skip"]


def test_shape_inference_failure(source, generated) -> None:
    report = testing.validate(source, wrong_declared_shape(generated["grad"], "weight_grad"))
    assert report.failed_step == "strict shape inference"
    assert "(2) vs (3)" in report.message, report.message
    assert "Fix:" in report.message


def test_runtime_rejection(source, generated) -> None:
    report = testing.validate(source, with_custom_op(generated["grad"], "weight_grad"))
    assert [s.status for s in report.steps] == ["pass", "pass", "FAIL", "skip"]
    assert report.failed_step == "runtime"
    assert "cannot load" in report.message and "com.example:Foo" in report.message
    assert "\n" not in report.message


def test_allclose(source, generated) -> None:
    ok, msg = testing.allclose(source, generated["grad"], [X, W])
    assert ok, msg
    ok, msg = testing.allclose(source, flip_sign(generated["grad"], "weight_grad"), {"x": X, "weight": W})
    assert not ok
    assert "'weight_grad'" in msg and "16" in msg
    ok, msg = testing.allclose(source, generated["grad"], [X])
    assert not ok and "2 runtime inputs" in msg


def test_tolerances_override(source, generated) -> None:
    """Given tolerances replace the defaults (huge ones accept a flipped sign)."""
    broken = flip_sign(generated["grad"], "weight_grad")
    assert testing.validate(source, broken, rtol=10.0, atol=100.0).ok
    assert testing.default_tolerance(np.dtype(np.float32), fd=False) == (1e-4, 1e-4)
    assert testing.default_tolerance(np.dtype(np.float64), fd=True) == (1e-5, 1e-6)


def test_npz_inputs(source, generated, tmp_path: Path) -> None:
    path = tmp_path / "inputs.npz"
    np.savez(path, x=X, weight=W)
    report = testing.validate(source, generated["grad"], inputs=path)
    assert report.ok
    assert "x float32[2] (given), weight float32[2] (given)" in report.inputs
    np.savez(path, z=X)
    with pytest.raises(testing.ValidationInputError, match=r"\['z'\].*available: \['x', 'weight'\]"):
        testing.validate(source, generated["grad"], inputs=path)
    np.savez(path, x=X.astype(np.float64))
    with pytest.raises(testing.ValidationInputError, match="dtype float64, the model declares float32"):
        testing.validate(source, generated["grad"], inputs=path)


def test_bad_files(source, generated, tmp_path: Path) -> None:
    with pytest.raises(testing.ValidationInputError, match=r"does not exist\. Fix: check the path"):
        testing.validate(tmp_path / "missing.onnx", generated["grad"])
    good = save(generated["grad"], tmp_path / "grad.onnx").read_bytes()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good[: len(good) // 2])
    with pytest.raises(testing.ValidationInputError, match="truncated, corrupt or not an ONNX model"):
        testing.validate(source, truncated)


def test_wrong_source_is_reported(generated) -> None:
    """Validating against a model the chain did not start from is a usage error, not a pass."""
    with pytest.raises(testing.ValidationInputError, match="SOURCE"):
        testing.validate(generated["grad"], generated["vmap_grad"])


def test_reference_evaluator_beyond_ort_opsets() -> None:
    """Opset 27 is beyond ONNX Runtime 1.31: runtime and reference use the ONNX evaluator."""
    from onnax import grad

    m = linear_loss()
    m.opset_import[0].version = 27
    m.ir_version = 13
    report = testing.validate(m, grad(m, inputs=["weight"]))
    assert report.ok, report.format()
    assert "ReferenceEvaluator" in report.backend
    assert "ONNX reference evaluator" in report.reference


def test_web_without_node_is_a_clear_error(source, generated, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(
        testing.ValidationInputError, match=r"--web: Node.js \('node'\) is not on PATH\. Fix:"
    ):
        testing.validate(source, generated["grad"], web=True)
