"""Running models: ONNX Runtime for the opsets it accepts, the ONNX reference evaluator beyond."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from onnax.testing._models import default_opset

# ONNX Runtime 1.31 implements ai.onnx up to opset 26; newer models go to the reference evaluator.
ORT_MAX_OPSET = 26


def choose_backend(model: onnx.ModelProto, backend: str | None = None) -> str:
    """``"ort"`` or ``"ref"``; ``backend`` forces one."""
    if backend is not None:
        if backend not in ("ort", "ref"):
            raise ValueError(f"backend must be 'ort' or 'ref', got {backend!r}")
        return backend
    return "ort" if default_opset(model) <= ORT_MAX_OPSET else "ref"


class Session:
    """One loaded model on one backend; ``run`` returns outputs by name in graph order."""

    def __init__(self, model: onnx.ModelProto, backend: str, threads: int = 1) -> None:
        self.backend = backend
        self.output_names = [o.name for o in model.graph.output]
        self._sess: Any
        if backend == "ort":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            opts.log_severity_level = 3
            self._sess = ort.InferenceSession(
                model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"]
            )
        else:
            from onnx.reference import ReferenceEvaluator

            self._sess = ReferenceEvaluator(model)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._sess.run(self.output_names, dict(feeds))
        return {n: np.asarray(v) for n, v in zip(self.output_names, values, strict=True)}


def ort_lacks_kernel(err: Exception) -> bool:
    text = str(err)
    return "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text
