"""Conversion between the model kinds users pass (onnx_ir.Model, onnx.ModelProto) and bytes.

Models cross into the C++ core as serialized bytes. A model's weights are most of its bytes
(AlexNet: 244 MB in 29 nodes) and no transform reads their values: they only need the
weights' names, dtypes and shapes. So large float initializers are held back: the core gets
each as a data-less stand-in (dims and dtype, its data marked as external under a unique
location) and the result gets the original tensor back in the stand-in's place. That spares
serializing, copying, parsing and re-serializing every weight several times over (1.3 s
against 0.13 s for AlexNet's vmap), and the result is byte for byte what the core makes from
the whole model. (An onnx_ir result shares the source's tensor objects, as onnx_ir's own graph
copies do, unless the transform renamed them.)
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import onnx

ModelT = TypeVar("ModelT")

_FLOAT_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
    }
)
# Smaller tensors stay in: scales, epsilons and clip bounds are read by shape inference and by
# rules, and holding back a few bytes saves nothing.
_HOLD_BACK_MIN_ELEMENTS = 1024


def to_bytes(model: Any) -> bytes:
    """Serialize an ``onnx.ModelProto`` or ``onnx_ir.Model`` for the C++ core."""
    return _as_proto(model).SerializeToString()


def from_bytes(data: bytes, like: Any) -> Any:
    """Deserialize the core's result as the same kind of model as ``like``."""
    proto = onnx.ModelProto()
    proto.ParseFromString(data)
    return _like(proto, like)


def transform(model: ModelT, call: Callable[[bytes], bytes]) -> ModelT:
    """Runs the core's transform ``call`` (serialized model to serialized result) on ``model``
    with its large float initializers held back, and returns the result as the same kind of
    model as ``model``."""
    proto = _as_proto(model)
    light, held = _hold_back(proto)
    if light is None:
        return from_bytes(call(proto.SerializeToString()), model)  # type: ignore[no-any-return]
    data = call(light.SerializeToString())
    result = onnx.ModelProto()
    result.ParseFromString(data)
    stand_ins = _stand_ins(result, held)
    if data.count(held.prefix.encode()) != len(stand_ins):
        # The core placed a stand-in somewhere other than the result's initializers, or
        # reshaped or retyped one (none of today's transforms do): transform the whole model.
        return from_bytes(call(proto.SerializeToString()), model)  # type: ignore[no-any-return]
    if isinstance(model, onnx.ModelProto) or any(t.name != original.name for t, original in stand_ins):
        # (onnx_ir names a tensor after the value holding it when it serializes: a shared tensor
        # under a new name would rename the source's. Renamed ones are copied.)
        for t, original in stand_ins:
            name = t.name  # (the transform's, which may differ)
            t.CopyFrom(original)
            t.name = name
        return _like(result, model)  # type: ignore[no-any-return]
    return _put_back_ir(_like(result, model), model, held)  # type: ignore[no-any-return]


def _as_proto(model: Any) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    import onnx_ir as ir

    if isinstance(model, ir.Model):
        return ir.serde.serialize_model(model)
    raise TypeError(
        f"onnax expects an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}. "
        "Fix: load the model with onnx.load(path) or onnx_ir.load(path)"
    )


def _like(proto: onnx.ModelProto, like: Any) -> Any:
    if isinstance(like, onnx.ModelProto):
        return proto
    import onnx_ir as ir

    return ir.serde.deserialize_model(proto)


class _Held:
    """The initializers held back from one transform, by their stand-ins' locations."""

    def __init__(self) -> None:
        self.prefix = f"onnax-held-back-{uuid.uuid4().hex}-"
        self.tensors: dict[str, onnx.TensorProto] = {}


def _worth_holding_back(t: onnx.TensorProto) -> bool:
    # (Decided from the dims: reading raw_data would copy it.)
    return (
        t.data_type in _FLOAT_TYPES
        and t.data_location != onnx.TensorProto.EXTERNAL
        and not t.HasField("segment")
        and math.prod(t.dims) >= _HOLD_BACK_MIN_ELEMENTS
    )


def _has_unknown_fields(*messages: Any) -> bool:
    from google.protobuf import unknown_fields

    return any(len(unknown_fields.UnknownFieldSet(m)) > 0 for m in messages)


def _copy_fields(source: Any, target: Any, skip: str) -> None:
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _hold_back(model: onnx.ModelProto) -> tuple[onnx.ModelProto | None, _Held]:
    """The model with each large float initializer of its main graph replaced by a stand-in
    (None: nothing to hold back), and the originals."""
    held = _Held()
    initializers = model.graph.initializer
    if not any(_worth_holding_back(t) for t in initializers) or _has_unknown_fields(model, model.graph):
        # (Fields of a newer schema than the onnx package's: the copy below would drop them,
        # the core keeps them.)
        return None, held
    light = onnx.ModelProto()
    _copy_fields(model, light, skip="graph")
    _copy_fields(model.graph, light.graph, skip="initializer")
    for i, t in enumerate(initializers):
        if not _worth_holding_back(t):
            light.graph.initializer.append(t)
            continue
        location = f"{held.prefix}{i}"
        held.tensors[location] = t
        stand_in = light.graph.initializer.add()
        stand_in.name = t.name
        stand_in.data_type = t.data_type
        stand_in.dims.extend(t.dims)
        stand_in.data_location = onnx.TensorProto.EXTERNAL
        entry = stand_in.external_data.add()
        entry.key = "location"
        entry.value = location
    return light, held


def _held_original(t: onnx.TensorProto, held: _Held) -> onnx.TensorProto | None:
    """The tensor the stand-in `t` holds the place of (None: `t` is no intact stand-in)."""
    if t.data_location != onnx.TensorProto.EXTERNAL or len(t.external_data) != 1:
        return None
    original = held.tensors.get(t.external_data[0].value)
    if original is None or t.data_type != original.data_type or list(t.dims) != list(original.dims):
        return None
    return original


def _stand_ins(result: onnx.ModelProto, held: _Held) -> list[tuple[onnx.TensorProto, onnx.TensorProto]]:
    """The result's intact stand-ins, each with the tensor it holds the place of."""
    pairs = []
    for t in result.graph.initializer:
        original = _held_original(t, held)
        if original is not None:
            pairs.append((t, original))
    return pairs


def _put_back_ir(result: Any, source: Any, held: _Held) -> Any:
    """Puts the held-back tensors into an onnx_ir result by sharing the source's tensor objects
    (as onnx_ir's own graph copies do) instead of copying their data."""
    import onnx_ir as ir

    for value in result.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor) and tensor.location in held.tensors:
            value.const_value = source.graph.initializers[held.tensors[tensor.location].name].const_value
    return result
