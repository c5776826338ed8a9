"""``validate`` blames correctly and draws inputs the source accepts:

* a source that does not run on the chosen inputs is reported as the problem (not onnax), and
  a runtime that refuses an op of the source is named as refusing the source too;
* tangent / cotangent inputs take the shapes the source computes, not a declared shape that
  lost a static dim;
* integer inputs used as indices (Gather, SoftmaxCrossEntropyLoss labels) are drawn in range;
* a source op the JAX interpreter lacks falls back to finite differences, and says so;
* ONNX Runtime's own log lines are captured into the report, not printed;
* ``max_seconds`` bounds the finite-difference reference and the report says what was checked.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from oracles.validate_models import inferred_model

testing = pytest.importorskip("onnax.testing")
pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def reshape_by_five() -> onnx.ModelProto:
    """loss = sum(tanh(reshape(x * w, [5, -1]))): runs only when x has a multiple of 5 rows."""
    return inferred_model(
        [
            helper.make_node("Mul", ["x", "w"], ["xw"]),
            helper.make_node("Reshape", ["xw", "shape"], ["r"]),
            helper.make_node("Tanh", ["r"], ["t"]),
            helper.make_node("ReduceSum", ["t"], ["loss"], keepdims=0),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 4])],
        ["loss"],
        {"w": np.linspace(-1, 1, 4).astype(np.float32), "shape": np.asarray([5, -1], np.int64)},
    )


def test_source_that_does_not_run_is_blamed_not_onnax() -> None:
    from onnax import grad

    source = reshape_by_five()
    gen = grad(source, inputs=["w"])
    report = testing.validate(source, gen)  # N = 3: 12 elements cannot be 5 rows
    assert not report.ok
    assert report.failed_step == "runtime", report.format()
    msg = report.message
    assert "the SOURCE model does not run on the chosen inputs" in msg, msg
    assert "not onnax" in msg and "Reshape" in msg and "--dim" in msg
    assert "onnax bug" not in msg
    ok = testing.validate(source, gen, dims={"N": 5})
    assert ok.ok, ok.format()


def test_runtime_refusing_a_source_op_is_named() -> None:
    """The SOURCE model fails in ONNX Runtime too (a 6-D MaxPool): the runtime step names the
    source as refused, where it used to call the generated model onnax's bug."""
    from onnax import vmap

    source = inferred_model(
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1, 1, 1, 2])],
        [helper.make_tensor_value_info("x", F, [1, 1, 2, 2, 2, 4])],
        ["y"],
        {},
    )
    try:
        gen = vmap(source, in_axes=0)
    except Exception as err:  # onnax may decline a 6-D MaxPool: then there is nothing to blame
        pytest.skip(f"onnax does not batch this MaxPool: {err}")
    report = testing.validate(source, gen)
    if report.ok:
        pytest.skip("this ONNX Runtime runs the model")
    assert report.failed_step == "runtime"
    assert "ONNX Runtime also refuses the SOURCE model" in report.message, report.message
    assert "--backend ref" in report.message


def test_cotangent_takes_the_shape_the_source_computes() -> None:
    """A vjp whose cotangent input lost its static dims (declared [?, ?]) gets a cotangent of
    the output's real shape [2, 3] instead of [3, 3] (an ONNX Runtime broadcast error)."""
    from onnax import vjp

    source = inferred_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", F, [2, 4])],
        ["y"],
        {"w": np.arange(12, dtype=np.float32).reshape(4, 3) / 10},
    )
    gen = vjp(source, inputs=["w"], outputs=["y"])
    cot = next(v for v in gen.graph.input if v.name.endswith("cotangent"))
    for d in cot.type.tensor_type.shape.dim:
        d.Clear()
        d.dim_param = "lost"
    report = testing.validate(source, gen)
    assert report.ok, report.format()
    assert f"{cot.name} float32[2, 3]" in report.inputs, report.inputs


def gather_loss() -> onnx.ModelProto:
    """loss = sum(table[idx] ^ 2) for a [4, 3] table: indices beyond [-4, 3] fail in ORT."""
    return inferred_model(
        [
            helper.make_node("Gather", ["table", "idx"], ["rows"]),
            helper.make_node("Mul", ["rows", "rows"], ["sq"]),
            helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0),
        ],
        [helper.make_tensor_value_info("idx", I64, ["N"])],
        ["loss"],
        {"table": np.arange(12, dtype=np.float32).reshape(4, 3) / 7},
    )


def cross_entropy_loss() -> onnx.ModelProto:
    """SoftmaxCrossEntropyLoss(x @ W, labels) with 5 classes, labels cast from int32."""
    return inferred_model(
        [
            helper.make_node("MatMul", ["x", "W"], ["scores"]),
            helper.make_node("Cast", ["labels32"], ["labels"], to=I64),
            helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"]),
        ],
        [
            helper.make_tensor_value_info("x", F, ["N", 3]),
            helper.make_tensor_value_info("labels32", TensorProto.INT32, ["N"]),
        ],
        ["loss"],
        {"W": np.linspace(-1, 1, 15).astype(np.float32).reshape(3, 5)},
    )


def test_index_inputs_are_drawn_in_range() -> None:
    from onnax import grad
    from onnax.testing._inputs import index_ranges, make_feeds

    model = gather_loss()
    assert index_ranges(model) == {"idx": 4}
    feeds = make_feeds(model, {}, seed=0, dims={"N": 50}, ranges=index_ranges(model))
    assert feeds["idx"].min() >= 0 and feeds["idx"].max() <= 3 and len(set(feeds["idx"].tolist())) == 4
    report = testing.validate(model, grad(model, inputs=["table"]), dims={"N": 6})
    assert report.ok, report.format()
    ce = cross_entropy_loss()
    assert index_ranges(ce) == {"labels32": 5}
    report = testing.validate(ce, grad(ce, inputs=["W"]))
    assert report.ok, report.format()
    # d loss / d W = x^T (softmax(x W) - onehot) / N: checked against the closed form.
    feeds = {
        "x": np.asarray([[1.0, 0.5, -1.0], [0.2, -0.3, 0.4]], np.float32),
        "labels32": np.asarray([4, 0], np.int32),
    }
    report = testing.validate(ce, grad(ce, inputs=["W"]), inputs=feeds)
    assert report.ok, report.format()
    x, w = feeds["x"].astype(np.float64), np.linspace(-1, 1, 15).reshape(3, 5)
    p = np.exp(x @ w)
    p /= p.sum(axis=1, keepdims=True)
    p[[0, 1], [4, 0]] -= 1
    expected = x.T @ p / 2
    from test_validate_exporters import _run  # (ONNX Runtime run helper)

    got = _run(grad(ce, inputs=["W"]), feeds)["W_grad"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def lstm_loss() -> onnx.ModelProto:
    hidden = 3
    rng = np.random.default_rng(0)
    return inferred_model(
        [
            helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hidden),
            helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        [helper.make_tensor_value_info("x", F, [2, 1, 2])],
        ["loss"],
        {
            "W": (rng.standard_normal((1, 4 * hidden, 2)) * 0.5).astype(np.float32),
            "R": (rng.standard_normal((1, 4 * hidden, hidden)) * 0.5).astype(np.float32),
        },
    )


def test_fallback_to_differences_names_missing_ops_and_captures_runtime_log(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The JAX interpreter has no LSTM: finite differences, and the report says why. ONNX
    Runtime has no float64 LSTM: its red error line goes into the report, not the terminal."""
    pytest.importorskip("jax")
    from onnax import grad

    source = lstm_loss()
    capfd.readouterr()
    report = testing.validate(source, grad(source, inputs=["W"]))
    err = capfd.readouterr().err
    assert report.ok, report.format()
    assert report.reference.startswith("finite differences"), report.reference
    assert "JAX interpreter lacks: LSTM" in report.reference
    assert "LSTM operator does not support double" not in err
    assert any("does not support double" in line for line in report.runtime_log), report.runtime_log
    assert "runtime log" in report.format()


def test_max_seconds_bounds_the_difference_reference() -> None:
    from onnax import grad

    source = lstm_loss()
    report = testing.validate(source, grad(source, inputs=["W", "R"]), max_coords=None, max_seconds=1e-6)
    assert any("time limit of 1e-06 s reached" in n for n in report.notes), report.notes
    w = next(c for c in report.outputs if c.name == "W_grad")
    assert w.checked < w.total
    assert f"{w.checked} of {w.total} coordinates checked" in w.line()


def test_float32_only_source_widens_difference_tolerances(monkeypatch: pytest.MonkeyPatch) -> None:
    """When no runtime runs the source in float64, differences are float32 ones: a larger step
    (1e-2), wider tolerances, and the report says so instead of keeping float64 tolerances."""
    from onnax import grad
    from onnax.testing import _reference
    from oracles.validate_models import embedded_loss

    real = _reference.Session

    class Float32Only(real):  # type: ignore[misc, valid-type]
        def __init__(self, model: onnx.ModelProto, backend: str, threads: int = 1) -> None:
            if any(v.type.tensor_type.elem_type == TensorProto.DOUBLE for v in model.graph.input):
                raise RuntimeError(f"{backend}: no float64 kernels here")
            super().__init__(model, backend, threads)

    monkeypatch.setattr(_reference, "Session", Float32Only)
    source = embedded_loss()
    report = testing.validate(source, grad(source, inputs=["weight"]), exact=False)
    assert report.ok, report.format()
    assert "source in source precision" in report.reference and "eps 0.01" in report.reference
    assert any("tolerances widened to rtol 0.01, atol 0.01" in n for n in report.notes), report.notes
    g = next(c for c in report.outputs if c.name == "weight_grad")
    assert (g.rtol, g.atol) == (0.01, 0.01)


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "fd"])
def test_coordinate_on_a_relu_kink_is_skipped_and_counted(exact: bool) -> None:
    """x = [0, 1, -2]: relu(x * w) has its kink at x[0]; there the derivative is a matter of
    convention (JAX says w/2, differences straddle it), so that coordinate is skipped and
    counted, the two others are checked, and a wrong gradient still fails."""
    if exact:
        pytest.importorskip("jax")
    from onnax import grad
    from oracles.validate_models import flip_sign

    source = inferred_model(
        [
            helper.make_node("Mul", ["x", "w"], ["xw"]),
            helper.make_node("Relu", ["xw"], ["r"]),
            helper.make_node("ReduceSum", ["r"], ["loss"], keepdims=0),
        ],
        [helper.make_tensor_value_info("x", F, [3])],
        ["loss"],
        {"w": np.asarray([1.5, 2.0, 0.5], np.float32)},
    )
    gen = grad(source, inputs=["x"])
    feeds = {"x": np.asarray([0.0, 1.0, -2.0], np.float32)}
    report = testing.validate(source, gen, inputs=feeds, exact=exact)
    assert report.ok, report.format()
    g = next(c for c in report.outputs if c.name == "x_grad")
    assert (g.skipped_rough, g.checked, g.total) == (1, 2, 3)
    assert "1 non-smooth coordinates skipped" in report.format()
    broken = testing.validate(source, flip_sign(gen, "x_grad"), inputs=feeds, exact=exact)
    assert broken.failed_step == "numerical parity"
    bad = next(c for c in broken.outputs if c.name == "x_grad")
    assert bad.max_abs_error == pytest.approx(4.0)  # 2 * |d loss / d x[1]| = 2 * 2.0


def test_an_output_with_every_coordinate_at_a_kink_is_incomplete_not_passed() -> None:
    """grad of sum(relu(x)) at x = 0: every coordinate is a kink, so nothing of x_grad can be
    checked; validate says INCOMPLETE. At inputs away from 0 the same model passes, with x_grad
    checked against the exact reference (relu' = 1 or 0)."""
    import onnax
    from onnax.testing import validate

    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Relu", ["x"], ["r"]),
            onnx.helper.make_node("ReduceSum", ["r"], ["loss"], keepdims=0),
        ],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [onnx.helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=10)
    generated = onnax.grad(model, inputs=["x"], output="loss")
    at_kinks = validate(model, generated, inputs={"x": np.zeros(4, np.float32)})
    assert at_kinks.format().startswith("onnax validate: INCOMPLETE (every coordinate of ['x_grad']")
    away = validate(model, generated, inputs={"x": np.array([1.0, -2.0, 3.0, -4.0], np.float32)})
    assert away.format().startswith("onnax validate: PASSED")
    assert "x_grad: float32[4] vs exact" in away.format() and "4 of 4" not in away.format()
