"""Assertions about how a generated model deploys (the checks behind ``onnax check --symbolic``
and ``--embedded``, implemented once in the C++ core)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from onnax import _core
from onnax.testing._models import ModelLike, load


def assert_symbolic_lengths(model: ModelLike, axes: Mapping[str, Sequence[int]]) -> None:
    """Fails (``AssertionError``) if any listed axis of a graph input or output is a fixed
    number instead of a symbolic ``dim_param``, e.g. ``{"x": [0]}`` for a batch axis."""
    if isinstance(axes, str) or not isinstance(axes, Mapping):
        raise TypeError(f"axes must map graph names to lists of axes, got {axes!r}")
    problems = _core.symbolic_lengths(
        load(model, "checked").SerializeToString(), {str(k): [int(a) for a in v] for k, v in axes.items()}
    )
    if problems:
        raise AssertionError("\n".join(problems))


def assert_embedded_weights(model: ModelLike, names: Sequence[str]) -> None:
    """Fails (``AssertionError``) if any named weight is a graph input instead of an
    initializer stored in the model."""
    if isinstance(names, str):
        raise TypeError(f"names must be a sequence of initializer names, got the string {names!r}")
    problems = _core.embedded_weights(load(model, "checked").SerializeToString(), [str(n) for n in names])
    if problems:
        raise AssertionError("\n".join(problems))
