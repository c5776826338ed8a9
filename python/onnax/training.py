"""From an exported model to training: losses, parameters in bulk, training steps.

``add_loss`` attaches a scalar loss to a model output; ``select_params`` picks parameters by
name, glob or regular expression; ``train_step`` writes one ONNX graph per optimizer step
(parameters, optimizer state and step count in; loss, updated parameters and state out), also
differentially private (DP-SGD) or split into gradient accumulation and an apply step;
``initial_state`` gives the first step's fed-back inputs and ``feedback`` pairs each such
input with the output that feeds it next; ``apply_params`` writes trained values back into the
original model. The graphs are built by the C++ core (onnax/training.h).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import onnx
from onnx import numpy_helper

from onnax import _core
from onnax._models import Model, ModelT, inspect, transform

Spec = str | Sequence[str]

STATE_KEY = "onnax.train_state"


def _entries(spec: Spec, what: str) -> list[str]:
    if isinstance(spec, str):
        return [spec]
    entries = list(spec)
    for e in entries:
        if not isinstance(e, str):
            raise TypeError(f"{what} must be a name or pattern (str) or a sequence of them, got {e!r}")
    return entries


def add_loss(
    model: ModelT,
    kind: Literal[
        "mse",
        "l1",
        "huber",
        "softmax_cross_entropy",
        "binary_cross_entropy_with_logits",
        "cross_entropy",
        "binary_cross_entropy",
        "nll",
    ],
    output: str | None = None,
    *,
    reduction: Literal["mean", "sum"] = "mean",
    probabilities: bool = False,
    label_smoothing: float = 0.0,
    class_axis: int = -1,
    ignore_index: int | None = None,
    huber_delta: float = 1.0,
    example_weights: bool = False,
    label_name: str = "label",
    weight_name: str = "example_weight",
    loss_name: str = "loss",
    keep_outputs: bool = True,
) -> ModelT:
    """The model with a label input (and, with ``example_weights``, a weight input per example
    along axis 0) appended and a rank-0 loss as its first output, then the model's own outputs.

    ``kind``: ``mse``, ``l1``, ``huber`` (``huber_delta``), ``softmax_cross_entropy`` (logits;
    int64 class indices, or probabilities with ``probabilities=True``; ``label_smoothing``),
    ``binary_cross_entropy_with_logits``, ``nll`` (log-probabilities and class indices).
    ``reduction="mean"`` averages over every loss element (every position but the class axis);
    ``ignore_index`` drops labels equal to it from the loss and from the count.
    ``keep_outputs=False`` makes the loss the only output.
    """
    return transform(
        model,
        lambda data: _core.add_loss(
            data,
            kind,
            output or "",
            reduction,
            probabilities,
            float(label_smoothing),
            int(class_axis),
            ignore_index,
            float(huber_delta),
            example_weights,
            label_name,
            weight_name,
            loss_name,
            keep_outputs,
        ),
    )


def select_params(model: Model, include: Spec = "all", exclude: Spec = (), min_size: int = 0) -> list[str]:
    """Names of the float32/float64 initializers of rank >= 1 that ``include`` selects and
    ``exclude`` does not, in the graph's order. Entries: ``"all"``, exact names, glob patterns
    (``"layers.*.weight"``) or ``"re:REGEX"``; ``min_size`` drops smaller tensors."""
    inc, exc = _entries(include, "include"), _entries(exclude, "exclude")
    return list(inspect(model, lambda data: _core.select_params(data, inc, exc, int(min_size))))


def constants_to_initializers(model: ModelT, min_size: int = 2) -> ModelT:
    """The model with float Constant nodes of rank >= 1 and at least ``min_size`` elements
    (weights some exporters, e.g. jax2onnx, write as Constants) turned into initializers of the
    same names, so they can be selected as parameters."""
    return transform(model, lambda data: _core.constants_to_initializers(data, int(min_size)))


def train_step(
    model: ModelT,
    params: Spec = "all",
    *,
    exclude: Spec = (),
    min_size: int = 0,
    loss: str | None = None,
    optimizer: Literal["sgd", "adam", "adamw"] = "adamw",
    learning_rate: float = 1e-3,
    momentum: float = 0.0,
    nesterov: bool = False,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
    weight_decay: float = 0.0,
    no_decay: Spec = (),
    clip_norm: float = 0.0,
    dp_clip_norm: float | None = None,
    noise_multiplier: float | None = None,
    noise_seed: int | None = None,
    form: Literal["step", "accumulate", "apply"] = "step",
    surrogate: str | Sequence[str] | None = None,
) -> ModelT:
    """One training step of the loss model ``model`` as a pure-functional ONNX graph.

    Inputs: the model's runtime inputs, then the selected parameters (same names), the
    optimizer state (``<p>_m``/``<p>_v`` for Adam(W), ``<p>_velocity`` for SGD with momentum),
    ``step`` (int64, steps taken) and ``learning_rate`` (a float32 scalar; ``initial_state``
    gives ``learning_rate``). Outputs: the model's outputs, then ``<p>_new``, the new state and
    ``step_new``. ``feedback(step_model)`` pairs them; ``initial_state`` gives first values.

    SGD and Adam add ``weight_decay * p`` to the gradient; AdamW decays the parameter directly;
    ``no_decay`` exempts parameters. ``clip_norm`` clips the global gradient norm (and outputs
    ``grad_norm``). ``dp_clip_norm`` with ``noise_multiplier`` makes the step DP-SGD: every
    example's gradient clipped to ``dp_clip_norm``, summed, plus noise from a standard-normal
    input ``<p>_noise`` scaled by ``noise_multiplier * dp_clip_norm``, divided by the batch
    size; it outputs ``per_example_grad_norm``. With ``noise_seed`` the graph draws the noise
    itself (RandomNormalLike, seeded; the runtime advances it from run to run) instead.
    ``form="accumulate"`` only adds the gradient into ``<p>_grad_sum`` (and counts
    ``accumulated``); ``form="apply"`` updates from their mean. ``surrogate`` differentiates
    spikes by a surrogate (``onnax.with_surrogates``).
    """
    inc, exc, nd = _entries(params, "params"), _entries(exclude, "exclude"), _entries(no_decay, "no_decay")
    if surrogate is not None:
        from onnax.transforms import with_surrogates

        model = with_surrogates(model, surrogate)
    return transform(
        model,
        lambda data: _core.train_step(
            data,
            inc,
            exc,
            int(min_size),
            loss,
            optimizer,
            float(learning_rate),
            float(momentum),
            nesterov,
            float(beta1),
            float(beta2),
            float(epsilon),
            float(weight_decay),
            nd,
            float(clip_norm),
            None if dp_clip_norm is None else float(dp_clip_norm),
            None if noise_multiplier is None else float(noise_multiplier),
            noise_seed,
            form,
        ),
    )


def _proto(model: Model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    import onnx_ir as ir

    if isinstance(model, ir.Model):
        return ir.serde.serialize_model(model)
    raise TypeError(f"expected an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}")


def _state_record(step: Model) -> list[dict[str, Any]]:
    proto = step if isinstance(step, onnx.ModelProto) else None
    if proto is None:
        import onnx_ir as ir

        if not isinstance(step, ir.Model):
            raise TypeError(f"expected an onnx.ModelProto or an onnx_ir.Model, got {type(step).__name__}")
        text = step.metadata_props.get(STATE_KEY)
    else:
        text = next((p.value for p in proto.metadata_props if p.key == STATE_KEY), None)
    if text is None:
        raise ValueError(
            f"the model has no metadata_props[{STATE_KEY!r}]: it is not a training step onnax wrote. "
            "Fix: pass the model onnax.train_step returned"
        )
    record = json.loads(text)
    if not isinstance(record, list):
        raise ValueError(f"metadata_props[{STATE_KEY!r}] is not a JSON list; pass the step onnax wrote")
    return record


def feedback(step: Model) -> list[tuple[str, str | None]]:
    """Every input the next step reads from this one: ``(input, output)``, with ``None`` for
    inputs fed unchanged (parameters of an accumulation step)."""
    return [(str(e["input"]), None if e["output"] is None else str(e["output"])) for e in _state_record(step)]


def parameters(step: Model) -> list[str]:
    """The parameters a training step trains, in its input order."""
    return [str(e["input"]) for e in _state_record(step) if e["init"] == "param"]


def stored_names(model: Model) -> set[str]:
    """Names of the main graph's initializers and Constant-node outputs: what ``apply_params``
    can write."""
    proto = _proto(model)
    names = {t.name for t in proto.graph.initializer}
    names.update(n.output[0] for n in proto.graph.node if _is_constant(n))
    return names


def _is_constant(n: onnx.NodeProto) -> bool:
    return n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1


def _stored_values(model: Model) -> dict[str, np.ndarray]:
    """Initializers and Constant-node tensors of the main graph, by name."""
    proto = _proto(model)
    values = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    for n in proto.graph.node:
        if _is_constant(n):
            for a in n.attribute:
                if a.name == "value":
                    values.setdefault(n.output[0], numpy_helper.to_array(a.t))
    return values


def initial_state(model: Model, step: Model) -> dict[str, np.ndarray]:
    """The first values of the step's carried inputs: the parameters as stored in ``model``
    (the loss model the step was made from), zeros for the optimizer state, accumulators and
    step count, and the learning rate the step was made with. Feed them, with the data, to the
    first step (set ``state["learning_rate"]`` to follow a schedule)."""
    stored = _stored_values(model)
    inputs = {vi.name: vi for vi in _proto(step).graph.input}
    state: dict[str, np.ndarray] = {}
    for e in _state_record(step):
        name = str(e["input"])
        if e["init"] == "param":
            if name not in stored:
                raise ValueError(
                    f"the step trains parameter {name!r}, which the given model does not store. "
                    "Fix: pass the loss model the step was made from"
                )
            state[name] = np.array(stored[name])
            continue
        t = inputs[name].type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        value = float(e["value"]) if e["init"] == "value" else 0.0
        state[name] = np.full(shape, value, dtype=onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
    return state


def _stored_names(proto: onnx.ModelProto) -> set[str]:
    return {t.name for t in proto.graph.initializer} | {
        n.output[0] for n in proto.graph.node if _is_constant(n)
    }


def apply_params(model: ModelT, params: Mapping[str, np.ndarray]) -> ModelT:
    """``model`` with the given values in place of its initializers (or Constant-node tensors)
    of the same names: trained parameters written back. Shapes and dtypes must match. Parameters
    that ``constants_to_initializers`` lifted from inside local functions are written into the
    model with its functions inlined (as every transform sees it)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(_proto(model))
    remaining = dict(params)
    if proto.functions and not set(remaining) <= _stored_names(proto):
        # Parameters lifted from Constants inside local functions (jax2onnx's @onnx_function)
        # carry the names inlining gave them: write them into the model as onnax inlined it
        # (every Constant kept as a node: no size qualifies).
        inlined = onnx.ModelProto()
        inlined.ParseFromString(_core.constants_to_initializers(proto.SerializeToString(), 2**62))
        if set(remaining) <= _stored_names(inlined):
            proto = inlined
    targets: dict[str, onnx.TensorProto] = {t.name: t for t in proto.graph.initializer}
    for n in proto.graph.node:
        if _is_constant(n):
            for a in n.attribute:
                if a.name == "value":
                    targets.setdefault(n.output[0], a.t)
    for name, value in list(remaining.items()):
        target = targets.get(name)
        if target is None:
            continue
        old = numpy_helper.to_array(target)
        new = np.asarray(value)
        if new.shape != old.shape or new.dtype != old.dtype:
            raise ValueError(
                f"apply_params: {name!r} is stored as {old.dtype}{list(old.shape)} but the new value is "
                f"{new.dtype}{list(new.shape)}. Fix: pass values of the stored shape and dtype"
            )
        target.CopyFrom(numpy_helper.from_array(new, target.name))
        del remaining[name]
    if remaining:
        raise ValueError(
            f"apply_params: {sorted(remaining)} are neither initializers nor Constant outputs of the model "
            f"(it stores {len(targets)} tensors). Fix: pass the original model the parameters were "
            "trained from"
        )
    if isinstance(model, onnx.ModelProto):
        return proto  # type: ignore[return-value]
    import onnx_ir as ir

    return ir.serde.deserialize_model(proto)  # type: ignore[no-any-return,return-value]
