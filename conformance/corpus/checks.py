"""Checks every transformed model must pass before its numbers are compared.

The runner applies :data:`DEFAULT_CHECKS` in order, then any extra checks it is given (each a
callable ``(source, generated, feeds) -> None`` that raises on a problem; ``feeds`` are the
inputs the runner will run ``generated`` on). :func:`onnax_validate`
is such an extra: ``onnax.testing.validate``'s own independent parity check
(``python -m conformance.corpus --validate``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx

Feeds = Mapping[str, np.ndarray]
Check = Callable[[onnx.ModelProto, onnx.ModelProto, Feeds], None]


def checker(source: onnx.ModelProto, model: onnx.ModelProto, feeds: Feeds) -> None:
    """``onnx.checker`` with full_check (includes ONNX shape inference in strict mode)."""
    onnx.checker.check_model(model, full_check=True)


def strict_shape_inference(source: onnx.ModelProto, model: onnx.ModelProto, feeds: Feeds) -> None:
    """Shape inference with data propagation must accept every node of the generated graph."""
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)


def onnax_validate(source: onnx.ModelProto, model: onnx.ModelProto, feeds: Feeds) -> None:
    """``onnax.testing.validate``: checker, strict inference, runtime and numerical parity
    with the recorded transform chain (per-example loops, float64 finite differences)."""
    from onnax.testing import validate

    report = validate(source, model, inputs=feeds, max_coords=16)
    if report.failed_step is not None:
        detail = " ".join(report.format().split())
        raise AssertionError(f"onnax.testing.validate failed: {detail}")


DEFAULT_CHECKS: list[Check] = [checker, strict_shape_inference]
