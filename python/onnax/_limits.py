"""Bounds on the transforms run in a context (include/onnax/limits.h), for services that
transform models they did not write. Held in a ContextVar, so a thread or an asyncio task sees
its own; the core gets them before each call (_models._guarded)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from onnax import _core

# (max_seconds, max_output_bytes); 0: no bound.
_BOUNDS: ContextVar[tuple[float, int]] = ContextVar("onnax_limits", default=(0.0, 0))


def _tighter(outer: float, inner: float) -> float:
    return inner if outer == 0 else outer if inner == 0 else min(outer, inner)


@contextmanager
def limits(max_seconds: float | None = None, max_output_mb: float | None = None) -> Iterator[None]:
    """Within the block, a transform stops with ``onnax.LimitError`` (an ``OnnaxError``) once it
    has run ``max_seconds``, and a result over ``max_output_mb`` megabytes (tensors included) is
    refused; nothing is returned in either case. ``None``: no bound. Nested blocks tighten:
    the smaller bound wins. Ctrl-C stops a running transform with or without limits
    (``KeyboardInterrupt``)."""
    bounds = []
    for name, value in (("max_seconds", max_seconds), ("max_output_mb", max_output_mb)):
        if value is None:
            bounds.append(0.0)
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(f"onnax.limits: {name} must be a positive finite number or None, got {value!r}")
        bounds.append(float(value))
    outer_seconds, outer_bytes = _BOUNDS.get()
    # (A tiny bound is a bound: at least one byte.)
    inner_bytes = max(1, math.ceil(bounds[1] * 1024 * 1024)) if bounds[1] else 0
    token = _BOUNDS.set(
        (_tighter(outer_seconds, bounds[0]), int(_tighter(float(outer_bytes), float(inner_bytes))))
    )
    try:
        yield
    finally:
        _BOUNDS.reset(token)


def current() -> tuple[float, int]:
    """The bounds of the running context: (max_seconds, max_output_bytes), 0 for none."""
    return _BOUNDS.get()


def check_result_size(nbytes: int, what: str) -> None:
    """Raises LimitError when a result of ``nbytes`` (its tensors included) exceeds the context's
    bound: the core sees large weights as stand-ins, so the Python side counts them."""
    bound = _BOUNDS.get()[1]
    if bound and nbytes > bound:
        raise _core.LimitError(
            f"{what}: the result would take {nbytes / 2**20:.3g} MB ({nbytes} bytes), over the limit of "
            f"{bound / 2**20:.3g} MB ({bound} bytes); nothing was returned. Fix: raise the limit "
            "(max_output_mb in onnax.limits) if the model is trusted"
        )
