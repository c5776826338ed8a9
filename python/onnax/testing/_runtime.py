"""Running models: ONNX Runtime for the opsets it accepts, the ONNX reference evaluator beyond."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
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


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextlib.contextmanager
def runtime_log(sink: list[str]) -> Iterator[None]:
    """Captures what is written to the process's standard error meanwhile (ONNX Runtime's own
    log lines, written by native code) into ``sink``, one entry per non-empty line, instead of
    letting it reach the terminal."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2: nothing to capture
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = _ANSI.sub("", tmp.read().decode(errors="replace"))
            sink.extend(line.strip() for line in text.splitlines() if line.strip())
