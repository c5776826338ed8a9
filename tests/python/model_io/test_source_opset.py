"""Results at the source's opset: a model exported below opset 18 comes back at its own opset
when every node onnax wrote has a form there (else at 18, with a notice), and
``convert_opset`` / ``--target-opset`` write another one.

The oracle: ONNX Runtime running the lowered result gives the same numbers as running the
opset-18 result onnax computes from the same model upgraded by ONNX's version converter.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnax
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import version_converter
from oracles.training_oracle import run

PARAMS = ["w1", "b1", "w2"]


def loss_model(
    nodes: list[onnx.NodeProto],
    x_shape: list[int | str],
    opset: int,
    inits: list[onnx.TensorProto] | None = None,
) -> onnx.ModelProto:
    """A model of `nodes` from input x (float) to a rank-0 `loss`."""
    x = h.make_tensor_value_info("x", T.FLOAT, x_shape)
    loss = h.make_tensor_value_info("loss", T.FLOAT, [])
    graph = h.make_graph(nodes, "g", [x], [loss], initializer=inits or [])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def mlp(opset: int) -> onnx.ModelProto:
    """Gemm, Relu, MatMul, Softmax over the last axis, ReduceSumSquare: loss of a batch [N, 4]."""
    rng = np.random.default_rng(0)
    nodes = [
        h.make_node("Gemm", ["x", "w1", "b1"], ["a"], name="gemm"),
        h.make_node("Relu", ["a"], ["r"], name="relu"),
        h.make_node("MatMul", ["r", "w2"], ["o"], name="matmul"),
        h.make_node("Softmax", ["o"], ["p"], name="softmax", axis=1),
        h.make_node("ReduceSumSquare", ["p"], ["loss"], name="loss", keepdims=0),
    ]
    inits = [
        onnx.numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n)
        for n, s in [("w1", (4, 5)), ("b1", (5,)), ("w2", (5, 3))]
    ]
    return loss_model(nodes, ["N", 4], opset, inits)


TRANSFORMS: dict[str, Callable[[onnx.ModelProto], onnx.ModelProto]] = {
    "vmap": lambda m: onnax.vmap(m, in_axes=0),
    "grad": lambda m: onnax.grad(m, inputs=PARAMS),
    "vjp": lambda m: onnax.vjp(m, inputs=["x"]),
    "vmap(grad)": lambda m: onnax.vmap(onnax.grad(m, inputs=PARAMS), in_axes=0),
    "jvp(grad)": lambda m: onnax.jvp(onnax.grad(m, inputs=PARAMS), inputs=["w1"]),
}


def opset_of(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def random_feeds(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    stored = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in stored:
            continue
        shape = [d.dim_value or 3 for d in vi.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        values = rng.integers(1, 4, size=shape) if dtype.kind == "i" else rng.normal(size=shape)
        feeds[vi.name] = values.astype(dtype)
    return feeds


def quietly(fn: Callable[[], onnx.ModelProto]) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


@pytest.mark.parametrize("name", list(TRANSFORMS))
@pytest.mark.parametrize("opset", [9, 11, 13, 15, 17])
def test_results_come_back_at_the_source_opset(opset: int, name: str) -> None:
    source = mlp(opset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = TRANSFORMS[name](source)
    assert opset_of(result) == opset
    assert not [w for w in caught if "not the model's" in str(w.message)]
    onnx.checker.check_model(result, full_check=True)
    reference = quietly(lambda: TRANSFORMS[name](version_converter.convert_version(source, 18)))
    assert opset_of(reference) == 18
    feeds = random_feeds(result)
    got, want = run(result, feeds), run(reference, feeds)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("options", [{"optimizer": "adamw"}, {"optimizer": "sgd", "clip_norm": 1.0}])
@pytest.mark.parametrize("opset", [13, 17])
def test_training_steps_come_back_at_the_source_opset(opset: int, options: dict[str, object]) -> None:
    step = quietly(lambda: onnax.train_step(mlp(opset), **options))  # type: ignore[arg-type]
    assert opset_of(step) == opset
    onnx.checker.check_model(step, full_check=True)
    reference = onnax.train_step(mlp(18), **options)  # type: ignore[arg-type]
    feeds = random_feeds(step, seed=2)
    got, want = run(step, feeds), run(reference, feeds)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def sliced_loss(opset: int) -> onnx.ModelProto:
    """loss = sum(x[1:3] ** 2): its gradient scatters each element once (no reduction)."""
    nodes = [
        h.make_node("Constant", [], ["s"], name="s", value=h.make_tensor("s", T.INT64, [1], [1])),
        h.make_node("Constant", [], ["e"], name="e", value=h.make_tensor("e", T.INT64, [1], [3])),
        h.make_node("Slice", ["x", "s", "e"], ["y"], name="slice"),
        h.make_node("Mul", ["y", "y"], ["sq"], name="square"),
        h.make_node("ReduceSum", ["sq"], ["loss"], name="sum", keepdims=0),
    ]
    return loss_model(nodes, [5], opset)


def tiled_loss(opset: int) -> onnx.ModelProto:
    """loss = sum(tile(x, 2) ** 2): its gradient scatter-adds (ScatterElements' reduction, 16+)."""
    nodes = [
        h.make_node("Constant", [], ["r"], name="r", value=h.make_tensor("r", T.INT64, [1], [2])),
        h.make_node("Tile", ["x", "r"], ["y"], name="tile"),
        h.make_node("Mul", ["y", "y"], ["sq"], name="square"),
        h.make_node("ReduceSum", ["sq"], ["loss"], name="sum", keepdims=0),
    ]
    return loss_model(nodes, [3], opset)


def test_a_slice_gradient_comes_back_at_13() -> None:
    result = quietly(lambda: onnax.grad(sliced_loss(13)))
    assert opset_of(result) == 13
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_allclose(run(result, {"x": x})["x_grad"], [0, 2, 4, 0, 0])


def test_without_a_form_at_the_source_opset_the_result_lands_at_the_oldest_that_has_one() -> None:
    with pytest.warns(UserWarning, match=r"is at ai.onnx opset 16, not the model's 13: ScatterElements"):
        result = onnax.grad(tiled_loss(13))
    assert opset_of(result) == 16
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(run(result, {"x": x})["x_grad"], 4 * x)


def test_reverse_mode_reshapes_come_back_below_opset_14() -> None:
    # Reverse mode reshapes cotangents back with allowzero=1 (14+); below 14 the reshape to a
    # run-time shape is spelled so that it means the same, empty tensors included.
    nodes = [
        h.make_node("Shape", ["x"], ["s"], name="shape"),
        h.make_node("Constant", [], ["flat"], name="flat", value=h.make_tensor("flat", T.INT64, [1], [-1])),
        h.make_node("Reshape", ["x", "flat"], ["f"], name="reshape"),
        h.make_node("Tanh", ["f"], ["t"], name="tanh"),
        h.make_node("Reshape", ["t", "s"], ["back"], name="back"),
        h.make_node("Mul", ["back", "back"], ["sq"], name="square"),
        h.make_node("ReduceSum", ["sq"], ["loss"], name="sum", keepdims=0),
    ]
    model = loss_model(nodes, ["N", 3], 13)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = onnax.grad(model)
    assert opset_of(result) == 13, [str(w.message) for w in caught]
    onnx.checker.check_model(result, full_check=True)
    for n in (4, 0):  # (an empty batch too)
        x = np.random.default_rng(n).normal(size=(n, 3)).astype(np.float32)
        t = np.tanh(x.astype(np.float64))
        got = run(result, {"x": x})["x_grad"]
        assert got.shape == (n, 3)
        np.testing.assert_allclose(got, 2 * t * (1 - t**2), rtol=1e-5, atol=1e-6)
    # Per-example: vmap pads with an axes input (18+), spelled out for every axis below 18.
    per_example = quietly(lambda: onnax.vmap(result, in_axes=0))
    assert opset_of(per_example) == 13
    xs = np.random.default_rng(5).normal(size=(2, 4, 3)).astype(np.float32)
    t = np.tanh(xs.astype(np.float64))
    np.testing.assert_allclose(
        run(per_example, {"x": xs})["x_grad"], 2 * t * (1 - t**2), rtol=1e-5, atol=1e-6
    )


def test_losses_come_back_at_the_source_opset() -> None:
    with_loss = quietly(lambda: onnax.add_loss(mlp(13), "mse", output="loss", loss_name="mse"))
    assert opset_of(with_loss) == 13
    onnx.checker.check_model(with_loss, full_check=True)


def test_convert_opset_lowers_a_result_to_another_target() -> None:
    result = onnax.grad(mlp(18), inputs=PARAMS)
    assert opset_of(result) == 18
    lowered = onnax.convert_opset(result, 13)
    assert opset_of(lowered) == 13 and opset_of(result) == 18  # (the input is unchanged)
    onnx.checker.check_model(lowered, full_check=True)
    feeds = random_feeds(result)
    got, want = run(lowered, feeds), run(result, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7, err_msg=k)
    raised = onnax.convert_opset(lowered, 17)
    assert opset_of(raised) == 17
    np.testing.assert_allclose(run(raised, feeds)["w1_grad"], want["w1_grad"], rtol=1e-6, atol=1e-7)


def test_convert_opset_names_the_node_without_a_form_at_the_target() -> None:
    result = quietly(lambda: onnax.grad(tiled_loss(18)))
    with pytest.raises(onnax.OnnaxError, match=r"opset 15.*ScatterElements node .*reduction.*Fix:"):
        onnax.convert_opset(result, 15)
    with pytest.raises(onnax.OnnaxError, match=r"outside the supported 7-28"):
        onnax.convert_opset(result, 3)


def test_softmax_over_a_middle_axis_keeps_opset_18_below_13() -> None:
    # Before opset 13, Softmax(axis=1) of a rank-3 tensor normalises over the flattened trailing
    # axes; the upgraded model says it with a Reshape, the result keeps opset 18 and its numbers.
    nodes = [
        h.make_node("Softmax", ["x"], ["p"], name="softmax", axis=1),
        h.make_node("ReduceSumSquare", ["p"], ["loss"], name="loss", keepdims=0),
    ]
    model = loss_model(nodes, [2, 3, 4], 11)
    result = quietly(lambda: onnax.grad(model))
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    flat = x.reshape(2, 12).astype(np.float64)
    p = np.exp(flat) / np.exp(flat).sum(1, keepdims=True)
    want = (2 * p * (p - (p * p).sum(1, keepdims=True))).reshape(2, 3, 4)
    np.testing.assert_allclose(run(result, {"x": x})["x_grad"], want, rtol=1e-5, atol=1e-6)


def test_cli_target_opset(tmp_path: Path) -> None:
    src = tmp_path / "mlp.onnx"
    onnx.save(mlp(18), src)
    out = tmp_path / "grad13.onnx"
    cli = [sys.executable, "-m", "onnax"]
    args = ["grad", str(src), "-o", str(out), "--inputs", ",".join(PARAMS), "--target-opset", "13"]
    r = subprocess.run([*cli, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lowered = onnx.load(out)
    assert opset_of(lowered) == 13
    reference = onnax.grad(mlp(18), inputs=PARAMS)
    feeds = random_feeds(reference)
    np.testing.assert_allclose(run(lowered, feeds)["w1_grad"], run(reference, feeds)["w1_grad"], rtol=1e-6)

    tiled = tmp_path / "tiled.onnx"
    onnx.save(tiled_loss(18), tiled)
    bad = tmp_path / "bad.onnx"
    args = ["grad", str(tiled), "-o", str(bad), "--target-opset", "13"]
    r = subprocess.run([*cli, *args], capture_output=True, text=True)
    assert r.returncode == 1 and "ScatterElements" in r.stderr and "Fix:" in r.stderr, r.stderr
    assert not bad.exists()
    # An opset onnax does not support is a usage error, reported before any work.
    args = ["grad", str(tiled), "-o", str(bad), "--target-opset", "29"]
    r = subprocess.run([*cli, *args], capture_output=True, text=True)
    assert r.returncode == 2 and "outside the supported 7-28" in r.stderr, r.stderr
    assert "upgraded" not in r.stderr and not bad.exists()
