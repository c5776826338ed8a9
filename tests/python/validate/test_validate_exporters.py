"""``validate`` on exports from real exporters (``tests/python/models/exporters``: tf2onnx Keras
CNN and MLP with ReLU and max pooling, an onnxscript model with a local function and a Loop, a
scikit-learn MLP by skl2onnx), against the exporting framework's own float64 derivatives:

* onnax's grad, vmap(grad) and HVP w.r.t. the input match TensorFlow's float64 answers (NumPy's
  by hand for the scikit-learn MLP) stored beside the models;
* validate PASSes them and the same transforms w.r.t. the weights, with the exact reference
  (these are the cases whose finite-difference reference used to cry wolf: kinks, nested
  differences with a large step, float constants inside function bodies);
* the finite-difference reference, kink-aware now, passes the weights' gradient and HVP too;
* a deliberately wrong gradient still fails, confirmed by the second reference.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

testing = pytest.importorskip("onnax.testing")
pytest.importorskip("onnxruntime")
pytest.importorskip("jax")

from oracles.validate_models import flip_sign  # noqa: E402

# (tf2onnx exported opset 17; onnax upgrades it to 18 and says so)
pytestmark = pytest.mark.filterwarnings("ignore:onnax. .*upgraded the model:UserWarning")

MODELS = Path(__file__).resolve().parents[1] / "models" / "exporters"
NAMES = ("tf_cnn", "tf_mlp", "script_loop", "skl_mlp")
WEIGHTED = ("tf_cnn", "tf_mlp", "skl_mlp")


def _load(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    model = onnx.load(MODELS / f"{name}.onnx")
    with np.load(MODELS / f"{name}.npz") as data:
        return model, {k: data[k] for k in data.files}


def _x(model: onnx.ModelProto) -> str:
    return model.graph.input[0].name


def _loss(model: onnx.ModelProto) -> str:
    return model.graph.output[0].name


def _weights(model: onnx.ModelProto) -> list[str]:
    return [
        t.name
        for t in model.graph.initializer
        if t.data_type == onnx.TensorProto.FLOAT and np.prod(t.dims) > 1
    ]


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, sess.run(names, feeds), strict=True))


# onnax cannot batch the gradient of the onnxscript Loop model yet (vmap: "the rank of input 0
# 'tmp_ct_reducesum_1' ... is unknown"): its per-example gradients are not checked here.
NO_VMAP = {"script_loop"}


def _transforms(
    model: onnx.ModelProto, inputs: list[str], vmap_too: bool = True
) -> dict[str, onnx.ModelProto]:
    from onnax import grad, jvp, vmap

    g = grad(model, inputs=inputs, output=_loss(model))
    out = {"grad": g, "hvp": jvp(g, inputs=inputs)}
    if vmap_too:
        out["vmap_grad"] = vmap(g, in_axes=0)
    return out


def _close(actual: np.ndarray, expected: np.ndarray) -> None:
    """float32 results against float64 references: relative to the reference's scale."""
    scale = max(1.0, float(np.max(np.abs(expected))))
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=2e-5 * scale)


@pytest.mark.parametrize("name", NAMES)
def test_input_derivatives_match_the_framework_and_validate_passes(name: str) -> None:
    model, ref = _load(name)
    x = _x(model)
    gen = _transforms(model, [x], vmap_too=name not in NO_VMAP)
    feeds = {x: ref["x"]}
    got = _run(gen["grad"], feeds)
    np.testing.assert_allclose(got[_loss(model)], ref["loss"], rtol=1e-5)
    _close(got[f"{x}_grad"], ref["grad_x"])
    if "vmap_grad" in gen:
        per = _run(gen["vmap_grad"], {x: ref["xs"]})
        _close(per[f"{x}_grad"], ref["vmap_grad_x"])
    h = _run(gen["hvp"], {x: ref["x"], f"{x}_tangent": ref["v"]})
    _close(h[f"{x}_grad_tangent"], ref["hvp_x"])
    for kind, inputs in (("grad", feeds), ("vmap_grad", {x: ref["xs"]}), ("hvp", None)):
        if kind not in gen:
            continue
        report = testing.validate(model, gen[kind], inputs=inputs)
        assert report.ok, report.format()
        assert report.reference.startswith("exact"), report.reference


@pytest.mark.parametrize("name", WEIGHTED)
def test_weight_derivatives_validate_with_the_exact_reference(name: str) -> None:
    model, _ = _load(name)
    gen = _transforms(model, _weights(model))
    for kind, g in gen.items():
        report = testing.validate(model, g)
        assert report.ok, f"{kind}: {report.format()}"
        assert report.reference.startswith("exact"), report.reference
        derivative = [c for c in report.outputs if c.name.endswith(("_grad", "_tangent"))]
        assert derivative and all(c.method == "exact (JAX float64)" for c in derivative)


@pytest.mark.parametrize(("name", "kind"), [("tf_cnn", "grad"), ("tf_mlp", "grad"), ("tf_mlp", "hvp")])
def test_kink_aware_differences_pass_weight_gradient_and_hvp(name: str, kind: str) -> None:
    """Without JAX's help: finite differences that skip coordinates straddling a ReLU kink or a
    max-pool tie, and an HVP from differences of float64 gradients with a small step. (The
    CNN's HVP by differences runs the float64 Conv on the ONNX reference evaluator: minutes.)"""
    model, _ = _load(name)
    gen = _transforms(model, _weights(model), vmap_too=False)
    report = testing.validate(model, gen[kind], exact=False, max_coords=24)
    assert report.ok, f"{kind}: {report.format()}"
    assert report.reference.startswith("finite differences"), report.reference


def test_onnxscript_function_constants_are_cast_to_float64() -> None:
    """The float constant inside the local function's body is cast too, so differences run in
    float64 (not a silent float32 fallback with float64 tolerances)."""
    model, ref = _load("script_loop")
    assert model.functions, "the onnxscript export should keep its local function"
    gen = _transforms(model, ["x"], vmap_too=False)
    report = testing.validate(model, gen["grad"], inputs={"x": ref["x"]}, exact=False)
    assert report.ok, report.format()
    assert "source in float64" in report.reference, report.reference
    assert not any("float32" in n for n in report.notes), report.notes


@pytest.mark.parametrize("name", ("tf_cnn", "skl_mlp"))
def test_wrong_gradient_still_fails_and_is_confirmed(name: str) -> None:
    model, _ = _load(name)
    weights = _weights(model)
    gen = _transforms(model, weights)["grad"]
    broken = flip_sign(gen, f"{weights[0]}_grad")
    report = testing.validate(model, broken)
    assert report.failed_step == "numerical parity", report.format()
    bad = [c for c in report.outputs if not c.ok]
    assert [c.name for c in bad] == [f"{weights[0]}_grad"]
    assert bad[0].method == "exact (JAX float64)"
    assert "finite differences confirm" in report.message and "onnax bug" in report.message
