"""Representative inputs: seeded random values for every runtime input (overridable by name,
or from an ``.npz`` file), and the float64 variant of a model the references run on."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

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
) -> Feeds:
    """Values for every runtime input of ``model``: ``given`` ones (checked against the declared
    dtype and rank), the rest seeded random with symbolic dims from ``dims`` (default 3)."""
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
        feeds[vi.name] = random_tensor(rng, dtype, shape)
    return feeds


_DTYPE_ATTRS = {("to", "Cast"), ("dtype", "EyeLike"), ("dtype", "RandomNormal"), ("dtype", "RandomUniform")}


def convert_model_dtype(model: onnx.ModelProto, src: int, dst: int) -> onnx.ModelProto:
    """A copy of ``model`` with every ``src`` float type (inputs, outputs, value_info,
    initializers, Cast ``to``, tensor attributes) rewritten to ``dst``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)

    def fix_vi(vi: onnx.ValueInfoProto) -> None:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == src:
            vi.type.tensor_type.elem_type = dst

    def fix_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
        if t.data_type != src:
            return t
        arr = numpy_helper.to_array(t).astype(np_dtype(dst))
        return numpy_helper.from_array(arr, name=t.name)

    def fix_graph(g: onnx.GraphProto) -> None:
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            fix_vi(vi)
        new_inits = [fix_tensor(t) for t in g.initializer]
        del g.initializer[:]
        g.initializer.extend(new_inits)
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    a.t.CopyFrom(fix_tensor(a.t))
                elif a.type == onnx.AttributeProto.GRAPH:
                    fix_graph(a.g)
                elif (a.name, n.op_type) in _DTYPE_ATTRS and a.i == src:
                    a.i = dst

    fix_graph(out.graph)
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
