"""Structural checks every transformed model must pass before it is run.

The runner applies :data:`DEFAULT_CHECKS` in order; each raises on a problem. A later
``onnax.testing.validate`` step plugs in by appending a callable ``(model) -> None`` to the list
passed to :func:`conformance.corpus.runner.run_entry` (or to ``DEFAULT_CHECKS``).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

Check = Callable[[onnx.ModelProto], None]


def checker(model: onnx.ModelProto) -> None:
    """``onnx.checker`` with full_check (includes ONNX shape inference in strict mode)."""
    onnx.checker.check_model(model, full_check=True)


def strict_shape_inference(model: onnx.ModelProto) -> None:
    """Shape inference with data propagation must accept every node of the generated graph."""
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)


DEFAULT_CHECKS: list[Check] = [checker, strict_shape_inference]
