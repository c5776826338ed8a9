"""Bounds on the transforms a thread runs (include/onnax/limits.h), for services that transform
models they did not write."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from onnax import _core


@contextmanager
def limits(max_seconds: float | None = None, max_output_mb: float | None = None) -> Iterator[None]:
    """Within the block, a transform this thread runs stops with ``OnnaxError`` once it has run
    ``max_seconds``, and a result over ``max_output_mb`` megabytes (tensors included) is refused;
    nothing is returned in either case. ``None``: no bound. Ctrl-C stops a running transform
    with or without limits (``KeyboardInterrupt``)."""
    bounds = []
    for name, value in (("max_seconds", max_seconds), ("max_output_mb", max_output_mb)):
        if value is None:
            bounds.append(0.0)
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(f"onnax.limits: {name} must be a positive number or None, got {value!r}")
        bounds.append(float(value))
    previous = _core.set_limits(bounds[0], int(bounds[1] * 1024 * 1024))
    try:
        yield
    finally:
        _core.set_limits(*previous)
