"""Conversion between the model kinds users pass (onnx_ir.Model, onnx.ModelProto) and bytes."""

from __future__ import annotations

from typing import Any, TypeVar

import onnx

ModelT = TypeVar("ModelT")


def to_bytes(model: Any) -> bytes:
    """Serialize an ``onnx.ModelProto`` or ``onnx_ir.Model`` for the C++ core."""
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    import onnx_ir as ir

    if isinstance(model, ir.Model):
        return ir.serde.serialize_model(model).SerializeToString()
    raise TypeError(
        f"onnax expects an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}. "
        "Fix: load the model with onnx.load(path) or onnx_ir.load(path)"
    )


def from_bytes(data: bytes, like: Any) -> Any:
    """Deserialize the core's result as the same kind of model as ``like``."""
    proto = onnx.ModelProto()
    proto.ParseFromString(data)
    if isinstance(like, onnx.ModelProto):
        return proto
    import onnx_ir as ir

    return ir.serde.deserialize_model(proto)
