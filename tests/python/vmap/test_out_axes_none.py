"""vmap's out_axes=None: an output that is the same for every example stays unbatched (as in
``jax.vmap``), checked against a loop over examples in ONNX Runtime; an output that depends on
a batched input is refused with a diagnostic; the command line and validate read it too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnax
import onnx
import pytest
from onnax.testing import validate
from onnx import TensorProto as T
from onnx import helper
from oracles.training_oracle import run

F = T.FLOAT


def model() -> onnx.ModelProto:
    """y = x * w (per example), z = w * w + 1 (the same for every example)."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "w"], ["y"]),
            helper.make_node("Mul", ["w", "w"], ["ww"]),
            helper.make_node("Add", ["ww", "one"], ["z"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, [3]), helper.make_tensor_value_info("w", F, [3])],
        [helper.make_tensor_value_info("y", F, [3]), helper.make_tensor_value_info("z", F, [3])],
        initializer=[helper.make_tensor("one", F, [], [1.0])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


X = np.arange(15, dtype=np.float32).reshape(5, 3) / 7
W = np.array([0.5, -1.0, 2.0], np.float32)


def test_shared_output_stays_unbatched() -> None:
    batched = onnax.vmap(model(), in_axes=[0, None], out_axes=[0, None])
    z = next(o for o in batched.graph.output if o.name == "z")
    assert [d.dim_value for d in z.type.tensor_type.shape.dim] == [3]
    got = run(batched, {"x": X, "w": W})
    source = model()
    per_example = [run(source, {"x": x, "w": W}) for x in X]
    np.testing.assert_allclose(got["y"], np.stack([r["y"] for r in per_example]))
    np.testing.assert_allclose(got["z"], per_example[0]["z"])
    assert got["z"].shape == (3,)
    # Every output None is allowed when none depends on the batch.
    assert run(onnax.vmap(model(), in_axes=[0, None], out_axes=[1, None]), {"x": X, "w": W})["y"].shape == (
        3,
        5,
    )


def test_batched_output_with_none_is_refused() -> None:
    with pytest.raises(
        onnax.OnnaxError, match=r"out_axes is None for output 'y', but it depends on the batched input 'x'"
    ):
        onnax.vmap(model(), in_axes=[0, None], out_axes=None)


def test_command_line_and_validate(tmp_path: Path) -> None:
    onnx.save(model(), tmp_path / "m.onnx")
    out = tmp_path / "v.onnx"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onnax",
            "vmap",
            str(tmp_path / "m.onnx"),
            "-o",
            str(out),
            "--in-axes",
            "0,none",
            "--out-axes",
            "0,none",
        ],
        check=True,
    )
    got = run(onnx.load(out), {"x": X, "w": W})
    assert got["z"].shape == (3,)
    report = validate(model(), onnx.load(out), inputs={"x": X, "w": W})
    assert report.ok, report.format()
