"""Validation of the models onnax writes (``onnax validate``, ``onnax bench``).

* :func:`validate` — checker, strict shape inference, runtime execution and numerical parity
  against the recorded transform chain, computed independently from the source model;
* :func:`allclose` — the numerical part alone, returning ``(ok, message)``;
  :func:`allclose_web` also on onnxruntime-web (WASM, Node.js);
* :func:`assert_symbolic_lengths`, :func:`assert_embedded_weights` — deployment properties;
* :func:`bench` — ONNX Runtime latency of a model and its transforms.
"""

from __future__ import annotations

from onnax.testing._assertions import assert_embedded_weights, assert_symbolic_lengths
from onnax.testing._bench import bench
from onnax.testing._compare import default_tolerance
from onnax.testing._models import ValidationInputError
from onnax.testing._validate import ValidationReport, allclose, allclose_web, validate

__all__ = [
    "ValidationInputError",
    "ValidationReport",
    "allclose",
    "allclose_web",
    "assert_embedded_weights",
    "assert_symbolic_lengths",
    "bench",
    "default_tolerance",
    "validate",
]
