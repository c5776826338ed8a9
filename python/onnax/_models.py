"""Conversion between the model kinds users pass (onnx_ir.Model, onnx.ModelProto) and bytes.

Models cross into the C++ core as serialized bytes. A model's weights are most of its bytes
(AlexNet: 244 MB in 29 nodes) and no transform reads their values: they only need the
weights' names, dtypes and shapes. So large float initializers are held back: the core gets
each as a data-less stand-in (dims and dtype, its data marked as external under a unique
location) and the result gets the original tensor back in the stand-in's place. That spares
serializing, copying, parsing and re-serializing every weight several times over (1.3 s
against 0.13 s for AlexNet's vmap), and the result is byte for byte what the core makes from
the whole model. An onnx_ir model is serialized with the stand-ins in the first place (through
a view of it), so its weights are not even serialized, and its result shares the source's
tensor objects, as onnx_ir's own graph copies do, unless the transform renamed them.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import numpy as np
import onnx

if TYPE_CHECKING:
    import onnx_ir

    # What every transform takes and gives back: a ModelProto for a ModelProto, an onnx_ir
    # Model for an onnx_ir Model (a constrained type variable, so type checkers say which).
    ModelT = TypeVar("ModelT", onnx.ModelProto, onnx_ir.Model)
    # Either kind, where a function reads a model and returns something else.
    Model: TypeAlias = onnx.ModelProto | onnx_ir.Model
else:
    ModelT = TypeVar("ModelT")
    Model = Any
T = TypeVar("T")

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
    return _like(_parse_result(data), like)


def _parse_result(data: bytes) -> onnx.ModelProto:
    from google.protobuf.message import DecodeError

    from onnax._core import OnnaxError

    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as err:
        # The core wrote it, so what protobuf refuses is its depth: bodies nested past the
        # parser's limit of 100 messages (the command line refuses to save such a result).
        raise OnnaxError(
            f"the result cannot be read back ({err}): Loop/Scan/If bodies nest past the 100 messages "
            "protobuf readers accept, so no runtime could load it. Fix: flatten the model's control flow "
            "(fewer nested bodies) before transforming it"
        ) from None
    return proto


def _guarded(call: Callable[[bytes], T], data: bytes) -> T:
    """``call(data)``, with pybind11's argument-conversion errors cut to what they say about the
    arguments: they would otherwise print every argument, the serialized model included. The
    core runs under the context's onnax.limits."""
    from onnax import _core
    from onnax._limits import current

    before = _core.set_limits(*current())
    try:
        return call(data)
    except TypeError as e:
        message = str(e)
        if "incompatible function arguments" not in message:
            raise
        raise TypeError(message.split("\n\nInvoked with")[0]) from None
    except RuntimeError as e:
        if "Unable to cast Python instance" not in str(e):
            raise
        raise TypeError(
            "an argument has a type or value the core cannot take (an int beyond 64 bits, say)"
        ) from None
    finally:
        _core.set_limits(*before)


def inspect(model: Any, call: Callable[[bytes], T]) -> T:
    """Runs the core's ``call`` on ``model`` serialized with its large float initializers held
    back (for calls that read names, dtypes and shapes only, and return no model)."""
    light, _ = _hold_back(model) if isinstance(model, onnx.ModelProto) else _hold_back_ir(_ir_model(model))
    return _guarded(call, to_bytes(model) if light is None else light.SerializeToString())


def transform(model: ModelT, call: Callable[[bytes], bytes]) -> ModelT:
    """Runs the core's transform ``call`` (serialized model to serialized result) on ``model``
    with its large float initializers held back, and returns the result as the same kind of
    model as ``model``."""
    from onnax._limits import check_result_size

    light, held = _hold_back(model) if isinstance(model, onnx.ModelProto) else _hold_back_ir(_ir_model(model))
    if light is None:
        return from_bytes(_guarded(call, to_bytes(model)), model)  # type: ignore[no-any-return]
    data = _guarded(call, light.SerializeToString())
    result = _parse_result(data)
    stand_ins = _stand_ins(result, held)
    # (The core saw stand-ins: the result's size counts the tensors they stand for.)
    check_result_size(len(data) + sum(original.nbytes for _, original in stand_ins), "the transform")
    if data.count(held.prefix.encode()) != len(stand_ins):
        # The core placed a stand-in somewhere other than the result's initializers, or
        # reshaped or retyped one (none of today's transforms do): transform the whole model.
        return from_bytes(_guarded(call, to_bytes(model)), model)  # type: ignore[no-any-return]
    if isinstance(model, onnx.ModelProto) or any(t.name != original.name for t, original in stand_ins):
        # (onnx_ir names a tensor after the value holding it when it serializes: a shared tensor
        # under a new name would rename the source's. Renamed ones are copied.)
        for t, original in stand_ins:
            name = t.name  # (the transform's, which may differ)
            t.CopyFrom(original.proto())
            t.name = name
        return _like(result, model)  # type: ignore[no-any-return]
    return _put_back_ir(_like(result, model), model, held)  # type: ignore[no-any-return]


def store_inputs(model: ModelT, values: Mapping[str, Any]) -> ModelT:
    """``model`` with the graph inputs named in ``values`` turned into initializers holding those
    arrays (dtype and static dims must match the inputs' declarations)."""
    arrays = {str(k): np.asarray(v) for k, v in values.items()}
    if isinstance(model, onnx.ModelProto):
        declared = {vi.name: _declared(vi) for vi in model.graph.input}
    else:
        ir_model = _ir_model(model)
        declared = {
            v.name: (v.dtype.numpy(), [d if isinstance(d, int) else None for d in v.shape])
            for v in ir_model.graph.inputs
        }
    for name, array in arrays.items():
        if name not in declared:
            raise ValueError(
                f"stored names {name!r}, which is not a graph input of the result "
                f"(inputs: {sorted(declared)}). Fix: give it an axis in in_axes (an initializer "
                "without one stays shared and stored as it is)"
            )
        dtype, dims = declared[name]
        if (
            array.dtype != dtype
            or array.ndim != len(dims)
            or any(d is not None and d != n for d, n in zip(dims, array.shape, strict=True))
        ):
            shown = ["?" if d is None else d for d in dims]
            raise ValueError(
                f"stored[{name!r}] is {array.dtype}{list(array.shape)} but the input is declared "
                f"{dtype}{shown}. Fix: stack one weight set per example along the batch axis, "
                "in the stored dtype"
            )
    _check_one_batch(model, arrays)
    if isinstance(model, onnx.ModelProto):
        result = onnx.ModelProto()
        result.CopyFrom(model)
        kept = [vi for vi in result.graph.input if vi.name not in arrays]
        del result.graph.input[:]
        result.graph.input.extend(kept)
        result.graph.initializer.extend(onnx.numpy_helper.from_array(a, n) for n, a in arrays.items())
        return result  # type: ignore[return-value]
    import onnx_ir as ir

    for value in [v for v in ir_model.graph.inputs if v.name in arrays]:
        ir_model.graph.inputs.remove(value)
        value.const_value = ir.tensor(arrays[value.name], name=value.name)
        ir_model.graph.register_initializer(value)
    return model


def _check_one_batch(model: Any, arrays: Mapping[str, np.ndarray]) -> None:
    """The stored stacks agree on the batch size: each sits where its input declares the
    symbolic batch dim (the same dim_param in every batched input of a vmap result)."""
    import json

    steps = json.loads(_metadata(model).get("onnax.transforms", "[]") or "[]")
    axes = steps[-1].get("in_axes", {}) if steps and steps[-1].get("transform") == "vmap" else {}
    sizes = {n: a.shape[axes[n]] for n, a in arrays.items() if isinstance(axes.get(n), int)}
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"{n!r}: {s}" for n, s in sizes.items())
        raise ValueError(
            f"stored stacks disagree on the batch size ({shown}). Fix: stack the same number of weight "
            "sets for every stored input"
        )


def _metadata(model: Any) -> dict[str, str]:
    if isinstance(model, onnx.ModelProto):
        return {p.key: p.value for p in model.metadata_props}
    return dict(_ir_model(model).metadata_props)


def _declared(vi: onnx.ValueInfoProto) -> tuple[np.dtype, list[int | None]]:
    tt = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)), dims


def _as_proto(model: Any) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    import onnx_ir as ir

    return ir.serde.serialize_model(_ir_model(model))


def _ir_model(model: Any) -> Any:
    """`model` when it is an onnx_ir.Model; the TypeError users get for any other kind."""
    import onnx_ir as ir

    if isinstance(model, ir.Model):
        return model
    raise TypeError(
        f"onnax expects an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}. "
        "Fix: load the model with onnx.load(path) or onnx_ir.load(path)"
    )


def _like(proto: onnx.ModelProto, like: Any) -> Any:
    if isinstance(like, onnx.ModelProto):
        return proto
    import onnx_ir as ir

    return ir.serde.deserialize_model(proto)


class _HeldTensor:
    """One held-back initializer: its name, dtype and dims, and its data (a TensorProto, or the
    onnx_ir value holding the tensor, serialized only if a result needs a copy)."""

    def __init__(self, name: str, data_type: int, dims: list[int], source: Any) -> None:
        self.name = name
        self.data_type = data_type
        self.dims = dims
        self._source = source

    @property
    def nbytes(self) -> int:
        """The size of its data (what its stand-in leaves out of a serialized result)."""
        itemsize = int(onnx.helper.tensor_dtype_to_np_dtype(self.data_type).itemsize)
        return int(np.prod(self.dims, dtype=np.int64)) * itemsize

    def proto(self) -> onnx.TensorProto:
        if isinstance(self._source, onnx.TensorProto):
            return self._source
        import onnx_ir as ir

        t = ir.serde.serialize_tensor(self._source.const_value)
        t.name = self.name
        return t


class _Held:
    """The initializers held back from one transform, by their stand-ins' locations."""

    def __init__(self) -> None:
        self.prefix = f"onnax-held-back-{uuid.uuid4().hex}-"
        self.tensors: dict[str, _HeldTensor] = {}

    def stand_in(
        self, tensor: onnx.TensorProto, name: str, data_type: int, dims: list[int], source: Any
    ) -> None:
        """Makes `tensor` the data-less stand-in of the initializer `name` (whose data is `source`)."""
        location = f"{self.prefix}{len(self.tensors)}"
        self.tensors[location] = _HeldTensor(name, data_type, dims, source)
        tensor.name = name
        tensor.data_type = data_type
        tensor.dims.extend(dims)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        entry = tensor.external_data.add()
        entry.key = "location"
        entry.value = location


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
    for t in initializers:
        if _worth_holding_back(t):
            held.stand_in(light.graph.initializer.add(), t.name, t.data_type, list(t.dims), t)
        else:
            light.graph.initializer.append(t)
    return light, held


def _hold_back_ir(model: Any) -> tuple[onnx.ModelProto | None, _Held]:
    """_hold_back for an onnx_ir model, serialized with stand-ins in the first place: onnx_ir's
    serializer is given a view of the model whose main graph lists stand-in initializers, so
    the weights are never copied into a proto at all."""
    import onnx_ir as ir

    held = _Held()
    heavy = {
        name: value
        for name, value in model.graph.initializers.items()
        if _worth_holding_back_ir(value.const_value)
    }
    if not heavy:
        return None, held
    light = ir.serde.serialize_model(_WithStandIns(model, set(heavy)))  # type: ignore[arg-type]
    for t in light.graph.initializer:
        value = heavy.get(t.name)
        if value is not None:
            dims = [int(d) for d in value.const_value.shape]
            t.Clear()  # (the empty placeholder's fields)
            held.stand_in(t, value.name, int(value.const_value.dtype), dims, value)
    return light, held


def _worth_holding_back_ir(tensor: Any) -> bool:
    import onnx_ir as ir

    return (
        tensor is not None
        and not isinstance(tensor, ir.ExternalTensor)  # (serializes without its data anyway)
        and int(tensor.dtype) in _FLOAT_TYPES
        and tensor.shape.is_static()
        and math.prod(int(d) for d in tensor.shape) >= _HOLD_BACK_MIN_ELEMENTS
    )


class _WithStandIns:
    """A read-only view of an onnx_ir model whose main graph's initializers named in `heavy`
    hold empty stand-in tensors of their dtype, so serializing the view skips their data. It
    answers everything else from the model itself and changes nothing in it."""

    def __init__(self, model: Any, heavy: set[str]) -> None:
        self._model = model
        self.graph = _GraphWithStandIns(model.graph, heavy)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class _ValueWithStandIn:
    """An initializer's value as the view shows it: everything its own (type, shape, doc string,
    metadata, quantization annotation), but an empty tensor of its dtype for its data."""

    def __init__(self, value: Any) -> None:
        import onnx_ir as ir

        self._value = value
        self.const_value = ir.Tensor(np.zeros(0, dtype=value.const_value.dtype.numpy()), name=value.name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._value, name)


class _GraphWithStandIns:
    def __init__(self, graph: Any, heavy: set[str]) -> None:
        self._graph = graph
        self.initializers = dict(graph.initializers)
        for name in heavy:
            self.initializers[name] = _ValueWithStandIn(graph.initializers[name])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._graph, name)

    def __iter__(self) -> Any:
        return iter(self._graph)

    def __len__(self) -> int:
        return len(self._graph)


def _held_original(t: onnx.TensorProto, held: _Held) -> _HeldTensor | None:
    """The tensor the stand-in `t` holds the place of (None: `t` is no intact stand-in)."""
    if t.data_location != onnx.TensorProto.EXTERNAL or len(t.external_data) != 1:
        return None
    original = held.tensors.get(t.external_data[0].value)
    if original is None or t.data_type != original.data_type or list(t.dims) != original.dims:
        return None
    return original


def _stand_ins(result: onnx.ModelProto, held: _Held) -> list[tuple[onnx.TensorProto, _HeldTensor]]:
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
