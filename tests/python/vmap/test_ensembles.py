"""vmap over initializers (ensembles: one weight set per example), checked against ONNX Runtime
runs of the source with each weight set written in; the stacked sets fed as inputs or stored
in the result; gradients per ensemble member; the command line and onnx_ir models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnax
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from oracles.training_oracle import run

F = T.FLOAT
RNG = np.random.default_rng(3)
W1 = RNG.standard_normal((3, 5)).astype(np.float32)
B1 = RNG.standard_normal((5,)).astype(np.float32)
W2 = RNG.standard_normal((5, 2)).astype(np.float32)
E = 4  # ensemble members
W1S = RNG.standard_normal((E, 3, 5)).astype(np.float32)
B1S = RNG.standard_normal((E, 5)).astype(np.float32)
X = RNG.standard_normal((6, 3)).astype(np.float32)


def mlp() -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Add", ["h", "b1"], ["hb"]),
            helper.make_node("Relu", ["hb"], ["a"]),
            helper.make_node("MatMul", ["a", "w2"], ["y"]),
            helper.make_node("ReduceSumSquare", ["y"], ["loss"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, ["N", 3])],
        [helper.make_tensor_value_info("y", F, ["N", 2]), helper.make_tensor_value_info("loss", F, [])],
        initializer=[
            numpy_helper.from_array(W1, "w1"),
            numpy_helper.from_array(B1, "b1"),
            numpy_helper.from_array(W2, "w2"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def member(e: int) -> dict[str, np.ndarray]:
    """The source run with weight set e written in."""
    return run(onnax.apply_params(mlp(), {"w1": W1S[e], "b1": B1S[e]}), {"x": X})


def test_ensemble_fed_as_inputs() -> None:
    result = onnax.vmap(mlp(), in_axes={"w1": 0, "b1": 0})
    assert {i.name for i in result.graph.input} == {"x", "w1", "b1"}
    assert {t.name for t in result.graph.initializer} == {"w2"}
    got = run(result, {"x": X, "w1": W1S, "b1": B1S})
    for e in range(E):
        want = member(e)
        np.testing.assert_allclose(got["y"][e], want["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["loss"][e], want["loss"], rtol=1e-5)


def test_ensemble_stored_in_the_result() -> None:
    result = onnax.vmap(mlp(), in_axes={"w1": 0, "b1": None}, out_axes=[1, 0], stored={"w1": W1S})
    assert [i.name for i in result.graph.input] == ["x"]
    got = run(result, {"x": X})
    for e in range(E):
        want = run(onnax.apply_params(mlp(), {"w1": W1S[e]}), {"x": X})
        np.testing.assert_allclose(got["y"][:, e], want["y"], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"stored\['w1'\] is float32\[3, 5\] but the input is declared"):
        onnax.vmap(mlp(), in_axes={"w1": 0}, stored={"w1": W1})
    with pytest.raises(ValueError, match=r"stored stacks disagree on the batch size \('w1': 4, 'b1': 5\)"):
        onnax.vmap(mlp(), in_axes={"w1": 0, "b1": 0}, stored={"w1": W1S, "b1": np.zeros((5, 5), np.float32)})
    with pytest.raises(ValueError, match=r"Fix: give it an axis in in_axes"):
        onnax.vmap(mlp(), in_axes={"w1": 0}, stored={"b1": B1S})
    with pytest.raises(TypeError, match="stored must map input names to arrays"):
        onnax.vmap(mlp(), in_axes={"w1": 0}, stored=W1S)  # type: ignore[arg-type]


def test_examples_paired_with_members_and_gradients_per_member() -> None:
    xs = RNG.standard_normal((E, 6, 3)).astype(np.float32)
    got = run(onnax.vmap(mlp(), in_axes={"x": 0, "w1": 0}), {"x": xs, "w1": W1S})
    for e in range(E):
        want = run(onnax.apply_params(mlp(), {"w1": W1S[e]}), {"x": xs[e]})
        np.testing.assert_allclose(got["y"][e], want["y"], rtol=1e-5, atol=1e-6)
    grads = run(
        onnax.vmap(onnax.grad(mlp(), inputs=["w1", "w2"], output="loss"), in_axes={"w1": 0}),
        {"x": X, "w1": W1S},
    )
    for e in range(E):
        want = run(
            onnax.grad(onnax.apply_params(mlp(), {"w1": W1S[e]}), inputs=["w1", "w2"], output="loss"),
            {"x": X},
        )
        np.testing.assert_allclose(grads["w1_grad"][e], want["w1_grad"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(grads["w2_grad"][e], want["w2_grad"], rtol=1e-4, atol=1e-5)


def test_onnx_ir_model_and_command_line(tmp_path: Path) -> None:
    model = ir.serde.deserialize_model(mlp())
    result = onnax.vmap(model, in_axes={"w1": 0, "b1": 0}, stored={"b1": B1S})
    assert isinstance(result, ir.Model)
    got = run(ir.serde.serialize_model(result), {"x": X, "w1": W1S})
    np.testing.assert_allclose(got["y"][2], member(2)["y"], rtol=1e-5, atol=1e-6)
    onnx.save(mlp(), tmp_path / "m.onnx")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onnax",
            "vmap",
            str(tmp_path / "m.onnx"),
            "-o",
            str(tmp_path / "e.onnx"),
            "--in-axes",
            "w1=0,b1=0",
        ],
        check=True,
    )
    got = run(onnx.load(tmp_path / "e.onnx"), {"x": X, "w1": W1S, "b1": B1S})
    np.testing.assert_allclose(got["y"][1], member(1)["y"], rtol=1e-5, atol=1e-6)


def test_validate_replays_an_ensemble() -> None:
    from onnax.testing import validate

    result = onnax.vmap(onnax.grad(mlp(), inputs=["w1"], output="loss"), in_axes={"w1": 0, "b1": 0})
    report = validate(mlp(), result, inputs={"x": X, "w1": W1S, "b1": B1S})
    assert report.ok, report.format()
