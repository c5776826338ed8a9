"""Numerical oracle for ``onnax.vmap``.

The definition being checked is ``vmap(f)(X)[i] == f(X[i])``: a vmapped model run once on a
batch must agree with the source model run once per example, the per-example results stacked
along the output's batch axis.

Models with an ``ai.onnx`` opset up to :data:`ORT_MAX_OPSET` run on ONNX Runtime; newer
opsets (and models ONNX Runtime has no kernel for) run on ``onnx.reference.ReferenceEvaluator``.
Sessions are cached by the model's serialized bytes, so a vmapped model is loaded once and then
run for every batch size. Random inputs come from ``onnax.testing`` (shared with
``onnax validate``; ``np_dtype`` and ``random_tensor`` are re-exported here).
"""

from __future__ import annotations

import hashlib
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnax.testing._inputs import np_dtype, random_tensor
from onnx import helper
from onnx.reference import ReferenceEvaluator

_ROOT = Path(__file__).resolve().parents[3]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))
from conformance.backend_vmap import _spec_loop  # noqa: E402

ORT_MAX_OPSET = 26

Axis = int | None
InAxes = int | None | Sequence[Axis] | Mapping[str, Axis]
OutAxes = int | Sequence[int]
Gen = Callable[[np.random.Generator], np.ndarray]
Dim = int | str | None
Shape = Sequence[Dim] | None
ValueSpec = tuple[str, int, Shape]

# --------------------------------------------------------------------------------------------
# Model construction


# Every Reduce* op (the reductions the rule tests and the scalar-reduction tests cover).
REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]


def ir_version_for(opset: int) -> int:
    """An IR version ONNX Runtime 1.31 accepts for ``opset`` (newer ones for 27+)."""
    if opset <= 26:
        return 10
    return 13 if opset == 27 else 14


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[ValueSpec],
    outputs: Sequence[str | ValueSpec],
    *,
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = 18,
    extra_opsets: Mapping[str, int] | None = None,
    keep_value_info: bool = False,
    infer: bool = True,
) -> onnx.ModelProto:
    """Builds a model; outputs given by name get their type from ONNX shape inference."""
    graph_inputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    graph_outputs = []
    for out in outputs:
        if isinstance(out, str):
            graph_outputs.append(helper.make_value_info(out, onnx.TypeProto()))
        else:
            graph_outputs.append(helper.make_tensor_value_info(*out))
    inits = [onnx.numpy_helper.from_array(np.asarray(v), name=k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(list(nodes), "g", graph_inputs, graph_outputs, initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    for domain, version in (extra_opsets or {}).items():
        opsets.append(helper.make_opsetid(domain, version))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="onnax-tests")
    model.ir_version = ir_version_for(opset)
    if infer:
        inferred = onnx.shape_inference.infer_shapes(model)
        by_name = {v.name: v for v in inferred.graph.output}
        for out in model.graph.output:
            if not out.type.HasField("tensor_type") and out.name in by_name:
                out.type.CopyFrom(by_name[out.name].type)
        if keep_value_info:
            model.graph.value_info.extend(inferred.graph.value_info)
    if all(o.type.tensor_type.HasField("shape") for o in model.graph.output):
        onnx.checker.check_model(model)
    return model


def node(
    op: str, inputs: Sequence[str], outputs: Sequence[str], name: str | None = None, **attrs: Any
) -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs), name=name or f"{op.lower()}_node", **attrs)


# --------------------------------------------------------------------------------------------
# Running models


_SESSIONS: dict[tuple[str, bytes], Any] = {}


def default_opset(model: onnx.ModelProto) -> int:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return int(op.version)
    return 0


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _ort_session(data: bytes) -> ort.InferenceSession:
    key = ("ort", _digest(data))
    if key not in _SESSIONS:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.log_severity_level = 3
        _SESSIONS[key] = ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])
    return _SESSIONS[key]


def _ref_session(model: onnx.ModelProto, data: bytes) -> ReferenceEvaluator:
    key = ("ref", _digest(data))
    if key not in _SESSIONS:
        # The conformance runner's spec-following Loop: onnx's reference Loop runs no iteration
        # without a condition input and concatenates scan outputs instead of stacking them.
        _SESSIONS[key] = ReferenceEvaluator(model, new_ops=[_spec_loop()])
    return _SESSIONS[key]


def _ort_lacks_kernel(err: Exception) -> bool:
    text = str(err)
    return (
        "NOT_IMPLEMENTED" in text
        or "Could not find an implementation" in text
        or "Batchwise recurrent operations (layout == 1) are not supported" in text
        or "is not a registered function/op" in text  # (an op of a preview domain)
    )


def choose_backend(model: onnx.ModelProto) -> str:
    """``"ort"`` when ONNX Runtime can load the model, otherwise ``"ref"``."""
    if default_opset(model) > ORT_MAX_OPSET:
        return "ref"
    try:
        _ort_session(model.SerializeToString())
    except Exception as err:
        if _ort_lacks_kernel(err):
            return "ref"
        raise
    return "ort"


def run_model(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], backend: str | None = None
) -> list[np.ndarray]:
    """Runs ``model`` on ``feeds``; returns the outputs in graph order."""
    data = model.SerializeToString()
    backend = backend or choose_backend(model)
    names = [o.name for o in model.graph.output]
    if backend == "ort":
        try:
            sess = _ort_session(data)
        except Exception as err:
            if not _ort_lacks_kernel(err):
                raise
            warnings.warn(
                f"ONNX Runtime cannot load the model ({str(err)[:200]}); using ReferenceEvaluator",
                stacklevel=2,
            )
            backend = "ref"
        else:
            return [np.asarray(v) for v in sess.run(names, dict(feeds))]
    ref = _ref_session(model, data)
    return [np.asarray(v) for v in ref.run(names, dict(feeds))]


# --------------------------------------------------------------------------------------------
# Inputs


def input_signature(model: onnx.ModelProto) -> list[tuple[str, np.dtype, list[Dim] | None]]:
    init_names = {t.name for t in model.graph.initializer}
    sig = []
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        tt = vi.type.tensor_type
        shape: list[Dim] | None = None
        if tt.HasField("shape"):
            shape = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    shape.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    shape.append(d.dim_param)
                else:
                    shape.append(None)
        sig.append((vi.name, np_dtype(tt.elem_type), shape))
    return sig


def concrete_shape(name: str, shape: list[Dim] | None, dims: Mapping[str, int]) -> list[int]:
    if shape is None:
        raise ValueError(f"input {name!r} has no shape; give a generator for it")
    out = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, str) and d in dims:
            out.append(dims[d])
        else:
            raise ValueError(f"input {name!r}: no value for dim {d!r}; pass dims={{...}} or a generator")
    return out


# --------------------------------------------------------------------------------------------
# Axes


def normalize_in_axes(in_axes: InAxes, names: Sequence[str]) -> dict[str, Axis]:
    if in_axes is None or isinstance(in_axes, int):
        return dict.fromkeys(names, in_axes)
    if isinstance(in_axes, Mapping):
        unknown = set(in_axes) - set(names)
        assert not unknown, f"test bug: unknown in_axes names {unknown}"
        return {n: in_axes.get(n) for n in names}
    axes = list(in_axes)
    assert len(axes) == len(names), f"test bug: {len(axes)} in_axes for inputs {names}"
    return dict(zip(names, axes, strict=True))


def normalize_out_axes(out_axes: OutAxes, names: Sequence[str]) -> dict[str, int]:
    if isinstance(out_axes, int):
        return dict.fromkeys(names, out_axes)
    axes = list(out_axes)
    assert len(axes) == len(names), f"test bug: {len(axes)} out_axes for outputs {names}"
    return dict(zip(names, axes, strict=True))


def positive_axis(axis: int, rank: int) -> int:
    """``axis`` for inserting a new dim into a rank-``rank`` tensor, made non-negative."""
    assert -(rank + 1) <= axis <= rank, f"test bug: axis {axis} for rank {rank}"
    return axis + rank + 1 if axis < 0 else axis


# --------------------------------------------------------------------------------------------
# Model-level checks


def to_proto(model: Any) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    import onnx_ir

    return onnx_ir.serde.serialize_model(model)


def _dims(vi: onnx.ValueInfoProto) -> list[onnx.TensorShapeProto.Dimension] | None:
    tt = vi.type.tensor_type
    return list(tt.shape.dim) if tt.HasField("shape") else None


def _dim_str(d: onnx.TensorShapeProto.Dimension) -> str:
    if d.HasField("dim_value"):
        return str(d.dim_value)
    return d.dim_param if d.HasField("dim_param") else "?"


def check_signature(
    source: onnx.ModelProto,
    result: onnx.ModelProto,
    in_axes: Mapping[str, Axis],
    axis_name: str | None,
) -> str | None:
    """Checks graph input/output names and input types; returns the batch dim_param used."""
    src_inits = {t.name for t in source.graph.initializer}
    src_inputs = [v for v in source.graph.input if v.name not in src_inits]
    res_inits = {t.name for t in result.graph.initializer}
    res_inputs = [v for v in result.graph.input if v.name not in res_inits]
    assert [v.name for v in res_inputs] == [v.name for v in src_inputs], "graph input names changed"
    assert [v.name for v in result.graph.output] == [v.name for v in source.graph.output], (
        "graph output names changed"
    )
    batch_param: str | None = None
    for src, res in zip(src_inputs, res_inputs, strict=True):
        assert res.type.tensor_type.elem_type == src.type.tensor_type.elem_type, (
            f"input {src.name}: dtype changed"
        )
        axis = in_axes[src.name]
        sdims, rdims = _dims(src), _dims(res)
        if axis is None:
            assert res.type == src.type, (
                f"shared input {src.name}: type changed from {src.type} to {res.type}"
            )
            continue
        if sdims is None:
            continue
        assert rdims is not None, f"batched input {src.name}: shape dropped"
        pos = positive_axis(axis, len(sdims))
        assert len(rdims) == len(sdims) + 1, (
            f"batched input {src.name}: rank {len(rdims)}, expected {len(sdims) + 1}"
        )
        bdim = rdims[pos]
        assert bdim.HasField("dim_param") and bdim.dim_param, (
            f"batched input {src.name}: dim {pos} is {_dim_str(bdim)}, expected a symbolic batch dim"
        )
        if batch_param is None:
            batch_param = bdim.dim_param
        assert bdim.dim_param == batch_param, (
            f"inputs disagree on the batch dim: {bdim.dim_param} vs {batch_param}"
        )
        rest = rdims[:pos] + rdims[pos + 1 :]
        assert [_dim_str(d) for d in rest] == [_dim_str(d) for d in sdims], (
            f"batched input {src.name}: other dims changed: "
            f"{[_dim_str(d) for d in rdims]} from {[_dim_str(d) for d in sdims]}"
        )
    if axis_name is not None and batch_param is not None:
        assert batch_param == axis_name, (
            f"batch dim_param is {batch_param!r}, expected axis_name {axis_name!r}"
        )
    return batch_param


def check_output_types(
    result: onnx.ModelProto,
    expected: Mapping[str, np.ndarray],
    out_axes: Mapping[str, int],
    batch_param: str | None,
) -> None:
    """Declared output types must agree with the actual batched outputs."""
    for vi in result.graph.output:
        actual = expected[vi.name]
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.elem_type:
            assert np_dtype(tt.elem_type) == actual.dtype, (
                f"output {vi.name}: declared {np_dtype(tt.elem_type)}, got {actual.dtype}"
            )
        dims = _dims(vi)
        if dims is None:
            continue
        assert len(dims) == actual.ndim, (
            f"output {vi.name}: declared rank {len(dims)}, actual rank {actual.ndim}"
        )
        pos = positive_axis(out_axes[vi.name], actual.ndim - 1)
        for i, d in enumerate(dims):
            if d.HasField("dim_value"):
                assert d.dim_value == actual.shape[i], (
                    f"output {vi.name}: declared shape {[_dim_str(x) for x in dims]}, actual {actual.shape}"
                )
        bdim = dims[pos]
        assert not bdim.HasField("dim_value") or bdim.dim_value == actual.shape[pos]
        if batch_param is not None and bdim.HasField("dim_param"):
            assert bdim.dim_param == batch_param, (
                f"output {vi.name}: batch dim is {bdim.dim_param!r}, inputs use {batch_param!r}"
            )


def _full_check_ok(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------------------------
# The oracle


def compare(name: str, actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> None:
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape}, expected {expected.shape}"
    if np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=name)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=name)


def assert_vmap_matches(
    model: onnx.ModelProto,
    in_axes: InAxes = 0,
    out_axes: OutAxes = 0,
    *,
    batch_sizes: Sequence[int] = (1, 7),
    gens: Mapping[str, Gen] | None = None,
    dims: Mapping[str, int] | None = None,
    axis_name: str | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    seed: int = 0,
    as_ir: bool = False,
) -> onnx.ModelProto:
    """vmaps ``model`` and checks ``vmap(f)(X)[i] == f(X[i])`` for each batch size.

    Per-example inputs come from ``gens[name](rng)`` when given, else random values of the
    declared dtype and shape (symbolic dims resolved through ``dims``). Shared (``None``)
    inputs are drawn once per batch; batched ones once per example and stacked at their axis.
    Returns the vmapped model (as a ModelProto).
    """
    import onnax

    gens = gens or {}
    dims = dims or {}
    source_bytes = model.SerializeToString()
    sig = input_signature(model)
    names = [n for n, _, _ in sig]
    axes_in = normalize_in_axes(in_axes, names)
    out_names = [o.name for o in model.graph.output]
    axes_out = normalize_out_axes(out_axes, out_names)

    kwargs: dict[str, Any] = {"in_axes": in_axes, "out_axes": out_axes}
    if axis_name is not None:
        kwargs["axis_name"] = axis_name
    if as_ir:
        import onnx_ir

        ir_model = onnx_ir.serde.deserialize_model(model)
        got = onnax.vmap(ir_model, **kwargs)
        assert isinstance(got, onnx_ir.Model), f"onnx_ir.Model in, {type(got).__name__} out"
        vmapped = to_proto(got)
    else:
        got = onnax.vmap(model, **kwargs)
        assert isinstance(got, onnx.ModelProto), f"ModelProto in, {type(got).__name__} out"
        vmapped = got
    assert model.SerializeToString() == source_bytes, "vmap mutated its source model"

    batch_param = check_signature(model, vmapped, axes_in, axis_name)
    if _full_check_ok(model):
        try:
            onnx.checker.check_model(vmapped, full_check=True)
        except Exception as err:
            raise AssertionError(f"vmapped model fails onnx.checker full_check: {err}") from err

    backend = choose_backend(model)
    rng = np.random.default_rng(seed)

    def draw(name: str, dtype: np.dtype, shape: list[Dim] | None) -> np.ndarray:
        if name in gens:
            return np.asarray(gens[name](rng))
        return random_tensor(rng, dtype, concrete_shape(name, shape, dims))

    for bsz in batch_sizes:
        shared: dict[str, np.ndarray] = {}
        examples: list[dict[str, np.ndarray]] = [{} for _ in range(bsz)]
        for name, dtype, shape in sig:
            if axes_in[name] is None:
                shared[name] = draw(name, dtype, shape)
            else:
                for ex in examples:
                    ex[name] = draw(name, dtype, shape)
        per_example = [run_model(model, {**shared, **ex}, backend) for ex in examples]
        expected: dict[str, np.ndarray] = {}
        for k, oname in enumerate(out_names):
            outs = [res[k] for res in per_example]
            pos = positive_axis(axes_out[oname], outs[0].ndim)
            expected[oname] = np.stack(outs, axis=pos)
        feeds = dict(shared)
        for name, _, _ in sig:
            axis = axes_in[name]
            if axis is not None:
                arrs = [ex[name] for ex in examples]
                feeds[name] = np.stack(arrs, axis=positive_axis(axis, arrs[0].ndim))
        actual_list = run_model(vmapped, feeds, backend)
        actual = dict(zip([o.name for o in vmapped.graph.output], actual_list, strict=True))
        for oname in out_names:
            compare(f"output {oname!r} (batch {bsz})", actual[oname], expected[oname], rtol, atol)
        check_output_types(vmapped, actual, axes_out, batch_param)
    return vmapped


def vmap_error(model: Any, **kwargs: Any) -> str:
    """Calls ``onnax.vmap`` expecting ``onnax.OnnaxError``; returns the message."""
    import onnax
    import pytest

    with pytest.raises(onnax.OnnaxError) as info:
        onnax.vmap(model, **kwargs)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def assert_vmap_empty_batch(
    model: onnx.ModelProto,
    in_axes: InAxes = 0,
    out_axes: OutAxes = 0,
    *,
    gens: Mapping[str, Gen] | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
) -> None:
    """A batch of zero examples must give outputs of the per-example shape with a 0 batch dim."""
    import onnax

    gens = gens or {}
    dims = dims or {}
    sig = input_signature(model)
    names = [n for n, _, _ in sig]
    axes_in = normalize_in_axes(in_axes, names)
    out_names = [o.name for o in model.graph.output]
    axes_out = normalize_out_axes(out_axes, out_names)
    vmapped = to_proto(onnax.vmap(model, in_axes=in_axes, out_axes=out_axes))
    backend = choose_backend(model)
    rng = np.random.default_rng(seed)
    example: dict[str, np.ndarray] = {}
    for name, dtype, shape in sig:
        if name in gens:
            example[name] = np.asarray(gens[name](rng))
        else:
            example[name] = random_tensor(rng, dtype, concrete_shape(name, shape, dims))
    per_example = run_model(model, example, backend)
    feeds: dict[str, np.ndarray] = {}
    for name, _, _ in sig:
        axis = axes_in[name]
        value = example[name]
        if axis is None:
            feeds[name] = value
        else:
            empty_shape = list(value.shape)
            empty_shape.insert(positive_axis(axis, value.ndim), 0)
            feeds[name] = np.zeros(empty_shape, dtype=value.dtype)
    actual = run_model(vmapped, feeds, backend)
    for oname, got, one in zip(out_names, actual, per_example, strict=True):
        shape = list(one.shape)
        shape.insert(positive_axis(axes_out[oname], one.ndim), 0)
        assert got.dtype == one.dtype, f"output {oname!r}: dtype {got.dtype}, expected {one.dtype}"
        assert list(got.shape) == shape, (
            f"output {oname!r} for an empty batch: shape {got.shape}, expected {shape}"
        )
