"""Loading models for validation, and the facts about them a report needs."""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from onnax._models import to_bytes

ModelLike = Any  # a path, an onnx.ModelProto or an onnx_ir.Model


class ValidationInputError(ValueError):
    """A model or data file cannot be used (missing, truncated, wrong names): not a failed check."""


def load(model: ModelLike, what: str) -> onnx.ModelProto:
    """``model`` as a ModelProto with external data loaded; clear errors for bad files."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, str | os.PathLike):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise ValidationInputError(f"the {what} model file '{path}' does not exist. Fix: check the path")
        if os.path.isdir(path):
            raise ValidationInputError(f"the {what} model '{path}' is a directory. Fix: pass a .onnx file")
        if os.path.getsize(path) == 0:
            raise ValidationInputError(
                f"the {what} model file '{path}' is empty (0 bytes). Fix: re-export or re-download it"
            )
        try:
            return onnx.load_model(path)
        except (DecodeError, RuntimeError, ValueError, OSError) as err:
            raise ValidationInputError(
                f"cannot read the {what} model '{path}' as ONNX ({type(err).__name__}: {str(err)[:200]}); "
                "the file is truncated, corrupt or not an ONNX model. Fix: re-export or re-download it"
            ) from err
    proto = onnx.ModelProto()
    proto.ParseFromString(to_bytes(model))
    return proto


def runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]


def opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import}


def default_opset(model: onnx.ModelProto) -> int:
    return opsets(model).get("ai.onnx", 0)


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph in it (If/Loop/Scan bodies, nested ones too), depth first."""
    yield graph
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from graphs(a.g)
            for sub in a.graphs:
                yield from graphs(sub)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Operator counts of the main graph (subgraphs counted too: they run as well)."""
    counts = collections.Counter(n.op_type for g in graphs(model.graph) for n in g.node)
    return dict(sorted(counts.items()))


def metadata(model: onnx.ModelProto, key: str) -> str | None:
    for p in model.metadata_props:
        if p.key == key:
            return str(p.value)
    return None
