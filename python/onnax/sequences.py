"""Stateful models: one timestep ``step(x_t, *state) -> (out, *new_state)`` and the whole
sequence ``run(x_seq, *state) -> (out_seq, *final_state)`` as one native ONNX ``Loop``, turned
into each other (``scan``, ``step``) and described as a flat ``signature`` (the fields of
spyx's ``ONNXStepSignature``, and more)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnax import _core
from onnax._models import Model, ModelT, inspect, transform
from onnax.transforms import _names

Dim = int | str | None
Shape = tuple[Dim, ...]
StateSpec = Sequence[str] | Mapping[str, str | None] | None


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, NumPy dtype (None if undeclared or without a NumPy
    equivalent), shape (None if the rank is unknown; a dim is its size, its symbolic name, or
    None when unknown)."""

    name: str
    dtype: np.dtype[Any] | None
    shape: Shape | None


@dataclass(frozen=True)
class Signature:
    """The flat layout of a step or sequence model.

    ``input_names`` / ``output_names`` are the graph's runtime inputs and outputs in call order;
    ``state_names`` the state inputs in order, ``state_output_names`` the outputs holding each
    one's next value (step) or final value (sequence; None where the sequence model does not
    return it). ``input_shape`` / ``output_shape`` describe the first per-step input and output
    (with the time axis for a sequence model); ``sequence_length`` is the number of steps of a
    sequence model (an int, the time axis's symbolic name, or None)."""

    kind: str
    input_names: list[str]
    output_names: list[str]
    input_shape: Shape | None
    input_dtype: np.dtype[Any] | None
    state_names: list[str]
    state_shapes: list[Shape | None]
    state_dtypes: list[np.dtype[Any] | None]
    state_output_names: list[str | None]
    output_shape: Shape | None
    output_dtype: np.dtype[Any] | None
    constants: list[str] = field(default_factory=list)
    sequence_length: int | str | None = None
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)

    @property
    def num_state(self) -> int:
        """Number of flat state tensors threaded through the step."""
        return len(self.state_names)

    def seed_state(self, dtype: Any = None, dims: Mapping[str, int] | None = None) -> list[np.ndarray]:
        """Zero initial states, one array per state tensor in order. Symbolic dims take their
        size from ``dims`` (``{"batch": 2}``); ``dtype`` overrides every state's dtype."""
        seeds = []
        for name, shape, dt in zip(self.state_names, self.state_shapes, self.state_dtypes, strict=True):
            seeds.append(
                np.zeros(_concrete(name, shape, dims or {}), dtype=dtype if dtype is not None else dt)
            )
        return seeds

    def zeros(self, dtype: Any = None, dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """``seed_state`` by state input name (a feed for ONNX Runtime)."""
        return dict(zip(self.state_names, self.seed_state(dtype, dims), strict=True))


def _concrete(name: str, shape: Shape | None, dims: Mapping[str, int]) -> tuple[int, ...]:
    if shape is None:
        raise ValueError(
            f"state '{name}' has no declared shape, so its zeros cannot be made. Fix: declare the input's "
            "shape in the model"
        )
    out = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, str) and d in dims:
            size = dims[d]
            if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 0:
                raise ValueError(
                    f"dims[{d!r}] is {size!r}; expected a size (an int >= 0). Fix: e.g. {{{d!r}: 1}}"
                )
            out.append(int(size))
        else:
            raise ValueError(
                f"state '{name}' has the dim {d!r} in its shape {list(shape)}, which has no size. Fix: "
                f"give it, e.g. dims={{{d!r}: 1}} (command line --dim {d}=1)"
            )
    return tuple(out)


def _dtype(name: str | None) -> np.dtype[Any] | None:
    if name is None:
        return None
    try:
        return np.dtype(name)
    except TypeError:
        return None  # bfloat16, float8 ...: no NumPy dtype


def _shape(raw: list[Any] | None) -> Shape | None:
    return None if raw is None else tuple(raw)


def _roles(state: StateSpec, constants: Sequence[str]) -> tuple[list[str] | None, dict[str, str], list[str]]:
    if isinstance(state, str):
        raise TypeError(f"state must be a sequence of input names or a mapping, got the string {state!r}")
    names: list[str] | None
    next_state: dict[str, str] = {}
    if state is None:
        names = None
    elif isinstance(state, Mapping):
        names = _names(list(state), "state")
        for k, v in state.items():
            if v is not None:
                next_state[k] = v
        _names(list(next_state.values()), "state outputs")
    else:
        names = _names(state, "state")
    return names, next_state, _names(constants, "constants") or []


def scan(
    model: ModelT,
    state: StateSpec = None,
    constants: Sequence[str] = (),
    length: int | None = None,
    length_name: str = "time",
    truncate: int | None = None,
) -> ModelT:
    """The full-sequence model of a step model: one ``Loop`` over a new first (time) axis.

    ``state`` lists the state inputs in order (default: every runtime input after the first),
    or maps each to the output holding its next value (``{"h": "h_next"}``; default: the last
    outputs, in order). ``constants`` are inputs the same at every step; the other inputs are
    sequences. ``length`` fixes the number of steps; by default the time axis is the symbolic
    dim ``length_name``, read at run time from the first sequence. Names are kept: sequence
    inputs gain the time axis, state outputs become the final state, the other outputs are
    stacked over time. ``truncate=K``: truncated backpropagation through time, derivatives
    flow through the last K steps only (the forward pass is the same)."""
    names, next_state, consts = _roles(state, constants)
    return transform(
        model, lambda data: _core.scan(data, names, next_state, consts, length, length_name, truncate)
    )


def step(model: ModelT) -> ModelT:
    """The one timestep inside a full-sequence model (one top-level ``Loop`` or ``Scan`` over
    the time axis, as spyx's export and ``scan`` write): the sequence inputs become per-step
    inputs, the state stays in and comes out as its next value; names and order are kept."""
    return transform(model, _core.step)


def signature(model: Model, state: StateSpec = None, constants: Sequence[str] = ()) -> Signature:
    """The flat signature of a step or sequence model. A model whose graph is one top-level
    Loop/Scan is read as a sequence model (its state is what the loop carries); otherwise as a
    step, with ``state`` and ``constants`` as ``scan`` takes them."""
    return signature_from_json(json.loads(signature_text(model, state, constants)))


def signature_text(model: Model, state: StateSpec = None, constants: Sequence[str] = ()) -> str:
    """``signature``'s JSON form, as ``onnax signature`` prints it."""
    names, next_state, consts = _roles(state, constants)
    return inspect(model, lambda data: _core.signature_json(data, names, next_state, consts))


def signature_from_json(raw: Mapping[str, Any]) -> Signature:
    """A ``Signature`` from its JSON form (``onnax signature``'s output)."""

    def specs(items: list[dict[str, Any]]) -> list[TensorSpec]:
        return [TensorSpec(t["name"], _dtype(t["dtype"]), _shape(t["shape"])) for t in items]

    return Signature(
        kind=raw["kind"],
        input_names=list(raw["input_names"]),
        output_names=list(raw["output_names"]),
        input_shape=_shape(raw["input_shape"]),
        input_dtype=_dtype(raw["input_dtype"]),
        state_names=list(raw["state_names"]),
        state_shapes=[_shape(s) for s in raw["state_shapes"]],
        state_dtypes=[_dtype(d) for d in raw["state_dtypes"]],
        state_output_names=list(raw["state_output_names"]),
        output_shape=_shape(raw["output_shape"]),
        output_dtype=_dtype(raw["output_dtype"]),
        constants=list(raw["constants"]),
        sequence_length=raw["sequence_length"],
        inputs=specs(raw["inputs"]),
        outputs=specs(raw["outputs"]),
    )
