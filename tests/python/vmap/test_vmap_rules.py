"""Per-operator numerical tests for ``onnax.vmap``: ``vmap(f)(X)[i] == f(X[i])``.

Every case is a small model (usually one node) plus in_axes/out_axes; the oracle in
``vmap_oracle`` vmaps it, runs it on batches of size 1 and 7 and compares against a loop of the
source model over the examples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from oracles.vmap_oracle import (
    REDUCE_OPS,
    Gen,
    InAxes,
    OutAxes,
    ValueSpec,
    assert_vmap_empty_batch,
    assert_vmap_matches,
    make_model,
    node,
)

pytest.importorskip("onnax")

F = TensorProto.FLOAT
I64 = TensorProto.INT64
I32 = TensorProto.INT32
U8 = TensorProto.UINT8
U32 = TensorProto.UINT32
B = TensorProto.BOOL

INT64_MAX = np.iinfo(np.int64).max


@dataclass
class Case:
    id: str
    model: onnx.ModelProto
    in_axes: InAxes = 0
    out_axes: OutAxes = 0
    gens: Mapping[str, Gen] = field(default_factory=dict)
    dims: Mapping[str, int] = field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-5


CASES: list[Case] = []


def add(
    case_id: str,
    model: onnx.ModelProto,
    in_axes: InAxes = 0,
    out_axes: OutAxes = 0,
    *,
    gens: Mapping[str, Gen] | None = None,
    dims: Mapping[str, int] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> None:
    CASES.append(Case(case_id, model, in_axes, out_axes, dict(gens or {}), dict(dims or {}), rtol, atol))


def single(
    op: str,
    node_inputs: Sequence[str],
    inputs: Sequence[ValueSpec],
    outputs: Sequence[str] = ("out",),
    *,
    inits: Mapping[str, Any] | None = None,
    opset: int = 18,
    **attrs: Any,
) -> onnx.ModelProto:
    """A one-node model; graph inputs are ``inputs``, everything else comes from ``inits``."""
    return make_model(
        [node(op, node_inputs, outputs, name=f"{op}_0", **attrs)],
        inputs,
        list(outputs),
        initializers=inits,
        opset=opset,
    )


# ---- generators ------------------------------------------------------------------------------


def uniform(lo: float, hi: float, shape: Sequence[int], dtype: Any = np.float32) -> Gen:
    return lambda rng: rng.uniform(lo, hi, size=tuple(shape)).astype(dtype)


def ints(lo: int, hi: int, shape: Sequence[int], dtype: Any = np.int64) -> Gen:
    """Integers in [lo, hi)."""
    return lambda rng: rng.integers(lo, hi, size=tuple(shape)).astype(dtype)


def nonzero_ints(lo: int, hi: int, shape: Sequence[int], dtype: Any = np.int64) -> Gen:
    def gen(rng: np.random.Generator) -> np.ndarray:
        v = rng.integers(lo, hi, size=tuple(shape))
        return np.where(v == 0, 1, v).astype(dtype)

    return gen


def away_from_zero(shape: Sequence[int]) -> Gen:
    def gen(rng: np.random.Generator) -> np.ndarray:
        mag = rng.uniform(0.5, 2.0, size=tuple(shape))
        sign = np.where(rng.random(tuple(shape)) < 0.5, -1.0, 1.0)
        return (mag * sign).astype(np.float32)

    return gen


def const(value: Any, dtype: Any = None) -> Gen:
    arr = np.asarray(value, dtype=dtype)
    return lambda rng: arr.copy()


def distinct_rows(n_rows: int, take: int, n_cols: int) -> Gen:
    """[take, n_cols] int64 indices, distinct within each column (for ScatterElements axis 0)."""

    def gen(rng: np.random.Generator) -> np.ndarray:
        cols = [rng.permutation(n_rows)[:take] for _ in range(n_cols)]
        return np.stack(cols, axis=1).astype(np.int64)

    return gen


def distinct_cols(n_rows: int, take: int, n_cols: int, negative: bool = False) -> Gen:
    """[n_rows, take] int64 indices, distinct within each row (for axis 1)."""

    def gen(rng: np.random.Generator) -> np.ndarray:
        rows = [rng.permutation(n_cols)[:take] for _ in range(n_rows)]
        out = np.stack(rows, axis=0).astype(np.int64)
        return out - n_cols if negative else out

    return gen


def nd_indices(shape_first: int, take: int) -> Gen:
    """[take, 1] distinct int64 row indices into a dim of size shape_first."""
    return lambda rng: rng.permutation(shape_first)[:take].reshape(take, 1).astype(np.int64)


# ---- elementwise unary ---------------------------------------------------------------------


def _unary_cases() -> None:
    pos = uniform(0.1, 3.0, [3, 1, 4])
    unit = uniform(-0.9, 0.9, [3, 1, 4])
    float_ops: list[tuple[str, dict[str, Any], Gen | None, int]] = [
        ("Abs", {}, None, 18),
        ("Neg", {}, None, 18),
        ("Exp", {}, None, 18),
        ("Log", {}, pos, 18),
        ("Sqrt", {}, pos, 18),
        ("Reciprocal", {}, away_from_zero([3, 1, 4]), 18),
        ("Floor", {}, None, 18),
        ("Ceil", {}, None, 18),
        ("Round", {}, None, 18),
        ("Sign", {}, None, 18),
        ("Sin", {}, None, 18),
        ("Cos", {}, None, 18),
        ("Tan", {}, unit, 18),
        ("Asin", {}, unit, 18),
        ("Acos", {}, unit, 18),
        ("Atan", {}, None, 18),
        ("Sinh", {}, None, 18),
        ("Cosh", {}, None, 18),
        ("Asinh", {}, None, 18),
        ("Acosh", {}, uniform(1.1, 3.0, [3, 1, 4]), 18),
        ("Atanh", {}, unit, 18),
        ("Erf", {}, None, 18),
        ("IsNaN", {}, None, 18),
        ("IsInf", {}, None, 18),
        ("Relu", {}, None, 18),
        ("Sigmoid", {}, None, 18),
        ("Tanh", {}, None, 18),
        ("Softplus", {}, None, 18),
        ("Softsign", {}, None, 18),
        ("HardSwish", {}, None, 18),
        ("Mish", {}, None, 18),
        ("Identity", {}, None, 18),
        ("LeakyRelu", {"alpha": 0.2}, None, 18),
        ("Elu", {"alpha": 0.7}, None, 18),
        ("Selu", {}, None, 18),
        ("Celu", {"alpha": 1.5}, None, 18),
        ("Gelu", {}, None, 20),
        ("Gelu", {"approximate": "tanh"}, None, 20),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, None, 18),
        ("ThresholdedRelu", {"alpha": 0.5}, None, 18),
        ("Shrink", {"lambd": 0.6, "bias": 0.1}, None, 18),
        ("Swish", {"alpha": 1.2}, None, 24),
    ]
    for op, attrs, gen, opset in float_ops:
        tag = op + "".join(f"_{k}" for k in attrs if k == "approximate")
        m = single(op, ["x"], [("x", F, [3, 1, 4])], opset=opset, **attrs)
        add(f"{tag}-f32-in0-out0", m, 0, 0, gens={"x": gen} if gen else None)
        m2 = single(op, ["x"], [("x", F, ["N", 4])], opset=opset, **attrs)
        gen2 = None
        if gen is not None:
            gen2 = lambda rng, g=gen: g(rng)[:2, 0, :]  # noqa: E731 - reuse the domain of gen
        add(f"{tag}-f32-symN-inneg1-out1", m2, -1, 1, gens={"x": gen2} if gen2 else None, dims={"N": 2})
    int_ops: list[tuple[str, int, dict[str, Any]]] = [
        ("Abs", I32, {}),
        ("Neg", I64, {}),
        ("Sign", I32, {}),
        ("BitwiseNot", I32, {}),
        ("BitwiseNot", U8, {}),
        ("Not", B, {}),
        ("Relu", I32, {}),
        ("Identity", I64, {}),
    ]
    for op, dt, attrs in int_ops:
        dname = onnx.helper.tensor_dtype_to_np_dtype(dt).name
        m = single(op, ["x"], [("x", dt, [2, 3])], **attrs)
        add(f"{op}-{dname}-in1-out0", m, 1, 0)
    # A rank-0 per-example value.
    add("Neg-scalar-in0", single("Neg", ["x"], [("x", F, [])]), 0, 0)


_unary_cases()


# ---- elementwise binary / variadic -----------------------------------------------------------

BinaryVariant = tuple[str, list[int | str], list[int | str], InAxes, int]

BINARY_VARIANTS: list[BinaryVariant] = [
    ("both_in0", [3, 4], [3, 4], (0, 0), 0),
    ("bcast_x_in1_y_in0_outneg1", [2, 3, 4], [4], (1, 0), -1),
    ("x_batched_y_shared", [3, 4], [1, 4], (0, None), 0),
    ("x_shared_y_batched_out1", [3, 4], [4], (None, -1), 1),
    ("x_rank1_y_scalar_both", [3], [], (0, 0), 0),
    ("x_scalar_batched_y_shared", [], [2, 3], (0, None), 1),
    ("x_low_rank_batched_y_high_rank_in2", [4], [2, 3, 4], (0, 2), 0),
    ("sym_dims", ["N", 1], [1, "M"], (0, 1), 2),
]


def _shape_of(shape: list[int | str], dims: Mapping[str, int]) -> list[int]:
    return [dims[d] if isinstance(d, str) else d for d in shape]


def _binary_cases() -> None:
    dims = {"N": 2, "M": 3}
    # (op, dtype, x-gen factory, y-gen factory, attrs, unidirectional broadcast only)
    GenF = Callable[[list[int]], Gen] | None
    ops: list[tuple[str, int, GenF, GenF, dict[str, Any], bool]] = [
        ("Add", F, None, None, {}, False),
        ("Sub", F, None, None, {}, False),
        ("Mul", F, None, None, {}, False),
        ("Div", F, None, away_from_zero, {}, False),
        ("Pow", F, lambda s: uniform(0.5, 2.0, s), lambda s: uniform(-2.0, 2.0, s), {}, False),
        ("Max", F, None, None, {}, False),
        ("Min", F, None, None, {}, False),
        ("Sum", F, None, None, {}, False),
        ("Mean", F, None, None, {}, False),
        ("Add", I64, None, None, {}, False),
        ("Mul", I32, None, None, {}, False),
        ("Div", I32, None, lambda s: nonzero_ints(-5, 6, s, np.int32), {}, False),
        ("Mod", I64, None, lambda s: nonzero_ints(-5, 6, s), {}, False),
        ("Mod", F, None, away_from_zero, {"fmod": 1}, False),
        ("BitShift", U8, None, lambda s: ints(0, 4, s, np.uint8), {"direction": "LEFT"}, False),
        ("BitShift", U32, None, lambda s: ints(0, 4, s, np.uint32), {"direction": "RIGHT"}, False),
        ("BitwiseAnd", I32, None, None, {}, False),
        ("BitwiseOr", I32, None, None, {}, False),
        ("BitwiseXor", I32, None, None, {}, False),
        ("And", B, None, None, {}, False),
        ("Or", B, None, None, {}, False),
        ("Xor", B, None, None, {}, False),
        ("Equal", I64, None, None, {}, False),
        ("Less", F, None, None, {}, False),
        ("LessOrEqual", I32, None, None, {}, False),
        ("Greater", F, None, None, {}, False),
        ("GreaterOrEqual", I64, None, None, {}, False),
        ("PRelu", F, None, None, {}, True),
    ]
    for op, dt, gx, gy, attrs, unidirectional in ops:
        dname = onnx.helper.tensor_dtype_to_np_dtype(dt).name
        tag = (
            op
            + ("_fmod" if attrs.get("fmod") else "")
            + (f"_{attrs['direction']}" if "direction" in attrs else "")
        )
        for vid, xs, ys, in_axes, out_axes in BINARY_VARIANTS:
            if unidirectional and len(ys) > len(xs):
                continue
            if unidirectional and vid == "sym_dims":
                continue
            m = single(op, ["x", "y"], [("x", dt, xs), ("y", dt, ys)], **attrs)
            gens: dict[str, Gen] = {}
            if gx:
                gens["x"] = gx(_shape_of(xs, dims))
            if gy:
                gens["y"] = gy(_shape_of(ys, dims))
            add(f"{tag}-{dname}-{vid}", m, in_axes, out_axes, gens=gens, dims=dims)
    # Broadcasting against an initializer (shared weight that is not a graph input).
    w = np.arange(4, dtype=np.float32).reshape(1, 4)
    add("Add-initializer_y-in1", single("Add", ["x", "w"], [("x", F, [3, 4])], inits={"w": w}), 1, 0)
    add("Sub-initializer_x-in0", single("Sub", ["w", "x"], [("x", F, [2, 3, 4])], inits={"w": w}), 0, 2)

    # Variadic with three inputs.
    for op in ("Sum", "Mean", "Max", "Min"):
        specs: list[ValueSpec] = [("a", F, [3, 4]), ("b", F, [4]), ("c", F, [2, 3, 1])]
        m = single(op, ["a", "b", "c"], specs)
        add(f"{op}-3inputs-all_in0", m, 0, 0)
        add(f"{op}-3inputs-mixed_0_None_1", m, (0, None, 1), 1)
        add(f"{op}-3inputs-only_b_batched", m, (None, 0, None), -1)
        add(f"{op}-1input", single(op, ["a"], [("a", F, [3, 4])]), 1, 0)


_binary_cases()


def _where_cast_clip_cases() -> None:
    specs: list[ValueSpec] = [("c", B, [3, 4]), ("x", F, [3, 4]), ("y", F, [3, 4])]
    m = single("Where", ["c", "x", "y"], specs)
    add("Where-all_in0", m, 0, 0)
    add("Where-cond_batched_xy_shared", m, (0, None, None), 1)
    add("Where-cond_shared_x_batched", m, (None, 1, None), 0)
    add("Where-cond_shared_y_batched_neg", m, (None, None, -1), -1)
    m = single("Where", ["c", "x", "y"], [("c", B, [4]), ("x", F, [2, 3, 4]), ("y", F, [])])
    add("Where-mixed_ranks", m, (0, 1, 0), 0)
    add("Where-mixed_ranks_y_shared", m, (0, 2, None), 2)

    casts: list[tuple[int, int, Gen | None]] = [
        (F, I32, uniform(-10, 10, [2, 3])),
        (I64, F, None),
        (F, B, None),
        (B, F, None),
        (I32, I64, None),
        (F, U8, uniform(0, 200, [2, 3])),
    ]
    for src, dst, gen in casts:
        sname = onnx.helper.tensor_dtype_to_np_dtype(src).name
        dname = onnx.helper.tensor_dtype_to_np_dtype(dst).name
        m = single("Cast", ["x"], [("x", src, [2, 3])], to=dst)
        add(f"Cast-{sname}_to_{dname}-in1", m, 1, 0, gens={"x": gen} if gen else None)
    m = single("Cast", ["x"], [("x", F, [2, 3])], opset=21, to=I32)
    add("Cast-opset21-in0", m, 0, 1, gens={"x": uniform(-10, 10, [2, 3])})
    m = single("CastLike", ["x", "t"], [("x", F, [2, 3]), ("t", I64, [1])])
    add("CastLike-x_batched_target_shared", m, (0, None), 0, gens={"x": uniform(-10, 10, [2, 3])})
    add("CastLike-both_batched", m, (1, 0), 1, gens={"x": uniform(-10, 10, [2, 3])})
    add("CastLike-x_shared_target_batched", m, (None, 0), 0)

    x = ("x", F, [3, 4])
    lo, hi = np.array(-0.5, np.float32), np.array(0.7, np.float32)
    add("Clip-min_max_initializers", single("Clip", ["x", "lo", "hi"], [x], inits={"lo": lo, "hi": hi}), 0, 0)
    m = single("Clip", ["x", "lo", "hi"], [x, ("lo", F, []), ("hi", F, [])])
    gens = {"lo": uniform(-1.0, -0.1, []), "hi": uniform(0.1, 1.0, [])}
    add("Clip-min_max_shared_inputs", m, (1, None, None), 0, gens=gens)
    add("Clip-min_max_batched", m, (0, 0, 0), 0, gens=gens)
    add("Clip-x_shared_min_batched", m, (None, 0, None), 1, gens=gens)
    add("Clip-x_batched_in1_max_batched", m, (1, None, 0), -1, gens=gens)
    add("Clip-only_max", single("Clip", ["x", "", "hi"], [x], inits={"hi": hi}), -1, 0)
    add("Clip-no_bounds", single("Clip", ["x"], [x]), 0, 0)
    m = single("Clip", ["x", "lo", "hi"], [("x", I32, [5]), ("lo", I32, []), ("hi", I32, [])])
    add(
        "Clip-int32-all_batched",
        m,
        0,
        0,
        gens={"lo": ints(-3, 0, [], np.int32), "hi": ints(1, 4, [], np.int32)},
    )


_where_cast_clip_cases()


# ---- MatMul / Gemm / Einsum ------------------------------------------------------------------


def _matmul_cases() -> None:
    variants: list[tuple[str, list[int | str], list[int | str], InAxes, int]] = [
        ("2d_a_batched_b_shared", [3, 4], [4, 5], (0, None), 0),
        ("2d_a_shared_b_batched", [3, 4], [4, 5], (None, 0), 0),
        ("2d_both_batched", [3, 4], [4, 5], (0, 0), 0),
        ("2d_both_batched_in1_inneg1_out1", [3, 4], [4, 5], (1, -1), 1),
        ("1d_a_batched_b_shared", [4], [4, 5], (0, None), 0),
        ("1d_b_batched_a_shared", [3, 4], [4], (None, 0), 0),
        ("1d_b_batched_in1", [3, 4], [4], (0, 1), 0),
        ("1d_1d_both_batched", [4], [4], (0, 0), 0),
        ("1d_1d_a_batched", [4], [4], (-1, None), 0),
        ("1d_a_shared_3d_b_batched", [4], [2, 4, 5], (None, 1), 0),
        ("3d_a_in1_2d_b_in0", [2, 3, 4], [4, 5], (1, 0), 0),
        ("2d_a_3d_b_inneg1_out1", [3, 4], [2, 4, 5], (0, -1), 1),
        ("bcast_batch_dims_a_batched", [1, 3, 4], [2, 4, 5], (0, None), 0),
        ("bcast_batch_dims_b_batched", [2, 1, 3, 4], [3, 4, 5], (None, 2), 3),
        ("size1_dims", [1, 4], [4, 1], (0, 0), 1),
        ("sym_dims", ["N", 4], [4, "M"], (0, None), 0),
    ]
    for vid, a, b, in_axes, out_axes in variants:
        m = single("MatMul", ["a", "b"], [("a", F, a), ("b", F, b)])
        add(f"MatMul-{vid}", m, in_axes, out_axes, dims={"N": 2, "M": 3})
    w = np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5)
    add("MatMul-initializer_w", single("MatMul", ["a", "w"], [("a", F, [3, 4])], inits={"w": w}), 1, 0)
    add("MatMul-initializer_w_1d_a", single("MatMul", ["a", "w"], [("a", F, [4])], inits={"w": w}), 0, 0)
    m = single("MatMul", ["a", "b"], [("a", I32, [2, 3]), ("b", I32, [3, 2])])
    add("MatMul-int32-both_batched", m, 0, 0)

    gemm: list[tuple[str, dict[str, Any], list[int], list[int], list[int] | None, InAxes, int]] = [
        ("A_batched", {}, [3, 4], [4, 5], [5], (0, None, None), 0),
        ("B_batched", {}, [3, 4], [4, 5], [5], (None, 0, None), 0),
        ("C_batched", {}, [3, 4], [4, 5], [5], (None, None, 0), 0),
        ("all_batched_mixed_axes", {}, [3, 4], [4, 5], [3, 5], (1, 0, -1), 1),
        ("transA_A_batched", {"transA": 1}, [4, 3], [4, 5], [1, 5], (0, None, None), 0),
        ("transB_B_batched", {"transB": 1}, [3, 4], [5, 4], [3, 1], (None, 1, None), 2),
        ("transA_transB_both", {"transA": 1, "transB": 1}, [4, 3], [5, 4], [5], (0, 0, None), 0),
        ("alpha_beta_all", {"alpha": 0.5, "beta": 2.0}, [3, 4], [4, 5], [3, 5], (0, 0, 0), 0),
        ("scalar_C_batched", {"beta": -1.0}, [3, 4], [4, 5], [], (None, 0, 0), 0),
        ("no_C", {"alpha": 2.0}, [3, 4], [4, 5], None, (0, None), 1),
        ("no_C_B_batched_transB", {"transB": 1}, [3, 4], [5, 4], None, (None, 0), 0),
    ]
    for vid, attrs, ga, gb, c, in_axes, out_axes in gemm:
        specs: list[ValueSpec] = [("A", F, ga), ("B", F, gb)]
        if c is not None:
            specs.append(("C", F, c))
        m = single("Gemm", [s[0] for s in specs], specs, **attrs)
        add(f"Gemm-{vid}", m, in_axes, out_axes)
    wb = np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)
    bias = np.arange(5, dtype=np.float32)
    m = single("Gemm", ["A", "W", "bias"], [("A", F, [3, 4])], inits={"W": wb, "bias": bias}, transB=1)
    add("Gemm-initializer_weights_transB", m, 0, 0)

    einsum: list[tuple[str, str, list[list[int]], InAxes, int]] = [
        ("matmul_explicit_both", "ij,jk->ik", [[3, 4], [4, 5]], (0, 0), 0),
        ("matmul_implicit_a_batched", "ij,jk", [[3, 4], [4, 5]], (0, None), 0),
        ("matmul_implicit_b_batched", "ij,jk", [[3, 4], [4, 5]], (None, 1), 1),
        ("ellipsis_a_in1_b_shared", "...ij,...jk->...ik", [[2, 3, 4], [2, 4, 5]], (1, None), 0),
        ("ellipsis_reduce_last", "...i,...i->...", [[2, 3], [2, 3]], (0, 1), 0),
        ("ellipsis_implicit", "...ij,jk", [[2, 3, 4], [4, 5]], (0, 0), -1),
        ("diag", "ii->i", [[3, 3]], 0, 0),
        ("sum_all", "ij->", [[3, 4]], -1, 0),
        ("dot_implicit", "i,i", [[4], [4]], (0, 0), 0),
        ("batched_matmul_in1", "bij,bjk->bik", [[2, 3, 4], [2, 4, 5]], (1, 0), 2),
        ("transpose_inneg1_out1", "ij->ji", [[3, 4]], -1, 1),
        ("hadamard_a_shared", "ij,ij->ij", [[3, 4], [3, 4]], (None, 0), 0),
        ("outer", "i,j->ij", [[3], [4]], (0, None), 1),
        ("trace_implicit", "ii", [[3, 3]], 0, 0),
        ("three_operands", "ij,jk,kl->il", [[2, 3], [3, 4], [4, 2]], (0, None, 1), 0),
    ]
    for vid, eq, shapes, in_axes, out_axes in einsum:
        names = [f"x{i}" for i in range(len(shapes))]
        m = single("Einsum", names, [(n, F, s) for n, s in zip(names, shapes, strict=True)], equation=eq)
        add(f"Einsum-{vid}", m, in_axes, out_axes)


_matmul_cases()


# ---- reductions ------------------------------------------------------------------------------


def _reduce_cases() -> None:
    x = ("x", F, [2, 3, 4])
    for op in REDUCE_OPS:
        gens = {"x": uniform(0.5, 1.5, [2, 3, 4])} if op in ("ReduceLogSum", "ReduceProd") else {}
        ax = lambda v: {"axes": np.array(v, np.int64)}  # noqa: E731
        add(f"{op}-axes1-keep1-in0", single(op, ["x", "axes"], [x], inits=ax([1])), 0, 0, gens=gens)
        add(
            f"{op}-axesneg1-keep0-in1-outneg1",
            single(op, ["x", "axes"], [x], inits=ax([-1]), keepdims=0),
            1,
            -1,
            gens=gens,
        )
        add(f"{op}-noaxes-keep0-inneg1", single(op, ["x"], [x], keepdims=0), -1, 0, gens=gens)
        add(f"{op}-noaxes-keep1-in1", single(op, ["x"], [x], keepdims=1), 1, 1, gens=gens)
        add(
            f"{op}-axes0_2-keep0-in2",
            single(op, ["x", "axes"], [x], inits=ax([0, 2]), keepdims=0),
            2,
            0,
            gens=gens,
        )
        add(f"{op}-noop_empty_axes", single(op, ["x"], [x], noop_with_empty_axes=1), 0, 0, gens=gens)
        m = single(op, ["x", "axes"], [x, ("axes", I64, [2])], keepdims=1)
        add(f"{op}-axes_shared_input", m, (0, None), 0, gens={**gens, "axes": const([0, -1], np.int64)})
    # Size-1 reduced dim and a symbolic dim.
    m = single(
        "ReduceSum",
        ["x", "axes"],
        [("x", F, ["N", 1, 3])],
        inits={"axes": np.array([1], np.int64)},
        keepdims=0,
    )
    add("ReduceSum-size1_axis-symN", m, 0, 1, dims={"N": 2})
    # Opset 13 spellings (axes attribute for all but ReduceSum), upgraded to 18 by onnax.
    add("ReduceMean-opset13-axes_attr", single("ReduceMean", ["x"], [x], opset=13, axes=[1]), 0, 0)
    add(
        "ReduceMax-opset13-axes_attr_neg",
        single("ReduceMax", ["x"], [x], opset=13, axes=[-1], keepdims=0),
        1,
        0,
    )
    add(
        "ReduceSum-opset13-axes_input",
        single("ReduceSum", ["x", "axes"], [x], opset=13, inits={"axes": np.array([0], np.int64)}),
        0,
        0,
    )
    add("ReduceL2-opset13-noaxes", single("ReduceL2", ["x"], [x], opset=13, keepdims=0), -1, 0)
    # Opset 20 ReduceMax/ReduceMin (bool support).
    add(
        "ReduceMax-opset20",
        single("ReduceMax", ["x", "axes"], [x], opset=20, inits={"axes": np.array([1], np.int64)}),
        1,
        0,
    )
    add("ReduceMin-opset20-bool", single("ReduceMin", ["x"], [("x", B, [2, 3])], opset=20, keepdims=0), 0, 0)

    for op in ("ArgMax", "ArgMin"):
        add(f"{op}-axis1-keep1-in0", single(op, ["x"], [x], axis=1), 0, 0)
        add(f"{op}-axisneg1-keep0-in1", single(op, ["x"], [x], axis=-1, keepdims=0), 1, 0)
        add(f"{op}-axis0-inneg1-out1", single(op, ["x"], [x], axis=0, keepdims=0), -1, 1)
        add(
            f"{op}-select_last_index-ties",
            single(op, ["x"], [x], axis=2, select_last_index=1),
            0,
            0,
            gens={"x": lambda rng: rng.integers(0, 2, (2, 3, 4)).astype(np.float32)},
        )
        add(f"{op}-default_axis-symN", single(op, ["x"], [("x", F, ["N", 3])]), 0, 0, dims={"N": 2})

    def axis(v: int, dt: Any = np.int64) -> dict[str, np.ndarray]:
        return {"axis": np.array(v, dt)}

    x2 = ("x", F, [3, 4])
    add("CumSum-axis1-in0", single("CumSum", ["x", "axis"], [x2], inits=axis(1)), 0, 0)
    add(
        "CumSum-axisneg1-exclusive-in1",
        single("CumSum", ["x", "axis"], [x2], inits=axis(-1), exclusive=1),
        1,
        0,
    )
    add("CumSum-axis0-reverse-inneg1", single("CumSum", ["x", "axis"], [x2], inits=axis(0), reverse=1), -1, 1)
    add(
        "CumSum-axis0-exclusive_reverse-in0",
        single("CumSum", ["x", "axis"], [x2], inits=axis(0), exclusive=1, reverse=1),
        0,
        0,
    )
    add("CumProd-axis1-in0", single("CumProd", ["x", "axis"], [x2], inits=axis(1), opset=26), 0, 0)
    add(
        "CumProd-axisneg1-exclusive_reverse-in1",
        single("CumProd", ["x", "axis"], [x2], inits=axis(-1), exclusive=1, reverse=1, opset=26),
        1,
        0,
    )
    m = single("CumSum", ["x", "axis"], [("x", I32, [2, 3, 4]), ("axis", I32, [])])
    add("CumSum-int32-axis_shared_input", m, (1, None), 0, gens={"axis": const(-2, np.int32)})

    x3 = ("x", F, [3, 5])
    k2 = {"k": np.array([2], np.int64)}
    add("TopK-axisneg1-in0", single("TopK", ["x", "k"], [x3], ("v", "i"), inits=k2), 0, 0)
    add(
        "TopK-axis0-smallest-in1-out1_0",
        single("TopK", ["x", "k"], [x3], ("v", "i"), inits=k2, axis=0, largest=0),
        1,
        (1, 0),
    )
    add(
        "TopK-axis1-unsorted",
        single("TopK", ["x", "k"], [x3], ("v", "i"), inits={"k": np.array([5], np.int64)}, axis=1, sorted=1),
        -1,
        -1,
    )
    m = single("TopK", ["x", "k"], [x3, ("k", I64, [1])], ("v", "i"))
    add("TopK-k_shared_input", m, (0, None), 0, gens={"k": const([3], np.int64)})
    add("TopK-opset24", single("TopK", ["x", "k"], [x3], ("v", "i"), inits=k2, opset=24, axis=-1), 0, 1)


_reduce_cases()


def _softmax_cases() -> None:
    x = ("x", F, [2, 3, 4])
    for op in ("Softmax", "LogSoftmax", "Hardmax"):
        add(f"{op}-default_axis-in0", single(op, ["x"], [x]), 0, 0)
        add(f"{op}-axis0-in0", single(op, ["x"], [x], axis=0), 0, 0)
        add(f"{op}-axis1-inneg1-out1", single(op, ["x"], [x], axis=1), -1, 1)
        add(f"{op}-axisneg2-in1", single(op, ["x"], [x], axis=-2), 1, 0)
        add(f"{op}-opset13-axis0-in1", single(op, ["x"], [x], opset=13, axis=0), 1, 0)


_softmax_cases()


# ---- shape manipulation ----------------------------------------------------------------------


def _shape_cases() -> None:
    x = ("x", F, [2, 3, 4])

    def shp(v: Sequence[int]) -> dict[str, np.ndarray]:
        return {"shape": np.array(v, np.int64)}

    add("Reshape-6x4-in0", single("Reshape", ["x", "shape"], [x], inits=shp([6, 4])), 0, 0)
    add("Reshape-zero_copy_and_minus1-in1", single("Reshape", ["x", "shape"], [x], inits=shp([0, -1])), 1, 0)
    add("Reshape-flat-inneg1-out1", single("Reshape", ["x", "shape"], [x], inits=shp([-1])), -1, 1)
    add("Reshape-4_0_minus1-in0", single("Reshape", ["x", "shape"], [x], inits=shp([4, 0, -1])), 0, 0)
    add(
        "Reshape-allowzero_nonzero_shape",
        single("Reshape", ["x", "shape"], [x], inits=shp([4, 6]), allowzero=1),
        0,
        0,
    )
    add(
        "Reshape-allowzero_empty",
        single("Reshape", ["x", "shape"], [("x", F, [0, 3])], inits=shp([3, 0]), allowzero=1),
        0,
        0,
    )
    m = single("Reshape", ["x", "shape"], [x, ("shape", I64, [2])])
    add("Reshape-shape_shared_input", m, (0, None), 0, gens={"shape": const([0, -1], np.int64)})
    add(
        "Reshape-symN",
        single("Reshape", ["x", "shape"], [("x", F, ["N", 4])], inits=shp([-1, 2])),
        0,
        0,
        dims={"N": 2},
    )
    add("Reshape-scalar_to_1x1", single("Reshape", ["x", "shape"], [("x", F, [])], inits=shp([1, 1])), 0, 1)

    add("Transpose-perm102-in0", single("Transpose", ["x"], [x], perm=[1, 0, 2]), 0, 0)
    add("Transpose-perm201-in1", single("Transpose", ["x"], [x], perm=[2, 0, 1]), 1, 2)
    add("Transpose-noperm-inneg1-out1", single("Transpose", ["x"], [x]), -1, 1)
    add("Transpose-symN", single("Transpose", ["x"], [("x", F, ["N", 3])], perm=[1, 0]), 0, 0, dims={"N": 2})

    xs = ("x", F, [2, 1, 3, 1])

    def axes(v: Sequence[int]) -> dict[str, np.ndarray]:
        return {"axes": np.array(v, np.int64)}

    add("Squeeze-axes1-in0", single("Squeeze", ["x", "axes"], [xs], inits=axes([1])), 0, 0)
    add("Squeeze-axesneg1-in2", single("Squeeze", ["x", "axes"], [xs], inits=axes([-1])), 2, 0)
    add("Squeeze-noaxes-in0", single("Squeeze", ["x"], [xs]), 0, 0)
    add("Squeeze-noaxes-inneg1-out1", single("Squeeze", ["x"], [xs]), -1, 1)
    add("Squeeze-axes1_3-in4", single("Squeeze", ["x", "axes"], [xs], inits=axes([1, 3])), 4, 0)
    add("Squeeze-to_scalar", single("Squeeze", ["x"], [("x", F, [1])]), 0, 0)
    add("Squeeze-opset21", single("Squeeze", ["x", "axes"], [xs], opset=21, inits=axes([-3])), 1, 0)

    add("Unsqueeze-axes0-in0", single("Unsqueeze", ["x", "axes"], [x], inits=axes([0])), 0, 0)
    add("Unsqueeze-axesneg1-in1", single("Unsqueeze", ["x", "axes"], [x], inits=axes([-1])), 1, 0)
    add("Unsqueeze-axes0_3-in0-out2", single("Unsqueeze", ["x", "axes"], [x], inits=axes([0, 3])), 0, 2)
    add("Unsqueeze-axes1_neg1-inneg1", single("Unsqueeze", ["x", "axes"], [x], inits=axes([1, -1])), -1, 0)
    add("Unsqueeze-scalar", single("Unsqueeze", ["x", "axes"], [("x", F, [])], inits=axes([0])), 0, 1)

    for ax in (0, 1, 2, -1, 3):
        add(f"Flatten-axis{ax}-in0", single("Flatten", ["x"], [x], axis=ax), 0, 0)
    add("Flatten-default-in1-out1", single("Flatten", ["x"], [x]), 1, 1)
    add("Flatten-axis0-inneg1", single("Flatten", ["x"], [x], axis=0), -1, 0)
    add(
        "Flatten-axisneg2-symN",
        single("Flatten", ["x"], [("x", F, ["N", 3, 2])], axis=-2),
        0,
        0,
        dims={"N": 2},
    )

    add(
        "Expand-3x1_to_2x3x4-in0",
        single("Expand", ["x", "shape"], [("x", F, [3, 1])], inits=shp([2, 3, 4])),
        0,
        0,
    )
    add(
        "Expand-3x1_to_3x4-in1", single("Expand", ["x", "shape"], [("x", F, [3, 1])], inits=shp([3, 4])), 1, 0
    )
    add(
        "Expand-shape_shorter_than_x",
        single("Expand", ["x", "shape"], [("x", F, [2, 3, 1])], inits=shp([4])),
        0,
        0,
    )
    add(
        "Expand-adds_leading_ones",
        single("Expand", ["x", "shape"], [("x", F, [2, 3])], inits=shp([1, 1, 3])),
        0,
        0,
    )
    add("Expand-scalar_x", single("Expand", ["x", "shape"], [("x", F, [])], inits=shp([2, 3])), 0, -1)
    m = single("Expand", ["x", "shape"], [("x", F, [3, 1]), ("shape", I64, [2])])
    add("Expand-shape_shared_input", m, (0, None), 1, gens={"shape": const([3, 4], np.int64)})

    a, b = ("a", F, [2, 3]), ("b", F, [2, 3])
    add("Concat-axis0-both_in0", single("Concat", ["a", "b"], [a, b], axis=0), 0, 0)
    add("Concat-axisneg1-a_batched_b_shared", single("Concat", ["a", "b"], [a, b], axis=-1), (0, None), 0)
    add("Concat-axis0-a_shared_b_batched_in1", single("Concat", ["a", "b"], [a, b], axis=0), (None, 1), 1)
    m = single("Concat", ["a", "b", "c"], [a, ("b", F, [2, 1]), ("c", F, [2, 2])], axis=1)
    add("Concat-3inputs-mixed", m, (1, None, 0), 0)
    add(
        "Concat-initializer",
        single("Concat", ["a", "w"], [a], inits={"w": np.ones((1, 3), np.float32)}, axis=0),
        -1,
        0,
    )

    xsp = ("x", F, [4, 3])
    add(
        "Split-opset18-num_outputs2-axis0",
        single("Split", ["x"], [xsp], ("y0", "y1"), num_outputs=2, axis=0),
        0,
        0,
    )
    m = single("Split", ["x"], [("x", F, [2, 7])], ("y0", "y1", "y2"), num_outputs=3, axis=1)
    add("Split-opset18-num_outputs3-uneven", m, 1, (0, 1, -1))
    m = single(
        "Split",
        ["x", "split"],
        [("x", F, [2, 4])],
        ("y0", "y1"),
        inits={"split": np.array([1, 3], np.int64)},
        axis=-1,
    )
    add("Split-split_input-axisneg1", m, -1, 0)
    m = single(
        "Split", ["x", "split"], [xsp], ("y0", "y1"), opset=13, inits={"split": np.array([3, 1], np.int64)}
    )
    add("Split-opset13-split_input", m, 0, 1)
    m = single("Split", ["x"], [("x", F, [2, 6])], ("y0", "y1", "y2"), opset=13, axis=1)
    add("Split-opset13-equal", m, 0, 0)

    xsl = ("x", F, [4, 5])

    def sl(
        starts: Sequence[int],
        ends: Sequence[int],
        axes_: Sequence[int] | None = None,
        steps: Sequence[int] | None = None,
    ) -> onnx.ModelProto:
        inits = {"starts": np.array(starts, np.int64), "ends": np.array(ends, np.int64)}
        names = ["x", "starts", "ends"]
        if axes_ is not None:
            inits["axes"] = np.array(axes_, np.int64)
            names.append("axes")
        if steps is not None:
            inits["steps"] = np.array(steps, np.int64)
            names.append("steps")
        return single("Slice", names, [xsl], inits=inits)

    add("Slice-axes0-in0", sl([1], [3], [0]), 0, 0)
    add("Slice-no_axes_no_steps-in1", sl([1, 0], [3, 4]), 1, 0)
    add("Slice-negative_starts_ends_axes", sl([-3], [-1], [-1]), 0, 1)
    add("Slice-reverse_step-inneg1", sl([-1], [-INT64_MAX], [0], [-1]), -1, 0)
    add("Slice-step2-ends_int64max", sl([0, 1], [INT64_MAX, INT64_MAX], [0, 1], [2, 2]), 0, 0)
    add("Slice-all_axes_neg_step", sl([3, 4], [0, 0], [0, 1], [-2, -1]), 2, 2)
    m = single("Slice", ["x", "s", "e", "a"], [xsl, ("s", I64, [1]), ("e", I64, [1]), ("a", I64, [1])])
    gens = {"s": const([1], np.int64), "e": const([4], np.int64), "a": const([1], np.int64)}
    add("Slice-starts_ends_axes_shared_inputs", m, (0, None, None, None), 0, gens=gens)

    rep = {"r": np.array([2, 1], np.int64)}
    add("Tile-repeats_init-in0", single("Tile", ["x", "r"], [("x", F, [2, 3])], inits=rep), 0, 0)
    m = single("Tile", ["x", "r"], [("x", F, [2, 3]), ("r", I64, [2])])
    add("Tile-repeats_shared_input-in1", m, (1, None), 1, gens={"r": const([1, 3], np.int64)})
    add("Tile-1d", single("Tile", ["x", "r"], [("x", I64, [3])], inits={"r": np.array([3], np.int64)}), -1, 0)


_shape_cases()


def _pad_cases() -> None:
    x = ("x", F, [3, 4])
    pads = {"pads": np.array([1, 0, 0, 2], np.int64)}
    add("Pad-constant_default-in0", single("Pad", ["x", "pads"], [x], inits=pads), 0, 0)
    add(
        "Pad-constant_value-in1",
        single("Pad", ["x", "pads", "cv"], [x], inits={**pads, "cv": np.array(1.5, np.float32)}),
        1,
        0,
    )
    add("Pad-reflect-inneg1", single("Pad", ["x", "pads"], [x], inits=pads, mode="reflect"), -1, 1)
    add("Pad-edge-in0", single("Pad", ["x", "pads"], [x], inits=pads, mode="edge"), 0, 2)
    add("Pad-wrap-opset19", single("Pad", ["x", "pads"], [x], opset=19, inits=pads, mode="wrap"), 0, 0)
    axes = {
        "pads": np.array([1, 2], np.int64),
        "cv": np.array(0.0, np.float32),
        "axes": np.array([1], np.int64),
    }
    add("Pad-axes1-opset18", single("Pad", ["x", "pads", "cv", "axes"], [x], inits=axes), 0, 0)
    axesn = {"pads": np.array([2, 1], np.int64), "axes": np.array([-1], np.int64)}
    add(
        "Pad-axesneg1-reflect-no_cv",
        single("Pad", ["x", "pads", "", "axes"], [x], inits=axesn, mode="reflect"),
        1,
        0,
    )
    axes2 = {"pads": np.array([1, 0, 1, 1], np.int64), "axes": np.array([0, -1], np.int64)}
    add(
        "Pad-axes0_neg1-edge-opset21",
        single("Pad", ["x", "pads", "", "axes"], [x], opset=21, inits=axes2, mode="edge"),
        0,
        0,
    )
    add(
        "Pad-negative_pads-crop",
        single("Pad", ["x", "pads"], [x], inits={"pads": np.array([-1, 1, 0, -2], np.int64)}),
        0,
        0,
    )
    m = single("Pad", ["x", "pads"], [x, ("pads", I64, [4])])
    add("Pad-pads_shared_input", m, (0, None), 0, gens={"pads": const([0, 1, 2, 0], np.int64)})
    add("Pad-opset13", single("Pad", ["x", "pads"], [x], opset=13, inits=pads, mode="reflect"), 0, 0)
    add("Pad-opset24", single("Pad", ["x", "pads"], [x], opset=24, inits=pads), 1, 1)


_pad_cases()


def _gather_scatter_cases() -> None:
    data = ("data", F, [5, 3])
    idx_gen = ints(-5, 5, [2])
    m = single("Gather", ["data", "idx"], [data, ("idx", I64, [2])], axis=0)
    add("Gather-axis0-data_batched_idx_shared", m, (0, None), 0, gens={"idx": idx_gen})
    add("Gather-axis0-data_shared_idx_batched", m, (None, 0), 0, gens={"idx": idx_gen})
    add("Gather-axis0-both_batched", m, (1, 0), 1, gens={"idx": idx_gen})
    m = single("Gather", ["data", "idx"], [data, ("idx", I64, [])], axis=-1)
    add("Gather-axisneg1-scalar_idx-both", m, (0, 0), 0, gens={"idx": ints(-3, 3, [])})
    add("Gather-axisneg1-scalar_idx-idx_batched", m, (None, 0), 0, gens={"idx": ints(-3, 3, [])})
    m = single("Gather", ["data", "idx"], [data, ("idx", I64, [2, 2])], axis=1)
    add("Gather-axis1-2d_idx-both_inneg1", m, (-1, 0), 1, gens={"idx": ints(-3, 3, [2, 2])})
    add("Gather-axis1-2d_idx-idx_batched_in2", m, (None, 2), 0, gens={"idx": ints(-3, 3, [2, 2])})
    add("Gather-axis1-2d_idx-data_batched", m, (0, None), 2, gens={"idx": ints(-3, 3, [2, 2])})
    m = single(
        "Gather", ["data", "idx"], [("data", F, [5, 3])], inits={"idx": np.array([4, 0, -1], np.int64)}
    )
    add("Gather-idx_initializer", m, 0, 0)
    m = single("Gather", ["data", "idx"], [("data", F, [5, 3]), ("idx", I32, [2])])
    add("Gather-int32_idx-both", m, (0, 0), 0, gens={"idx": ints(0, 5, [2], np.int32)})

    d = ("data", F, [3, 4])
    m = single("GatherElements", ["data", "idx"], [d, ("idx", I64, [3, 2])], axis=1)
    g = {"idx": ints(-4, 4, [3, 2])}
    add("GatherElements-axis1-data_batched", m, (0, None), 0, gens=g)
    add("GatherElements-axis1-idx_batched", m, (None, 0), 0, gens=g)
    add("GatherElements-axis1-both_mixed_axes", m, (1, -1), 1, gens=g)
    m = single("GatherElements", ["data", "idx"], [d, ("idx", I64, [2, 4])], axis=0)
    g = {"idx": ints(0, 3, [2, 4])}
    add("GatherElements-axis0-both", m, (0, 0), 0, gens=g)
    add("GatherElements-axis0-idx_batched_in1", m, (None, 1), 2, gens=g)
    m = single("GatherElements", ["data", "idx"], [d, ("idx", I64, [3, 1])], axis=-1)
    add("GatherElements-axisneg1-data_batched_in2", m, (2, None), 0, gens={"idx": ints(0, 4, [3, 1])})

    d3 = ("data", F, [3, 4])
    m = single("GatherND", ["data", "idx"], [d3, ("idx", I64, [2, 1])])
    g = {"idx": ints(0, 3, [2, 1])}
    add("GatherND-b0-idx_last1-data_batched", m, (0, None), 0, gens=g)
    add("GatherND-b0-idx_last1-idx_batched", m, (None, 0), 0, gens=g)
    add("GatherND-b0-idx_last1-both", m, (1, 1), 1, gens=g)
    m = single("GatherND", ["data", "idx"], [d3, ("idx", I64, [2, 2])])
    g = {
        "idx": lambda rng: np.stack([rng.integers(0, 3, 2), rng.integers(-4, 4, 2)], axis=1).astype(np.int64)
    }
    add("GatherND-b0-idx_last2-both", m, (0, 0), 0, gens=g)
    add("GatherND-b0-idx_last2-idx_batched", m, (None, -1), 0, gens=g)
    m = single("GatherND", ["data", "idx"], [("data", F, [2, 3, 4]), ("idx", I64, [2, 1])], batch_dims=1)
    g = {"idx": ints(0, 3, [2, 1])}
    add("GatherND-batch_dims1-both", m, (0, 0), 0, gens=g)
    add("GatherND-batch_dims1-data_batched_in1", m, (1, None), 0, gens=g)
    add("GatherND-batch_dims1-idx_batched", m, (None, 0), 1, gens=g)
    m = single("GatherND", ["data", "idx"], [("data", F, [2, 3, 4]), ("idx", I64, [2, 2, 2])], batch_dims=1)
    g = {
        "idx": lambda rng: np.stack([rng.integers(0, 3, (2, 2)), rng.integers(0, 4, (2, 2))], axis=-1).astype(
            np.int64
        )
    }
    add("GatherND-batch_dims1-idx_last2-both", m, (0, 0), 0, gens=g)

    specs: list[ValueSpec] = [("data", F, [3, 4]), ("idx", I64, [2, 4]), ("upd", F, [2, 4])]
    g = {"idx": distinct_rows(3, 2, 4)}
    combos: list[tuple[str, InAxes]] = [
        ("data_batched", (0, None, None)),
        ("idx_batched", (None, 0, None)),
        ("upd_batched", (None, None, 1)),
        ("all_batched", (0, 0, 0)),
        ("data_idx_batched_mixed", (1, -1, None)),
    ]
    for red in ("none", "add", "mul", "max", "min"):
        m = single("ScatterElements", ["data", "idx", "upd"], specs, axis=0, reduction=red)
        for cid, in_axes in combos:
            add(f"ScatterElements-axis0-{red}-{cid}", m, in_axes, 0, gens=g)
    specs1: list[ValueSpec] = [("data", F, [3, 4]), ("idx", I64, [3, 2]), ("upd", F, [3, 2])]
    m = single("ScatterElements", ["data", "idx", "upd"], specs1, axis=-1)
    g1 = {"idx": distinct_cols(3, 2, 4, negative=True)}
    add("ScatterElements-axisneg1-neg_idx-all_batched", m, (0, 0, 0), 1, gens=g1)
    add("ScatterElements-axisneg1-neg_idx-idx_batched", m, (None, 2, None), 0, gens=g1)
    m = single("ScatterElements", ["data", "idx", "upd"], specs1, axis=1, reduction="add")
    add("ScatterElements-add-duplicates-all_batched", m, (0, 0, 0), 0, gens={"idx": ints(0, 4, [3, 2])})

    specs_nd: list[ValueSpec] = [("data", F, [4, 3]), ("idx", I64, [2, 1]), ("upd", F, [2, 3])]
    gnd = {"idx": nd_indices(4, 2)}
    for red in ("none", "add", "mul", "max", "min"):
        m = single("ScatterND", ["data", "idx", "upd"], specs_nd, reduction=red)
        for cid, in_axes in combos:
            add(f"ScatterND-rows-{red}-{cid}", m, in_axes, 0, gens=gnd)
    specs_el: list[ValueSpec] = [("data", F, [4, 3]), ("idx", I64, [2, 2]), ("upd", F, [2])]

    def elem_idx(rng: np.random.Generator) -> np.ndarray:
        flat = rng.permutation(12)[:2]
        return np.stack([flat // 3, flat % 3], axis=1).astype(np.int64)

    m = single("ScatterND", ["data", "idx", "upd"], specs_el)
    add("ScatterND-elements-all_batched", m, (0, 0, 0), 0, gens={"idx": elem_idx})
    add("ScatterND-elements-idx_batched_in1", m, (None, 1, None), 1, gens={"idx": elem_idx})
    add("ScatterND-elements-upd_batched", m, (None, None, 0), 0, gens={"idx": elem_idx})
    m = single(
        "ScatterND", ["data", "idx", "upd"], [("data", F, [2, 3]), ("idx", I64, [0, 2]), ("upd", F, [0])]
    )
    add("ScatterND-empty_indices", m, (0, 0, 0), 0)


_gather_scatter_cases()


def _misc_cases() -> None:
    x = ("x", F, [2, 3, 4])
    add("Shape-in0", single("Shape", ["x"], [x]), 0, 0)
    add("Shape-start1-in1", single("Shape", ["x"], [x], start=1), 1, 0)
    add("Shape-end_neg1-inneg1", single("Shape", ["x"], [x], end=-1), -1, 1)
    add("Shape-start_neg2", single("Shape", ["x"], [x], start=-2), 0, 0)
    add("Shape-symN", single("Shape", ["x"], [("x", F, ["N", 3])]), 0, 0, dims={"N": 2})
    add("Size-in0", single("Size", ["x"], [x]), 0, 0)
    add("Size-in2", single("Size", ["x"], [x]), 2, 0)

    m = make_model(
        [
            node("Shape", ["x"], ["s"], start=1),
            node("ConstantOfShape", ["s"], ["c"], value=onnx.helper.make_tensor("v", F, [1], [2.0])),
            node("Add", ["x", "c"], ["y"]),
        ],
        [x],
        ["y", "c"],
    )
    add("ConstantOfShape-from_batched_shape", m, 1, (0, 1))
    m = single("ConstantOfShape", ["s"], [("s", I64, [2])], value=onnx.helper.make_tensor("v", I32, [1], [7]))
    add(
        "ConstantOfShape-shared_shape_only_output",
        make_model(
            [
                node("ConstantOfShape", ["s"], ["c"], value=onnx.helper.make_tensor("v", I32, [1], [7])),
                node("Neg", ["x"], ["y"]),
            ],
            [("s", I64, [2]), ("x", F, [3])],
            ["c", "y"],
        ),
        (None, 0),
        0,
        gens={"s": const([2, 3], np.int64)},
    )

    m = make_model(
        [node("Range", ["start", "limit", "delta"], ["r"]), node("Add", ["x", "r"], ["y"])],
        [("x", F, [4])],
        ["y"],
        initializers={
            "start": np.array(1.0, np.float32),
            "limit": np.array(3.0, np.float32),
            "delta": np.array(0.5, np.float32),
        },
    )
    add("Range-initializers-plus_batched", m, 0, 0)
    m = make_model(
        [node("Range", ["start", "limit", "delta"], ["r"]), node("Mul", ["x", "r"], ["y"])],
        [("x", I64, [3, 1]), ("start", I64, []), ("limit", I64, []), ("delta", I64, [])],
        ["y", "r"],
    )
    gens = {"start": const(5, np.int64), "limit": const(-1, np.int64), "delta": const(-2, np.int64)}
    add("Range-shared_inputs-plus_batched", m, (1, None, None, None), 0, gens=gens)

    xt = ("x", F, [3, 4])
    add("Trilu-upper-in0", single("Trilu", ["x"], [xt]), 0, 0)
    add(
        "Trilu-lower-k_neg1-in1",
        single("Trilu", ["x", "k"], [("x", F, [2, 3, 4])], inits={"k": np.array(-1, np.int64)}, upper=0),
        1,
        0,
    )
    add("Trilu-upper-k2-inneg1", single("Trilu", ["x", "k"], [xt], inits={"k": np.array(2, np.int64)}), -1, 1)
    m = single("Trilu", ["x", "k"], [xt, ("k", I64, [])], upper=0)
    add("Trilu-k_shared_input", m, (0, None), 0, gens={"k": const(1, np.int64)})
    add("Trilu-square_size1", single("Trilu", ["x"], [("x", F, [1, 1])], upper=0), 0, 0)
    # A per-example diagonal offset k (a mask from each example's k)
    m = single("Trilu", ["x", "k"], [xt, ("k", I64, [])])
    add("Trilu-upper-k_batched", m, 0, 0, gens={"k": ints(-3, 5, [])})
    m = single("Trilu", ["x", "k"], [("x", F, [2, 3, 5]), ("k", I64, [])], upper=0)
    add("Trilu-lower-k_batched-x_shared", m, (None, 0), 0, gens={"k": ints(-4, 6, [])})
    m = single("Trilu", ["x", "k"], [("x", B, [4, 4]), ("k", I64, [])])
    add(
        "Trilu-bool-k_batched-out1",
        m,
        (1, 0),
        1,
        gens={"x": ints(0, 2, [4, 4], np.bool_), "k": ints(-2, 3, [])},
    )

    ohi = {"depth": np.array(4, np.int64), "values": np.array([0.0, 1.0], np.float32)}
    m = single("OneHot", ["idx", "depth", "values"], [("idx", I64, [3])], inits=ohi)
    add("OneHot-axisneg1-in0", m, 0, 0, gens={"idx": ints(-4, 4, [3])})
    m = single("OneHot", ["idx", "depth", "values"], [("idx", I64, [3])], inits=ohi, axis=0)
    add("OneHot-axis0-in0", m, 0, 1, gens={"idx": ints(0, 4, [3])})
    m = single("OneHot", ["idx", "depth", "values"], [("idx", I64, [2, 3])], inits=ohi, axis=1)
    add("OneHot-axis1-in1", m, 1, 0, gens={"idx": ints(-4, 4, [2, 3])})
    m = single(
        "OneHot", ["idx", "depth", "values"], [("idx", I64, [2]), ("depth", I64, []), ("values", F, [2])]
    )
    gens = {"idx": ints(0, 3, [2]), "depth": const(3, np.int64), "values": const([-1.0, 2.0], np.float32)}
    add("OneHot-idx_and_values_batched", m, (0, None, 0), 0, gens=gens)

    add("Identity-in1", single("Identity", ["x"], [x]), 1, 0)
    cval = onnx.helper.make_tensor("c", F, [4], [1.0, 2.0, 3.0, 4.0])
    m = make_model([node("Constant", [], ["c"], value=cval), node("Add", ["x", "c"], ["y"])], [x], ["y"])
    add("Constant-used_by_batched_add", m, 0, 0)
    m = make_model([node("Constant", [], ["c"], value=cval), node("Relu", ["x"], ["y"])], [x], ["y", "c"])
    add("Constant-as_output_broadcast", m, 0, (0, 1))
    m = make_model(
        [node("Constant", [], ["c"], value_floats=[1.0, -1.0]), node("Mul", ["x", "c"], ["y"])],
        [("x", F, [3, 2])],
        ["y"],
    )
    add("Constant-value_floats", m, 1, 0)
    add("Dropout-inference-no_ratio", single("Dropout", ["x"], [x]), 0, 0)
    m = single(
        "Dropout",
        ["x", "ratio", "train"],
        [x],
        ("y", "mask"),
        inits={"ratio": np.array(0.3, np.float32), "train": np.array(False)},
    )
    add("Dropout-inference-mask_output", m, 1, (0, 2))


_misc_cases()


# ---- neural-network operators ----------------------------------------------------------------


def _conv_cases() -> None:
    rng = np.random.default_rng(42)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    x = ("x", F, [2, 2, 5, 5])
    tol = 1e-4
    m = single("Conv", ["x", "w", "b"], [x], inits={"w": w, "b": bias})
    add("Conv-x_batched_w_init", m, 0, 0, rtol=tol, atol=tol)
    add("Conv-x_batched_in1-out2", m, 1, 2, rtol=tol, atol=tol)
    add("Conv-x_batched_inneg1", m, -1, 0, rtol=tol, atol=tol)
    m = single("Conv", ["x", "w", "b"], [x, ("w", F, [3, 2, 3, 3]), ("b", F, [3])], pads=[1, 1, 1, 1])
    add("Conv-x_shared_w_batched", m, (None, 0, None), 0, rtol=tol, atol=tol)
    add("Conv-all_batched", m, (0, 0, 0), 0, rtol=tol, atol=tol)
    add("Conv-bias_batched_only", m, (None, None, 0), 1, rtol=tol, atol=tol)
    add("Conv-x_w_batched_mixed_axes", m, (1, -1, None), 0, rtol=tol, atol=tol)
    wg = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    m = single("Conv", ["x", "w"], [x], inits={"w": wg}, group=2, strides=[2, 2], pads=[1, 0, 1, 0])
    add("Conv-group2-strides-x_batched", m, 0, 0, rtol=tol, atol=tol)
    m = single("Conv", ["x", "w"], [x, ("w", F, [4, 1, 3, 3])], group=2, dilations=[2, 1])
    add("Conv-group2-dilations-w_batched", m, (None, 0), 0, rtol=tol, atol=tol)
    add("Conv-group2-dilations-both", m, (0, 0), 0, rtol=tol, atol=tol)
    m = single(
        "Conv", ["x", "w"], [("x", F, [1, 2, 7]), ("w", F, [3, 2, 3])], auto_pad="SAME_UPPER", strides=[2]
    )
    add("Conv-1d-same_upper-both", m, (0, 0), 0, rtol=tol, atol=tol)
    add("Conv-1d-same_upper-x_batched", m, (2, None), 1, rtol=tol, atol=tol)
    m = single("Conv", ["x", "w"], [("x", F, ["N", 2, 4, 4])], inits={"w": w})
    add("Conv-symN", m, 0, 0, dims={"N": 2}, rtol=tol, atol=tol)
    # Batched weights (per-example gradients of CNNs) are vectorized by window extraction
    # plus a batched MatMul; these cover its index algebra.
    m = single(
        "Conv",
        ["x", "w", "b"],
        [("x", F, [2, 4, 7, 6]), ("w", F, [6, 2, 3, 2]), ("b", F, [6])],
        group=2,
        strides=[2, 1],
        dilations=[1, 2],
        pads=[1, 0, 2, 1],
    )
    add("Conv-group2-strides-dilations-pads-all_batched", m, (0, 0, 0), 0, rtol=tol, atol=tol)
    add("Conv-group2-strides-dilations-pads-w_b_batched", m, (None, 1, 0), 2, rtol=tol, atol=tol)
    m = single(
        "Conv", ["x", "w"], [("x", F, [1, 3, 4, 5, 3]), ("w", F, [2, 3, 2, 3, 1])], pads=[0, 1, 0, 1, 0, 0]
    )
    add("Conv-3d-w_batched", m, (None, 0), 0, rtol=tol, atol=tol)
    add("Conv-3d-both_batched", m, (3, 1), 0, rtol=tol, atol=tol)
    m = single(
        "Conv",
        ["x", "w"],
        [("x", F, [2, 2, 8]), ("w", F, [4, 1, 4])],
        auto_pad="SAME_LOWER",
        strides=[3],
        group=2,
    )
    add("Conv-1d-same_lower-group2-both", m, (0, 0), 0, rtol=tol, atol=tol)
    m = single("Conv", ["x", "w"], [("x", F, ["N", 2, 5, 5]), ("w", F, [3, 2, 3, 3])], kernel_shape=[3, 3])
    add("Conv-symN-kernel_shape-both", m, (0, 0), 0, dims={"N": 3}, rtol=tol, atol=tol)

    wt = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    xt = ("x", F, [1, 2, 4, 4])
    m = single("ConvTranspose", ["x", "w"], [xt], inits={"w": wt})
    add("ConvTranspose-x_batched", m, 0, 0, rtol=tol, atol=tol)
    m = single(
        "ConvTranspose",
        ["x", "w", "b"],
        [xt],
        inits={"w": wt, "b": bias},
        strides=[2, 2],
        output_padding=[1, 1],
        pads=[1, 1, 1, 1],
    )
    add("ConvTranspose-strides_output_padding-in1", m, 1, 0, rtol=tol, atol=tol)
    m = single("ConvTranspose", ["x", "w"], [xt, ("w", F, [2, 3, 3, 3])], strides=[2, 1])
    add("ConvTranspose-w_batched", m, (None, 0), 0, rtol=tol, atol=tol)
    add("ConvTranspose-both_batched", m, (0, 0), 1, rtol=tol, atol=tol)
    m = single("ConvTranspose", ["x", "w"], [xt, ("w", F, [2, 1, 3, 3])], group=2)
    add("ConvTranspose-group2-both", m, (0, 0), 0, rtol=tol, atol=tol)
    m = single(
        "ConvTranspose",
        ["x", "w"],
        [("x", F, [2, 2, 5])],
        inits={"w": wt[:, :, 0, :]},
        output_shape=[11],
        strides=[2],
    )
    add("ConvTranspose-1d-output_shape", m, 0, 0, rtol=tol, atol=tol)


_conv_cases()


def _pool_cases() -> None:
    x = ("x", F, [2, 2, 5, 5])
    m = single("MaxPool", ["x"], [x], ("y", "idx"), kernel_shape=[2, 2], strides=[2, 2])
    add("MaxPool-indices-in0", m, 0, 0)
    add("MaxPool-indices-in1-out1", m, 1, (1, 0))
    m = single(
        "MaxPool",
        ["x"],
        [x],
        ("y", "idx"),
        kernel_shape=[3, 3],
        pads=[1, 1, 1, 1],
        ceil_mode=1,
        strides=[2, 2],
    )
    add("MaxPool-indices-pads_ceil-inneg1", m, -1, 0)
    m = single("MaxPool", ["x"], [x], ("y", "idx"), kernel_shape=[2, 2], storage_order=1)
    add("MaxPool-indices-storage_order1", m, 0, 0)
    m = single("MaxPool", ["x"], [x], kernel_shape=[2, 2], dilations=[2, 2])
    add("MaxPool-dilations", m, 0, 0)
    m = single("MaxPool", ["x"], [("x", F, [2, 3, 8])], ("y", "idx"), kernel_shape=[3], strides=[2])
    add("MaxPool-1d-indices-in2", m, 2, 0)
    m = single(
        "MaxPool", ["x"], [("x", F, [1, 1, 4, 4])], ("y", "idx"), kernel_shape=[2, 2], auto_pad="SAME_UPPER"
    )
    add("MaxPool-N1C1-same_upper", m, 0, 0)

    tol = 1e-5
    add(
        "AveragePool-k3-pads-in0",
        single("AveragePool", ["x"], [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        0,
        0,
        rtol=tol,
        atol=tol,
    )
    add(
        "AveragePool-count_include_pad-in1",
        single("AveragePool", ["x"], [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
        1,
        0,
        rtol=tol,
        atol=tol,
    )
    add(
        "AveragePool-strides_ceil-inneg1",
        single("AveragePool", ["x"], [x], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        -1,
        2,
        rtol=tol,
        atol=tol,
    )
    add(
        "AveragePool-1d",
        single("AveragePool", ["x"], [("x", F, [2, 3, 8])], kernel_shape=[3]),
        0,
        0,
        rtol=tol,
        atol=tol,
    )
    add("LpPool-p2-in0", single("LpPool", ["x"], [x], kernel_shape=[2, 2], p=2), 0, 0, rtol=tol, atol=tol)
    add(
        "LpPool-p1-strides-in1",
        single("LpPool", ["x"], [x], kernel_shape=[2, 2], strides=[2, 2], p=1),
        1,
        0,
        rtol=tol,
        atol=tol,
    )
    for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        add(f"{op}-in0", single(op, ["x"], [x]), 0, 0, rtol=tol, atol=tol)
        add(f"{op}-in1-out1", single(op, ["x"], [x]), 1, 1, rtol=tol, atol=tol)
        add(f"{op}-1d-inneg1", single(op, ["x"], [("x", F, [2, 3, 4])]), -1, 0, rtol=tol, atol=tol)


_pool_cases()


def _norm_cases() -> None:
    rng = np.random.default_rng(7)
    tol = 1e-4
    x = ("x", F, [2, 3, 4, 4])
    c3 = {
        "s": rng.standard_normal(3).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
        "mean": rng.standard_normal(3).astype(np.float32),
        "var": rng.uniform(0.5, 2.0, 3).astype(np.float32),
    }
    m = single("BatchNormalization", ["x", "s", "b", "mean", "var"], [x], inits=c3, epsilon=1e-3)
    add("BatchNormalization-x_batched-in0", m, 0, 0, rtol=tol, atol=tol)
    add("BatchNormalization-x_batched-in1", m, 1, 0, rtol=tol, atol=tol)
    add("BatchNormalization-x_batched-inneg1-out2", m, -1, 2, rtol=tol, atol=tol)
    specs: list[ValueSpec] = [x, ("s", F, [3]), ("b", F, [3]), ("mean", F, [3]), ("var", F, [3])]
    m = single("BatchNormalization", ["x", "s", "b", "mean", "var"], specs)
    g = {"var": uniform(0.5, 2.0, [3])}
    add("BatchNormalization-params_batched", m, (0, 0, 0, 0, 0), 0, gens=g, rtol=tol, atol=tol)
    add(
        "BatchNormalization-x_shared_scale_batched",
        m,
        (None, 0, None, None, None),
        0,
        gens=g,
        rtol=tol,
        atol=tol,
    )
    add("BatchNormalization-mean_var_batched", m, (1, None, None, 0, 0), 1, gens=g, rtol=tol, atol=tol)
    m = single("BatchNormalization", ["x", "s", "b", "mean", "var"], [("x", F, [2, 3])], inits=c3)
    add("BatchNormalization-2d_input", m, 0, 0, rtol=tol, atol=tol)
    m = single("BatchNormalization", ["x", "s", "b", "mean", "var"], [x], opset=15, inits=c3)
    add("BatchNormalization-opset15", m, 0, 0, rtol=tol, atol=tol)

    xi = ("x", F, [2, 3, 4])
    m = single("InstanceNormalization", ["x", "s", "b"], [xi], inits={"s": c3["s"], "b": c3["b"]})
    add("InstanceNormalization-x_batched-in0", m, 0, 0, rtol=tol, atol=tol)
    add("InstanceNormalization-x_batched-in2", m, 2, 1, rtol=tol, atol=tol)
    m = single("InstanceNormalization", ["x", "s", "b"], [xi, ("s", F, [3]), ("b", F, [3])])
    add("InstanceNormalization-all_batched", m, 0, 0, rtol=tol, atol=tol)
    add("InstanceNormalization-scale_batched", m, (None, 0, None), 0, rtol=tol, atol=tol)

    m = single(
        "LayerNormalization",
        ["x", "s", "b"],
        [xi],
        inits={"s": np.arange(1, 5, dtype=np.float32), "b": np.ones(4, np.float32)},
    )
    add("LayerNormalization-axisneg1-in0", m, 0, 0, rtol=tol, atol=tol)
    add("LayerNormalization-axisneg1-in2", m, 2, 0, rtol=tol, atol=tol)
    m = single("LayerNormalization", ["x", "s"], [xi], inits={"s": np.full((3, 4), 0.5, np.float32)}, axis=1)
    add("LayerNormalization-axis1-no_bias-in0", m, 0, 0, rtol=tol, atol=tol)
    add("LayerNormalization-axis1-no_bias-inneg1", m, -1, 1, rtol=tol, atol=tol)
    m = single(
        "LayerNormalization",
        ["x", "s", "b"],
        [xi, ("s", F, [4]), ("b", F, [4])],
        ("y", "mean", "istd"),
        axis=-1,
        epsilon=1e-3,
    )
    add("LayerNormalization-3outputs-all_batched", m, 0, (0, 1, -1), rtol=tol, atol=tol)
    add("LayerNormalization-3outputs-scale_batched_only", m, (None, 0, None), 0, rtol=tol, atol=tol)
    add("LayerNormalization-3outputs-x_batched_in1", m, (1, None, None), 1, rtol=tol, atol=tol)

    xg = ("x", F, [2, 4, 3])
    # GroupNormalization-18 is deprecated (the ONNX checker rejects it), so only opset 21 is tested.
    # ONNX shape inference leaves GroupNormalization's output untyped, so declare it.
    m = make_model(
        [node("GroupNormalization", ["x", "s", "b"], ["out"], num_groups=2)],
        [xg, ("s", F, [4]), ("b", F, [4])],
        [("out", F, [2, 4, 3])],
        opset=21,
    )
    add("GroupNormalization-opset21-all_batched", m, 0, 0, rtol=tol, atol=tol)
    add("GroupNormalization-opset21-x_batched", m, (-1, None, None), 1, rtol=tol, atol=tol)
    add("GroupNormalization-opset21-scale_batched", m, (None, 0, None), 0, rtol=tol, atol=tol)
    # Followed by ops whose rules need its rank, nothing declared: onnax types the output of
    # this function op itself (ONNX's inference has no function for it).
    m = make_model(
        [
            node("GroupNormalization", ["x", "s", "b"], ["n"], num_groups=2),
            node("Softmax", ["n"], ["p"], axis=1),
            node("Transpose", ["p"], ["out"], perm=[2, 0, 1]),
        ],
        [xg, ("s", F, [4]), ("b", F, [4])],
        ["out"],
        opset=21,
    )
    add("GroupNormalization-opset21-undeclared-then-softmax", m, (1, 0, None), 0, rtol=tol, atol=tol)

    m = single("RMSNormalization", ["x", "s"], [xi], opset=23, inits={"s": np.arange(1, 5, dtype=np.float32)})
    add("RMSNormalization-opset23-axisneg1-in0", m, 0, 0, rtol=tol, atol=tol)
    add("RMSNormalization-opset23-axisneg1-in2", m, 2, 1, rtol=tol, atol=tol)
    m = single("RMSNormalization", ["x", "s"], [xi, ("s", F, [3, 4])], opset=23, axis=1)
    add("RMSNormalization-opset23-axis1-all_batched", m, 0, 0, rtol=tol, atol=tol)
    add("RMSNormalization-opset23-axis1-scale_batched", m, (None, 1), 0, rtol=tol, atol=tol)


_norm_cases()


def _attention_cases() -> None:
    tol = 1e-4
    q, k, v = ("q", F, [1, 2, 3, 4]), ("k", F, [1, 2, 5, 4]), ("v", F, [1, 2, 5, 4])
    for opset in (23, 24):
        m = single("Attention", ["q", "k", "v"], [q, k, v], opset=opset)
        add(f"Attention-opset{opset}-4d-all_batched", m, 0, 0, rtol=tol, atol=tol)
        add(f"Attention-opset{opset}-4d-q_batched_kv_shared", m, (0, None, None), 0, rtol=tol, atol=tol)
        add(f"Attention-opset{opset}-4d-kv_batched_in2", m, (None, 2, 2), 1, rtol=tol, atol=tol)
    m = single("Attention", ["q", "k", "v"], [q, k, v], opset=23, is_causal=1, scale=0.3)
    add("Attention-causal-scale-all_batched", m, 0, 0, rtol=tol, atol=tol)
    m = single("Attention", ["q", "k", "v", "mask"], [q, k, v, ("mask", F, [3, 5])], opset=23)
    add("Attention-float_mask_shared", m, (0, 0, 0, None), 0, rtol=tol, atol=tol)
    add("Attention-float_mask_batched", m, (0, None, None, 0), 0, rtol=tol, atol=tol)
    m = single("Attention", ["q", "k", "v", "mask"], [q, k, v, ("mask", B, [1, 1, 3, 5])], opset=23)
    add(
        "Attention-bool_mask_batched",
        m,
        0,
        0,
        gens={
            "mask": lambda rng: np.concatenate(
                [np.ones((1, 1, 3, 1), bool), rng.random((1, 1, 3, 4)) < 0.6], axis=-1
            )
        },
        rtol=tol,
        atol=tol,
    )
    m = single(
        "Attention",
        ["q", "k", "v"],
        [("q", F, [1, 3, 8]), ("k", F, [1, 5, 8]), ("v", F, [1, 5, 8])],
        opset=23,
        q_num_heads=2,
        kv_num_heads=2,
    )
    add("Attention-3d-num_heads-all_batched", m, 0, 0, rtol=tol, atol=tol)
    add("Attention-3d-num_heads-q_batched_in1", m, (1, None, None), 2, rtol=tol, atol=tol)
    m = single(
        "Attention",
        ["q", "k", "v"],
        [("q", F, [2, 2, 3, 4]), ("k", F, [2, 1, 5, 4]), ("v", F, [2, 1, 5, 4])],
        opset=23,
    )
    add("Attention-gqa-all_batched", m, 0, 0, rtol=tol, atol=tol)
    m = single("Attention", ["q", "k", "v"], [q, k, v], opset=23, softcap=2.0)
    add("Attention-softcap", m, (0, 0, None), 0, rtol=tol, atol=tol)
    _attention_merge_cases(tol)


def _bool_mask(shape: Sequence[int]) -> Gen:
    """A random bool mask whose first key is always attended (no fully masked rows)."""

    def gen(rng: np.random.Generator) -> np.ndarray:
        rest = rng.random((*shape[:-1], shape[-1] - 1)) < 0.6
        return np.concatenate([np.ones((*shape[:-1], 1), bool), rest], axis=-1)

    return gen


def _attention_merge_cases(tol: float) -> None:
    """Per-example batch N > 1, so merging the vmap axis into N is exercised for real."""
    q, k, v = ("q", F, [2, 2, 3, 4]), ("k", F, [2, 2, 5, 4]), ("v", F, [2, 2, 5, 4])
    qkv = ["q", "k", "v"]
    m = single("Attention", qkv, [q, k, v], opset=23)
    add("Attention-n2-all_batched", m, 0, 0, rtol=tol, atol=tol)
    add("Attention-n2-k_batched_only", m, (None, 0, None), 0, rtol=tol, atol=tol)
    m = single("Attention", qkv, [q, k, v], opset=24, is_causal=1, softcap=3.0)
    add("Attention-opset24-n2-causal-softcap", m, (1, None, 0), 0, rtol=tol, atol=tol)

    # Masks of every rank ONNX Runtime takes (2-4; it wants the full q and kv lengths, no
    # broadcasting or padding of those two dims), batched and shared, bool and float.
    mask_shapes = {
        "2d": [3, 5],
        "3d": [2, 3, 5],
        "3d_h1": [1, 3, 5],
        "4d": [2, 2, 3, 5],
        "4d_n1": [1, 2, 3, 5],
    }
    mask_axes = {
        "batched": ((0, None, 0, 0), 0),
        "shared": ((0, 0, 0, None), 0),
        "only_batched": (3 * (None,) + (0,), 1),
    }
    for label, shape in mask_shapes.items():
        for dtype, dname in ((F, "float"), (B, "bool")):
            gens = {"mask": _bool_mask(shape)} if dtype == B else {}
            m = single("Attention", [*qkv, "mask"], [q, k, v, ("mask", dtype, shape)], opset=23)
            for how, (in_axes, out_axes) in mask_axes.items():
                add(
                    f"Attention-n2-{dname}_mask{label}_{how}",
                    m,
                    in_axes,
                    out_axes,
                    gens=gens,
                    rtol=tol,
                    atol=tol,
                )
    m = single("Attention", [*qkv, "mask"], [q, k, v, ("mask", F, [2, 1, 3, 5])], opset=23, is_causal=1)
    add("Attention-n2-mask4d_h1_causal_batched", m, (0, 0, 0, 0), 0, rtol=tol, atol=tol)

    # KV cache inside the operator: past_key/past_value in, present_key/present_value out.
    past = [("pk", F, [2, 2, 4, 4]), ("pv", F, [2, 2, 4, 4])]
    outs = ("y", "present_key", "present_value")
    m = single("Attention", [*qkv, "", "pk", "pv"], [q, k, v, *past], outs, opset=23, is_causal=1)
    add("Attention-past-causal-all_batched", m, 0, 0, rtol=tol, atol=tol)
    add("Attention-past-causal-past_batched_only", m, (None, None, None, 0, 0), (0, 1, 2), rtol=tol, atol=tol)
    add("Attention-past-causal-qkv_batched_past_shared", m, (0, 0, 0, None, None), 0, rtol=tol, atol=tol)
    m = single(
        "Attention",
        [*qkv, "mask", "pk", "pv"],
        [q, k, v, ("mask", B, [2, 3, 9]), *past],
        outs,
        opset=24,
    )
    add(
        "Attention-opset24-past-bool_mask3d-batched",
        m,
        (0, 0, 0, 0, None, 0),
        0,
        gens={"mask": _bool_mask([2, 3, 9])},
        rtol=tol,
        atol=tol,
    )

    # qk_matmul_output in each mode, with a batched float mask.
    for mode in (0, 1, 2, 3):
        m = make_model(
            [node("Attention", [*qkv, "mask"], ["y", "", "", "qk"], qk_matmul_output_mode=mode, softcap=4.0)],
            [q, k, v, ("mask", F, [2, 1, 3, 5])],
            ["y", "qk"],
            opset=23,
        )
        add(f"Attention-qk_matmul_output-mode{mode}", m, (0, None, 0, 0), (0, 2), rtol=tol, atol=tol)
    m = single(
        "Attention",
        [*qkv, "", "pk", "pv"],
        [q, k, v, *past],
        ("y", "present_key", "present_value", "qk"),
        opset=24,
        qk_matmul_output_mode=3,
    )
    add("Attention-opset24-past-all_outputs", m, 0, 0, rtol=tol, atol=tol)

    # nonpad_kv_seqlen (opset 24): the external-cache padding mask, per row of N.
    nonpad = ("nonpad", I64, [2])
    m = single("Attention", [*qkv, "", "", "", "nonpad"], [q, k, v, nonpad], opset=24)
    gens = {"nonpad": ints(1, 6, [2])}
    add("Attention-opset24-nonpad-all_batched", m, 0, 0, gens=gens, rtol=tol, atol=tol)
    add("Attention-opset24-nonpad-only_batched", m, (None, None, None, 0), 0, gens=gens, rtol=tol, atol=tol)
    add("Attention-opset24-nonpad-shared", m, (0, 0, 0, None), 0, gens=gens, rtol=tol, atol=tol)
    m = single(
        "Attention",
        [*qkv, "mask", "", "", "nonpad"],
        [q, k, v, ("mask", F, [3, 5]), nonpad],
        opset=24,
        is_causal=1,
    )
    add(
        "Attention-opset24-nonpad-causal-mask_batched",
        m,
        (0, 0, 0, 0, 0),
        0,
        gens={"nonpad": ints(3, 6, [2])},
        rtol=tol,
        atol=tol,
    )

    # 3-D inputs (batch, seq, hidden) with GQA heads, a batched mask and the cache.
    q3, k3, v3 = ("q", F, [2, 3, 8]), ("k", F, [2, 5, 4]), ("v", F, [2, 5, 6])
    m = single(
        "Attention",
        [*qkv, "mask", "pk", "pv"],
        [q3, k3, v3, ("mask", F, [2, 1, 3, 7]), ("pk", F, [2, 1, 2, 4]), ("pv", F, [2, 1, 2, 6])],
        outs,
        opset=23,
        q_num_heads=2,
        kv_num_heads=1,
        scale=0.5,
    )
    add("Attention-3d-gqa-past-mask-all_batched", m, 0, 0, rtol=tol, atol=tol)
    add("Attention-3d-gqa-past-mask-q_in1_mask_shared", m, (1, 0, 0, None, 0, None), 0, rtol=tol, atol=tol)
    m = single(
        "Attention",
        [*qkv, "", "", "", "nonpad"],
        [q3, k3, v3, nonpad],
        opset=24,
        q_num_heads=2,
        kv_num_heads=1,
        is_causal=1,
    )
    gens = {"nonpad": ints(3, 6, [2])}
    add("Attention-opset24-3d-nonpad-causal", m, (0, None, None, 0), 0, gens=gens, rtol=tol, atol=tol)


_attention_cases()


def _resize_cases() -> None:
    x = ("x", F, [1, 2, 3, 3])
    roi = np.array([], np.float32)
    sc = np.array([1.0, 1.0, 2.0, 2.0], np.float32)
    tol = 1e-4
    m = single("Resize", ["x", "roi", "scales"], [x], inits={"roi": roi, "scales": sc}, mode="nearest")
    add("Resize-nearest-scales-in0", m, 0, 0, rtol=tol, atol=tol)
    add("Resize-nearest-scales-in1", m, 1, 2, rtol=tol, atol=tol)
    m = single("Resize", ["x", "", "scales"], [x], inits={"scales": sc}, mode="linear")
    add("Resize-linear-scales-no_roi-inneg1", m, -1, 0, rtol=tol, atol=tol)
    m = single(
        "Resize",
        ["x", "", "", "sizes"],
        [x],
        inits={"sizes": np.array([1, 2, 5, 4], np.int64)},
        mode="linear",
        coordinate_transformation_mode="align_corners",
    )
    add("Resize-linear-sizes-align_corners", m, 0, 0, rtol=tol, atol=tol)
    m = single(
        "Resize",
        ["x", "", "scales"],
        [x],
        inits={"scales": np.array([2.0, 1.5], np.float32)},
        axes=[2, 3],
        mode="cubic",
    )
    add("Resize-cubic-axes-scales", m, 0, 0, rtol=tol, atol=tol)
    # ORT 1.31 ignores keep_aspect_ratio_policy when axes are negative, so keep those apart.
    m = single(
        "Resize",
        ["x", "", "", "sizes"],
        [x],
        opset=19,
        inits={"sizes": np.array([6, 4], np.int64)},
        axes=[2, 3],
        mode="nearest",
        keep_aspect_ratio_policy="not_larger",
    )
    add("Resize-opset19-axes-keep_aspect_not_larger", m, 2, 0, rtol=tol, atol=tol)
    m = single(
        "Resize",
        ["x", "", "", "sizes"],
        [x],
        opset=19,
        inits={"sizes": np.array([6, 4], np.int64)},
        axes=[-2, -1],
        mode="nearest",
    )
    add("Resize-opset19-negative_axes-sizes", m, 1, 0, rtol=tol, atol=tol)
    m = single(
        "Resize",
        ["x", "", "scales"],
        [("x", F, [2, 4])],
        inits={"scales": np.array([1.0, 2.0], np.float32)},
        mode="nearest",
        nearest_mode="floor",
    )
    add("Resize-2d-nearest_floor", m, 0, 1, rtol=tol, atol=tol)


_resize_cases()


def _newer_opset_cases() -> None:
    """Opsets ONNX Runtime 1.31 cannot load run on the ONNX reference evaluator."""
    for opset in (27, 28):
        add(
            f"Add-opset{opset}-x_batched_y_shared",
            single("Add", ["x", "y"], [("x", F, [3, 4]), ("y", F, [4])], opset=opset),
            (0, None),
            0,
        )
        add(
            f"MatMul-opset{opset}-b_batched",
            single("MatMul", ["a", "b"], [("a", F, [3, 4]), ("b", F, [4, 2])], opset=opset),
            (None, 1),
            0,
        )
        add(
            f"Reshape-opset{opset}",
            single(
                "Reshape",
                ["x", "s"],
                [("x", F, [2, 3, 4])],
                opset=opset,
                inits={"s": np.array([0, -1], np.int64)},
            ),
            1,
            0,
        )
        add(
            f"ReduceSum-opset{opset}",
            single(
                "ReduceSum",
                ["x", "a"],
                [("x", F, [2, 3])],
                opset=opset,
                inits={"a": np.array([-1], np.int64)},
                keepdims=0,
            ),
            0,
            0,
        )
        add(
            f"Softmax-opset{opset}-axis0",
            single("Softmax", ["x"], [("x", F, [2, 3])], opset=opset, axis=0),
            0,
            1,
        )
        add(
            f"Cast-opset{opset}",
            single("Cast", ["x"], [("x", F, [2, 3])], opset=opset, to=I64),
            -1,
            0,
            gens={"x": uniform(-5, 5, [2, 3])},
        )
        add(
            f"Gather-opset{opset}-both",
            single("Gather", ["d", "i"], [("d", F, [4, 3]), ("i", I64, [2])], opset=opset, axis=1),
            (0, 0),
            0,
            gens={"i": ints(0, 3, [2])},
        )
        add(
            f"Transpose-opset{opset}",
            single("Transpose", ["x"], [("x", F, [2, 3, 4])], opset=opset, perm=[2, 0, 1]),
            1,
            0,
        )
        add(
            f"Squeeze-opset{opset}-noaxes", single("Squeeze", ["x"], [("x", F, [1, 3, 1])], opset=opset), 0, 0
        )
        add(
            f"Flatten-opset{opset}",
            single("Flatten", ["x"], [("x", F, [2, 3, 4])], opset=opset, axis=2),
            0,
            0,
        )
        add(
            f"Pad-opset{opset}",
            single(
                "Pad",
                ["x", "p"],
                [("x", F, [2, 3])],
                opset=opset,
                inits={"p": np.array([0, 1, 1, 0], np.int64)},
            ),
            0,
            0,
        )
        add(f"Shape-opset{opset}", single("Shape", ["x"], [("x", F, [2, 3])], opset=opset, start=-1), 0, 0)
    add(
        "RMSNormalization-opset27",
        single(
            "RMSNormalization", ["x", "s"], [("x", F, [2, 4])], opset=27, inits={"s": np.ones(4, np.float32)}
        ),
        0,
        0,
        rtol=1e-4,
        atol=1e-4,
    )


_newer_opset_cases()


# ---- multi-node graphs -----------------------------------------------------------------------


def _graph_cases() -> None:
    rng = np.random.default_rng(3)
    inits: dict[str, np.ndarray] = {
        "w1": rng.standard_normal((4, 8)).astype(np.float32),
        "b1": rng.standard_normal(8).astype(np.float32),
        "w2": rng.standard_normal((8, 3)).astype(np.float32),
        "axes": np.array([-1], np.int64),
    }
    nodes = [
        node("MatMul", ["x", "w1"], ["h0"]),
        node("Add", ["h0", "b1"], ["h1"], name="add_bias"),
        node("Relu", ["h1"], ["h2"]),
        node("MatMul", ["h2", "w2"], ["logits"], name="mm2"),
        node("Softmax", ["logits"], ["probs"], axis=-1),
        node("ReduceMax", ["logits", "axes"], ["top"], keepdims=0),
    ]
    m = make_model(nodes, [("x", F, ["N", 4])], ["probs", "top"], initializers=inits)
    add("Graph-mlp-in0", m, 0, 0, dims={"N": 2}, rtol=1e-4, atol=1e-4)
    add("Graph-mlp-in1-out_1_0", m, 1, (1, 0), dims={"N": 2}, rtol=1e-4, atol=1e-4)
    nodes = [
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "zero"], ["n"], axis=0),
        node("Unsqueeze", ["n", "ax0"], ["n1"]),
        node("Concat", ["n1", "minus1"], ["newshape"], axis=0),
        node("Reshape", ["x", "newshape"], ["y"]),
        node("Mul", ["y", "w"], ["z"]),
    ]
    inits2 = {
        "zero": np.array(0, np.int64),
        "ax0": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
    }
    m = make_model(nodes, [("x", F, ["N", 2, 3]), ("w", F, [6])], ["z"], initializers=inits2)
    add("Graph-dynamic_reshape-x_batched", m, (0, None), 0, dims={"N": 2})
    add("Graph-dynamic_reshape-w_batched", m, (None, 0), 0, dims={"N": 2})
    add("Graph-dynamic_reshape-both_in1", m, (1, 0), 1, dims={"N": 2})
    # Two outputs, one of which depends only on a shared input (must be broadcast).
    m = make_model(
        [node("Add", ["x", "y"], ["s"]), node("Neg", ["y"], ["ny"])],
        [("x", F, [3]), ("y", F, [3])],
        ["s", "ny"],
    )
    add("Graph-unbatched_output_broadcast", m, (0, None), (0, 1))


_graph_cases()


def _dtype_and_edge_cases() -> None:
    f16, f64 = TensorProto.FLOAT16, TensorProto.DOUBLE
    m = single("Add", ["x", "y"], [("x", f64, [2, 3]), ("y", f64, [3])])
    add("Add-float64-x_batched_y_shared", m, (1, None), 0)
    m = single("MatMul", ["a", "b"], [("a", f16, [2, 3]), ("b", f16, [3, 2])])
    add("MatMul-float16-b_batched", m, (None, 0), 0, rtol=1e-2, atol=1e-2)
    add("Softmax-float64-axis0", single("Softmax", ["x"], [("x", f64, [2, 3])], axis=0), 1, 0)
    axes = {"axes": np.array([1], np.int64)}
    add("ReduceSum-int64-in1", single("ReduceSum", ["x", "axes"], [("x", I64, [2, 3])], inits=axes), 1, 0)
    add(
        "ReduceMax-int32-keep0",
        single("ReduceMax", ["x", "axes"], [("x", I32, [2, 3])], inits=axes, keepdims=0),
        0,
        0,
    )
    add(
        "ArgMax-int64-input",
        single("ArgMax", ["x"], [("x", I64, [2, 5])], axis=1),
        -1,
        0,
        gens={"x": ints(0, 100, [2, 5])},
    )
    add("Concat-single_input", single("Concat", ["a"], [("a", F, [2, 3])], axis=1), 0, 1)
    add(
        "Squeeze-symN",
        single("Squeeze", ["x", "axes"], [("x", F, ["N", 1])], inits={"axes": np.array([1], np.int64)}),
        0,
        0,
        dims={"N": 3},
    )
    add(
        "Unsqueeze-opset24",
        single("Unsqueeze", ["x", "axes"], [("x", F, [2, 3])], opset=24, inits=axes),
        1,
        0,
    )
    # A value used as two graph outputs, and an initializer as a graph output.
    m = make_model(
        [node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["r2"])],
        [("x", F, [3])],
        ["r", "r2", ("w", F, [2])],
        initializers={"w": np.array([1.0, 2.0], np.float32)},
    )
    add("Graph-initializer_as_output_broadcast", m, 0, (0, 1, 0))
    # A shared branch feeding a batched one: y is processed unbatched, then combined with x.
    m = make_model(
        [
            node("Transpose", ["y"], ["yt"], perm=[1, 0]),
            node("MatMul", ["x", "yt"], ["xy"]),
            node("Softmax", ["xy"], ["out"], axis=0),
        ],
        [("x", F, [2, 3]), ("y", F, [4, 3])],
        ["out"],
    )
    add("Graph-shared_branch_then_batched-x_batched", m, (0, None), 0)
    add("Graph-shared_branch_then_batched-y_batched", m, (None, 1), 2)


_dtype_and_edge_cases()


def _ids() -> Iterator[str]:
    seen: set[str] = set()
    for c in CASES:
        assert c.id not in seen, f"duplicate case id {c.id}"
        seen.add(c.id)
        yield c.id


_IDS = list(_ids())


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_vmap_rule(case: Case) -> None:
    assert_vmap_matches(
        case.model,
        case.in_axes,
        case.out_axes,
        gens=case.gens,
        dims=case.dims,
        rtol=case.rtol,
        atol=case.atol,
    )


# ---- composition: vmap(vmap(f)) ---------------------------------------------------------------

NESTED_IDS = [
    "Add-float32-bcast_x_in1_y_in0_outneg1",
    "Where-mixed_ranks",
    "MatMul-2d_both_batched",
    "MatMul-1d_a_shared_3d_b_batched",
    "Gemm-all_batched_mixed_axes",
    "Einsum-batched_matmul_in1",
    "ReduceSum-axes1-keep1-in0",
    "ReduceMean-noaxes-keep0-inneg1",
    "Softmax-axis0-in0",
    "TopK-axisneg1-in0",
    "CumSum-axis0-reverse-inneg1",
    "Reshape-zero_copy_and_minus1-in1",
    "Transpose-perm201-in1",
    "Squeeze-noaxes-in0",
    "Flatten-axis0-in0",
    "Flatten-axis2-in0",
    "Expand-adds_leading_ones",
    "Concat-3inputs-mixed",
    "Split-opset18-num_outputs3-uneven",
    "Slice-reverse_step-inneg1",
    "Pad-reflect-inneg1",
    "Gather-idx_initializer",
    "Conv-x_batched_w_init",
    "MaxPool-indices-in0",
    "BatchNormalization-x_batched-in0",
    "LayerNormalization-3outputs-all_batched",
    "Graph-mlp-in0",
    "Attention-n2-float_mask3d_batched",
    "Attention-past-causal-all_batched",
    "Attention-opset24-past-all_outputs",
    "Attention-3d-gqa-past-mask-q_in1_mask_shared",
]
_BY_ID = {c.id: c for c in CASES}


@pytest.mark.parametrize("case_id", NESTED_IDS)
@pytest.mark.parametrize("outer_in_axes", [0, -1])
def test_vmap_nested(case_id: str, outer_in_axes: int) -> None:
    import onnax

    case = _BY_ID[case_id]
    inner = onnax.vmap(case.model, in_axes=case.in_axes, out_axes=case.out_axes)
    assert_vmap_matches(
        inner,
        outer_in_axes,
        1,
        dims={**case.dims, "batch": 2},
        axis_name="outer",
        rtol=case.rtol,
        atol=case.atol,
    )


# ---- the same cases with the batch axis moved: last, and second position ---------------------


def _ranks(vis: Sequence[onnx.ValueInfoProto], skip: set[str]) -> list[int | None]:
    out: list[int | None] = []
    for vi in vis:
        if vi.name in skip:
            continue
        tt = vi.type.tensor_type
        out.append(len(tt.shape.dim) if tt.HasField("shape") else None)
    return out


def _moved_axes(case: Case, where: str) -> tuple[list[int | None], list[int]]:
    inits = {t.name for t in case.model.graph.initializer}
    names = [v.name for v in case.model.graph.input if v.name not in inits]
    in_ranks = _ranks(case.model.graph.input, inits)
    out_ranks = _ranks(case.model.graph.output, set())
    if case.in_axes is None or isinstance(case.in_axes, int):
        old: list[int | None] = [case.in_axes] * len(names)
    elif isinstance(case.in_axes, Mapping):
        old = [case.in_axes.get(n) for n in names]
    else:
        old = list(case.in_axes)
    if where == "last":
        new_in = [None if a is None else -1 for a in old]
        # An output of unknown rank can only take the batch axis at 0.
        new_out = [0 if r is None else -1 for r in out_ranks]
    else:
        new_in = [None if a is None else min(1, r or 0) for a, r in zip(old, in_ranks, strict=True)]
        new_out = [min(1, r or 0) for r in out_ranks]
    return new_in, new_out


@pytest.mark.parametrize("where", ["last", "second"])
@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_vmap_rule_moved_axes(case: Case, where: str) -> None:
    in_axes, out_axes = _moved_axes(case, where)
    assert_vmap_matches(
        case.model,
        in_axes,
        out_axes,
        gens=case.gens,
        dims=case.dims,
        rtol=case.rtol,
        atol=case.atol,
        seed=1,
    )


# ---- an empty batch (the batch dim is symbolic, so 0 examples is a valid input) ---------------

EMPTY_BATCH_IDS = [
    "Add-float32-both_in0",
    "Where-all_in0",
    "MatMul-2d_both_batched",
    "Gemm-A_batched",
    "Softmax-axis0-in0",
    "TopK-axisneg1-in0",
    "CumSum-axis1-in0",
    "Reshape-6x4-in0",
    "Transpose-perm102-in0",
    "Squeeze-noaxes-in0",
    "Unsqueeze-axes0-in0",
    "Flatten-axis1-in0",
    "Expand-adds_leading_ones",
    "Concat-axis0-both_in0",
    "Split-opset18-num_outputs2-axis0",
    "Slice-axes0-in0",
    "Pad-reflect-inneg1",
    "Gather-axis0-both_batched",
    "Conv-x_batched_w_init",
    "MaxPool-indices-in0",
    "BatchNormalization-x_batched-in0",
    "LayerNormalization-axisneg1-in0",
    "Attention-opset23-4d-all_batched",
    "Attention-n2-bool_mask4d_batched",
    "Attention-n2-float_mask2d_only_batched",
    "Attention-opset24-past-all_outputs",
    "Attention-opset24-nonpad-all_batched",
    "Attention-opset24-past-bool_mask3d-batched",
    "Attention-3d-gqa-past-mask-all_batched",
]


@pytest.mark.parametrize("case_id", EMPTY_BATCH_IDS)
def test_vmap_empty_batch(case_id: str) -> None:
    case = _BY_ID[case_id]
    assert_vmap_empty_batch(case.model, case.in_axes, case.out_axes, gens=case.gens, dims=case.dims)


# ---- vectorized rules stay vectorized ---------------------------------------------------------

VECTORIZED_IDS = [
    "Conv-x_shared_w_batched",
    "Conv-all_batched",
    "Conv-group2-dilations-both",
    "Conv-1d-same_upper-both",
    "Conv-group2-strides-dilations-pads-all_batched",
    "Conv-3d-w_batched",
    "Conv-symN-kernel_shape-both",
]


@pytest.mark.parametrize("case_id", VECTORIZED_IDS)
def test_vmap_is_vectorized(case_id: str) -> None:
    """No per-example Scan/Loop: the numbers are checked by test_vmap_rule; this pins the speed."""
    import onnax

    case = _BY_ID[case_id]
    out = onnax.vmap(case.model, in_axes=case.in_axes, out_axes=case.out_axes)
    ops = {n.op_type for n in out.graph.node}
    assert not ops & {"Scan", "Loop"}, sorted(ops)
