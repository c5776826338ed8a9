"""spyx's exported spiking networks (tests/python/models/spyx: step and sequence exports, their
signatures and spyx's own results) and the helpers that run them in ONNX Runtime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SPYX = Path(__file__).resolve().parents[1] / "models" / "spyx"


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # spyx's exports carry unused constants ORT warns about
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(v) for v in session(model).run(None, feeds)]


def spyx(name: str) -> tuple[onnx.ModelProto, onnx.ModelProto, Any, dict[str, Any]]:
    ref = np.load(SPYX / f"{name}_ref.npz")
    sig = json.loads((SPYX / f"{name}_signature.json").read_text())
    return onnx.load(SPYX / f"{name}_step.onnx"), onnx.load(SPYX / f"{name}_seq.onnx"), ref, sig


def zero_state(ref: Any) -> dict[str, np.ndarray]:
    return {"state_0": np.zeros_like(ref["state_0"]), "state_1": np.zeros_like(ref["state_1"])}


def append_half_sum_of_squares(model: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """loss = 0.5 * sum(output ** 2), spyx's test loss, as the model's only output."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    g.node.extend(
        [
            helper.make_node("Mul", [output, output], ["sq"]),
            helper.make_node("ReduceSum", ["sq"], ["sq_sum"], keepdims=0),
            helper.make_node("Mul", ["sq_sum", "half"], ["loss"]),
        ]
    )
    g.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    return m
