"""The built-in example: the seed README's linear_loss model, batched with vmap.

Builds the model with onnx_ir exactly as the README does, vmaps it with in_axes=(0, None)
from Python and with the `onnax` command, runs both results in ONNX Runtime and checks them
against a loop over examples.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnax import vmap


def build_linear_loss() -> ir.Model:
    x = ir.val("x", dtype=ir.DataType.FLOAT, shape=[2])
    weight = ir.val("weight", dtype=ir.DataType.FLOAT, shape=[2])
    tape = ir.tape.Tape()
    prediction = tape.op("Mul", [x, weight])
    prediction.name = "prediction"
    squared = tape.op("Mul", [prediction, prediction])
    squared.name = "squared"
    loss = tape.op("ReduceSum", [squared], {"keepdims": 0})
    loss.name = "loss"
    return ir.Model(
        ir.Graph([x, weight], [loss], nodes=tape.nodes, opset_imports={"": 18}, name="linear_loss"),
        ir_version=10,
    )


def run(model_path: Path, xs: np.ndarray, w: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": xs, "weight": w})[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default="out", type=Path)
    args = parser.parse_args()
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)

    model = build_linear_loss()
    ir.save(model, out / "linear_loss.onnx")
    per_example = vmap(model, in_axes=(0, None))
    ir.save(per_example, out / "per_example.onnx")
    onnx.checker.check_model(onnx.load(out / "per_example.onnx"), full_check=True)

    cli = [
        sys.executable,
        "-m",
        "onnax",
        "vmap",
        str(out / "linear_loss.onnx"),
        "-o",
        str(out / "per_example_cli.onnx"),
        "--in-axes",
        "0,none",
    ]
    subprocess.run(cli, check=True)

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((8, 2)).astype(np.float32)
    w = rng.standard_normal(2).astype(np.float32)
    expected = np.array([np.sum((x * w) ** 2) for x in xs], dtype=np.float32)
    for name in ("per_example.onnx", "per_example_cli.onnx"):
        got = run(out / name, xs, w)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
        print(f"{name}: per-example losses {[round(float(v), 4) for v in got]} match a loop over examples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
