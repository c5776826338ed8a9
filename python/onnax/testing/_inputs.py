"""Representative inputs: seeded random values for every runtime input (overridable by name,
or from an ``.npz`` file), and the float64 variant of a model the references run on."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnax.testing._models import ValidationInputError, runtime_inputs

# Length of a symbolic (or unknown) dimension when the caller names none: small, not 1, so a
# broadcast or an axis mix-up shows.
DEFAULT_DIM = 3

Feeds = dict[str, np.ndarray]


def np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def random_tensor(rng: np.random.Generator, dtype: np.dtype, shape: Sequence[int]) -> np.ndarray:
    """Standard normal floats, small integers (valid as indices into short axes), fair bools."""
    shape = tuple(shape)
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.issubdtype(dtype, np.floating):
        return np.asarray(rng.standard_normal(shape), dtype=dtype)
    if np.issubdtype(dtype, np.unsignedinteger):
        return np.asarray(rng.integers(0, 10, size=shape), dtype=dtype)
    if np.issubdtype(dtype, np.integer):
        return np.asarray(rng.integers(-5, 6, size=shape), dtype=dtype)
    raise ValidationInputError(f"no random generator for dtype {dtype}. Fix: pass this input's values")


def load_inputs(inputs: Mapping[str, np.ndarray] | str | os.PathLike[str] | None) -> Feeds:
    if inputs is None:
        return {}
    if isinstance(inputs, Mapping):
        return {str(k): np.asarray(v) for k, v in inputs.items()}
    path = os.fspath(inputs)
    if not os.path.exists(path):
        raise ValidationInputError(f"the inputs file '{path}' does not exist. Fix: check the path")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: np.asarray(data[k]) for k in data.files}
    except Exception as err:
        raise ValidationInputError(
            f"cannot read '{path}' as a NumPy .npz file ({type(err).__name__}: {str(err)[:200]}). "
            "Fix: save the inputs with numpy.savez(path, name=array, ...)"
        ) from err


def make_feeds(
    model: onnx.ModelProto,
    given: Mapping[str, np.ndarray],
    seed: int,
    dims: Mapping[str, int] | None = None,
    ranges: Mapping[str, int] | None = None,
) -> Feeds:
    """Values for every runtime input of ``model``: ``given`` ones (checked against the declared
    dtype and rank), the rest seeded random with symbolic dims from ``dims`` (default 3);
    integer inputs named in ``ranges`` (indices, labels) drawn in ``[0, ranges[name])``."""
    dims = dict(dims or {})
    sig = runtime_inputs(model)
    names = [v.name for v in sig]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValidationInputError(
            f"inputs {unknown} are not runtime inputs of the generated model; available: {names}. "
            "Fix: name the arrays after the generated model's inputs"
        )
    rng = np.random.default_rng(seed)
    feeds: Feeds = {}
    for vi in sig:
        tt = vi.type.tensor_type
        dtype = np_dtype(tt.elem_type)
        declared = list(tt.shape.dim) if tt.HasField("shape") else None
        if vi.name in given:
            arr = given[vi.name]
            if arr.dtype != dtype:
                raise ValidationInputError(
                    f"input '{vi.name}': dtype {arr.dtype}, the model declares {dtype}. "
                    f"Fix: save it as {dtype}"
                )
            if declared is not None and arr.ndim != len(declared):
                raise ValidationInputError(
                    f"input '{vi.name}': rank {arr.ndim} (shape {list(arr.shape)}), the model declares "
                    f"rank {len(declared)}. Fix: give an array of rank {len(declared)}"
                )
            feeds[vi.name] = arr
            continue
        if declared is None:
            raise ValidationInputError(
                f"input '{vi.name}' has no declared shape, so no random value can be drawn. "
                "Fix: pass its values (inputs={...} or --inputs FILE.npz)"
            )
        shape = []
        for d in declared:
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            else:
                shape.append(int(dims.get(d.dim_param, DEFAULT_DIM)) if d.dim_param else DEFAULT_DIM)
        if ranges and vi.name in ranges and np.issubdtype(dtype, np.integer):
            feeds[vi.name] = np.asarray(rng.integers(0, max(ranges[vi.name], 1), size=shape), dtype=dtype)
        else:
            feeds[vi.name] = random_tensor(rng, dtype, shape)
    return feeds


# Consumers that read an integer input as indices into an axis: op -> (input position,
# where the axis length comes from).
_INDEX_USERS = {
    "Gather": 1,
    "GatherElements": 1,
    "OneHot": 0,
    "SoftmaxCrossEntropyLoss": 1,
    "NegativeLogLikelihoodLoss": 1,
}
# Ops that pass integer values through unchanged (only their shape or type may change).
_PASS_THROUGH = {"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand"}


def index_ranges(model: onnx.ModelProto, dims: Mapping[str, int] | None = None) -> dict[str, int]:
    """For integer runtime inputs used as indices (Gather, GatherElements, OneHot, and the
    labels of SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss, possibly through Cast,
    Reshape, Squeeze ...), the length of the axis they index, where the graph tells it
    (initializer dims, declared or inferred static shapes, symbolic dims from ``dims``)."""
    dims = dict(dims or {})
    graph = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:
        inferred = graph
    shapes: dict[str, list[int | None]] = {t.name: list(t.dims) for t in graph.initializer}
    for vi in [*inferred.input, *inferred.value_info, *inferred.output]:
        tt = vi.type.tensor_type
        if vi.name in shapes or not tt.HasField("shape"):
            continue
        shapes[vi.name] = [
            int(d.dim_value)
            if d.HasField("dim_value")
            else dims.get(d.dim_param, DEFAULT_DIM)
            if d.dim_param
            else None
            for d in tt.shape.dim
        ]
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def axis_length(node: onnx.NodeProto) -> int | None:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "OneHot":
            depth = consts.get(node.input[1])
            return None if depth is None else int(np.asarray(depth).reshape(-1)[0])
        shape = shapes.get(node.input[0])
        if not shape:
            return None
        axis = 1 if node.op_type.endswith("Loss") else int(attrs.get("axis", 0)) % len(shape)
        return shape[axis] if axis < len(shape) else None

    out: dict[str, int] = {}
    integer = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT8}
    for vi in runtime_inputs(model):
        if vi.type.tensor_type.elem_type not in integer:
            continue
        frontier, seen, lengths = [vi.name], set(), []
        while frontier:
            name = frontier.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in consumers.get(name, []):
                if node.op_type in _PASS_THROUGH and node.input[0] == name:
                    frontier.extend(node.output)
                elif (
                    node.op_type in _INDEX_USERS
                    and len(node.input) > _INDEX_USERS[node.op_type]
                    and (node.input[_INDEX_USERS[node.op_type]] == name)
                ):
                    n = axis_length(node)
                    if n:
                        lengths.append(n)
        if lengths:
            out[vi.name] = min(lengths)
    return out


_DTYPE_ATTRS = {("to", "Cast"), ("dtype", "EyeLike"), ("dtype", "RandomNormal"), ("dtype", "RandomUniform")}


def convert_model_dtype(model: onnx.ModelProto, src: int | Collection[int], dst: int) -> onnx.ModelProto:
    """A copy of ``model`` with every ``src`` float type (one, or several at once: the model
    is copied once) in inputs, outputs, value_info, initializers, Cast ``to`` and tensor
    attributes rewritten to ``dst``."""
    srcs = {src} if isinstance(src, int) else set(src)
    out = onnx.ModelProto()
    out.CopyFrom(model)

    def fix_vi(vi: onnx.ValueInfoProto) -> None:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in srcs:
            vi.type.tensor_type.elem_type = dst

    def fix_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
        if t.data_type not in srcs:
            return t
        arr = numpy_helper.to_array(t).astype(np_dtype(dst))
        return numpy_helper.from_array(arr, name=t.name)

    def fix_graph(g: onnx.GraphProto) -> None:
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            fix_vi(vi)
        new_inits = [fix_tensor(t) for t in g.initializer]
        del g.initializer[:]
        g.initializer.extend(new_inits)
        fix_nodes(g.node)

    def fix_nodes(nodes: Sequence[onnx.NodeProto]) -> None:
        for n in nodes:
            if n.op_type == "Constant" and TensorProto.FLOAT in srcs:
                for a in list(n.attribute):
                    if a.name in ("value_float", "value_floats"):
                        value = np.asarray(a.f if a.name == "value_float" else list(a.floats))
                        n.attribute.remove(a)
                        n.attribute.append(
                            helper.make_attribute(
                                "value", numpy_helper.from_array(value.astype(np_dtype(dst)))
                            )
                        )
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    a.t.CopyFrom(fix_tensor(a.t))
                elif a.type == onnx.AttributeProto.GRAPH:
                    fix_graph(a.g)
                elif (a.name, n.op_type) in _DTYPE_ATTRS and a.i in srcs:
                    a.i = dst

    fix_graph(out.graph)
    for f in out.functions:  # model-local functions: their constants and casts too
        fix_nodes(f.node)
        for vi in f.value_info:
            fix_vi(vi)
    return out


def lift_initializers(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` in which the initializers ``names`` are runtime graph inputs (so a
    finite difference can perturb them)."""
    present = {t.name for t in model.graph.initializer}
    names = [n for n in names if n in present]
    if not names:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [t for t in out.graph.initializer if t.name not in names]
    lifted = [t for t in out.graph.initializer if t.name in names]
    del out.graph.initializer[:]
    out.graph.initializer.extend(keep)
    listed = {v.name for v in out.graph.input}
    for t in lifted:
        if t.name not in listed:
            out.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out
