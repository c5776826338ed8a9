"""An ONNX graph interpreted op by op in JAX float64: an exact reference for derivatives.

Each node runs as a ``jax.numpy`` / ``jax.lax`` function with the op's ONNX semantics, so
``jax.grad``, ``jax.jvp``, ``jax.vjp`` and ``jax.vmap`` of the interpreted graph are exact
float64 answers that owe nothing to onnax. Model-local functions are inlined first (ONNX's own
inliner); ``Loop`` and ``If`` run with concrete trip counts and conditions (unrolled).

Values that decide shapes (shapes, axes, indices into shapes) stay NumPy arrays: an op whose
inputs are all NumPy arrays is computed by NumPy, so a ``Shape -> Gather -> Concat ->
Reshape`` chain keeps static shapes even under ``jax.jit``. Float values are widened to
float64 (``widen``), Casts to a float type too.

``interpret`` checks nothing about the semantics itself: :mod:`onnax.testing._exact` compares
the interpreted forward pass with ONNX Runtime's before it trusts the derivatives, and every op
here is checked against ONNX Runtime by ``tests/python/conformance_suite/test_onnx_jax.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnax.testing._models import graphs


@dataclass
class Ctx:
    """What an op needs beyond its inputs and attributes."""

    opset: int
    widen: bool
    run_graph: Callable[[onnx.GraphProto, Mapping[str, Any], Sequence[Any]], list[Any]]
    outputs: int = 1  # how many outputs the node being run declares


Op = Callable[[Any, list[Any], dict[str, Any], Ctx], list[Any]]


def _jnp() -> Any:
    import jax.numpy as jnp

    return jnp


def _lax() -> Any:
    from jax import lax

    return lax


def _jax() -> Any:
    import jax

    return jax


def _concrete(v: Any) -> bool:
    return v is None or isinstance(v, np.ndarray | np.generic)


def _static(v: Any) -> np.ndarray:
    """A value that decides a shape or an axis, as NumPy (raises under a trace if it is not
    known before the run)."""
    return np.asarray(v)


def _ints(v: Any) -> list[int]:
    return [int(d) for d in _static(v).reshape(-1)]


def _widen(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a


FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}


def _np_type(elem_type: int, widen: bool) -> np.dtype:
    if widen and elem_type in FLOAT_TYPES:
        return np.dtype(np.float64)
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _axes(ins: list[Any], attrs: dict[str, Any], position: int = 1) -> list[int] | None:
    """Axes from the input at ``position`` (newer opsets) or the ``axes`` attribute."""
    if len(ins) > position and ins[position] is not None:
        return _ints(ins[position])
    if "axes" in attrs:
        return [int(a) for a in attrs["axes"]]
    return None


# --------------------------------------------------------------------------------------------
# Elementwise


def _unary(name: str) -> Op:
    def op(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
        return [getattr(xp, name)(ins[0])]

    return op


def _binary(name: str) -> Op:
    def op(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
        return [getattr(xp, name)(ins[0], ins[1])]

    return op


def _variadic(name: str) -> Op:
    def op(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
        acc = ins[0]
        for v in ins[1:]:
            acc = getattr(xp, name)(acc, v)
        return [acc]

    return op


def _div(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    a, b = ins
    if xp is np and np.issubdtype(np.result_type(a, b), np.integer):
        return [np.trunc(a / b).astype(np.result_type(a, b))]
    if xp is not np and np.issubdtype(np.result_type(a.dtype, b.dtype), np.integer):
        return [_lax().div(*_jnp().broadcast_arrays(a, b))]
    return [a / b]


def _pow(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x, y = ins
    if _concrete(y) and np.asarray(y).size == 1:
        e = float(np.asarray(y).reshape(()))
        if e == int(e) and abs(e) <= 8:  # integer powers: exact, and differentiable at x = 0
            return [x ** int(e) if xp is np else _lax().integer_pow(x, int(e))]
    return [xp.power(x, y.astype(x.dtype) if hasattr(y, "astype") else y)]


def _erf(x: Any) -> Any:
    if isinstance(x, np.ndarray | np.generic):
        return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)
    from jax.scipy.special import erf

    return erf(x)


def _gelu(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    approximate = attrs.get("approximate", b"none")
    if approximate in (b"tanh", "tanh"):
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
        return [0.5 * x * (1 + xp.tanh(inner))]
    return [0.5 * x * (1 + _erf(x / math.sqrt(2)))]


def _sigmoid(x: Any) -> Any:
    if isinstance(x, np.ndarray | np.generic):
        return 1 / (1 + np.exp(-np.asarray(x)))
    return _jax().nn.sigmoid(x)


def _clip(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    lo = ins[1] if len(ins) > 1 and ins[1] is not None else attrs.get("min")
    hi = ins[2] if len(ins) > 2 and ins[2] is not None else attrs.get("max")
    if lo is not None:
        x = xp.maximum(x, lo)
    if hi is not None:
        x = xp.minimum(x, hi)
    return [x]


def _cast(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    return [ins[0].astype(_np_type(int(attrs["to"]), ctx.widen))]


def _cast_like(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    return [ins[0].astype(ins[1].dtype)]


def _where(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    return [xp.where(ins[0], ins[1], ins[2])]


def _leaky_relu(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    return [xp.where(x >= 0, x, attrs.get("alpha", 0.01) * x)]


def _elu(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    alpha = attrs.get("alpha", 1.0)
    return [xp.where(x > 0, x, alpha * (xp.exp(xp.minimum(x, 0)) - 1))]


def _selu(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    alpha = attrs.get("alpha", 1.67326319217681884765625)
    gamma = attrs.get("gamma", 1.05070102214813232421875)
    return [gamma * xp.where(x > 0, x, alpha * (xp.exp(xp.minimum(x, 0)) - 1))]


def _hard_sigmoid(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    return [xp.clip(attrs.get("alpha", 0.2) * x + attrs.get("beta", 0.5), 0, 1)]


def _softplus(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    return [xp.logaddexp(ins[0], 0.0)]


ELEMENTWISE: dict[str, Op] = {
    "Relu": lambda xp, ins, a, c: [xp.maximum(ins[0], 0)],
    "Sigmoid": lambda xp, ins, a, c: [_sigmoid(ins[0])],
    "Tanh": _unary("tanh"),
    "Exp": _unary("exp"),
    "Log": _unary("log"),
    "Sqrt": _unary("sqrt"),
    "Neg": _unary("negative"),
    "Abs": _unary("abs"),
    "Floor": _unary("floor"),
    "Ceil": _unary("ceil"),
    "Sign": _unary("sign"),
    "Sin": _unary("sin"),
    "Cos": _unary("cos"),
    "Not": _unary("logical_not"),
    "Reciprocal": lambda xp, ins, a, c: [1 / ins[0]],
    "Erf": lambda xp, ins, a, c: [_erf(ins[0])],
    "Gelu": _gelu,
    "LeakyRelu": _leaky_relu,
    "Elu": _elu,
    "Selu": _selu,
    "HardSigmoid": _hard_sigmoid,
    "Softplus": _softplus,
    "Softsign": lambda xp, ins, a, c: [ins[0] / (1 + xp.abs(ins[0]))],
    "Add": _binary("add"),
    "Sub": _binary("subtract"),
    "Mul": _binary("multiply"),
    "Div": _div,
    "Pow": _pow,
    "Equal": _binary("equal"),
    "Less": _binary("less"),
    "LessOrEqual": _binary("less_equal"),
    "Greater": _binary("greater"),
    "GreaterOrEqual": _binary("greater_equal"),
    "And": _binary("logical_and"),
    "Or": _binary("logical_or"),
    "Xor": _binary("logical_xor"),
    "Max": _variadic("maximum"),
    "Min": _variadic("minimum"),
    "Sum": _variadic("add"),
    "Mean": lambda xp, ins, a, c: [_variadic("add")(xp, ins, a, c)[0] / len(ins)],
    "Where": _where,
    "Clip": _clip,
    "Cast": _cast,
    "CastLike": _cast_like,
    "Identity": lambda xp, ins, a, c: [ins[0]],
    "Dropout": lambda xp, ins, a, c: [ins[0], xp.ones(ins[0].shape, bool)],
}


# --------------------------------------------------------------------------------------------
# Linear algebra, normalization, softmax


def _gemm(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    a, b = ins[0], ins[1]
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    y = attrs.get("alpha", 1.0) * (a @ b)
    if len(ins) > 2 and ins[2] is not None:
        y = y + attrs.get("beta", 1.0) * ins[2]
    return [y]


def _coerced(x: Any, axis: int, fn: Callable[[Any], Any]) -> Any:
    """Softmax before opset 13: over the input coerced to 2-D at ``axis``."""
    axis %= max(x.ndim, 1)
    flat = x.reshape((int(np.prod(x.shape[:axis])), -1))
    return fn(flat).reshape(x.shape)


def _softmax(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    jax = _jax()
    x = ins[0]
    if ctx.opset < 13:
        return [_coerced(x, int(attrs.get("axis", 1)), lambda v: jax.nn.softmax(v, axis=-1))]
    return [jax.nn.softmax(x, axis=int(attrs.get("axis", -1)))]


def _log_softmax(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    jax = _jax()
    x = ins[0]
    if ctx.opset < 13:
        return [_coerced(x, int(attrs.get("axis", 1)), lambda v: jax.nn.log_softmax(v, axis=-1))]
    return [jax.nn.log_softmax(x, axis=int(attrs.get("axis", -1)))]


def _layer_norm(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x, scale = ins[0], ins[1]
    axis = int(attrs.get("axis", -1)) % x.ndim
    axes = tuple(range(axis, x.ndim))
    mean = xp.mean(x, axis=axes, keepdims=True)
    var = xp.mean((x - mean) ** 2, axis=axes, keepdims=True)
    inv = 1 / xp.sqrt(var + attrs.get("epsilon", 1e-5))
    y = (x - mean) * inv * scale
    if len(ins) > 2 and ins[2] is not None:
        y = y + ins[2]
    return [y, mean, inv]


def _batch_norm(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    if attrs.get("training_mode", 0):
        raise NotImplementedError("BatchNormalization training_mode=1")
    x, scale, bias, mean, var = ins[:5]
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / xp.sqrt(var + attrs.get("epsilon", 1e-5))
    return [(x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)]


def _instance_norm(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x, scale, bias = ins
    axes = tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean = xp.mean(x, axis=axes, keepdims=True)
    var = xp.mean((x - mean) ** 2, axis=axes, keepdims=True)
    y = (x - mean) / xp.sqrt(var + attrs.get("epsilon", 1e-5))
    return [y * scale.reshape(shape) + bias.reshape(shape)]


def _lrn(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    size = int(attrs["size"])
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = xp.pad(x * x, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    window = sum(sq[:, k : k + x.shape[1]] for k in range(size))
    return [x / (bias + alpha / size * window) ** beta]


def _einsum(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    eq = attrs["equation"]
    return [xp.einsum(eq.decode() if isinstance(eq, bytes) else eq, *ins)]


# --------------------------------------------------------------------------------------------
# Convolution and pooling


def _pads(
    attrs: Mapping[str, Any],
    in_sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
) -> list[tuple[int, int]]:
    spatial = len(kernel)
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for n, k, s, d in zip(in_sizes, kernel, strides, dilations, strict=True):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return out
    if auto == "VALID":
        return [(0, 0)] * spatial
    pads = list(attrs.get("pads", [0] * (2 * spatial)))
    return [(int(pads[i]), int(pads[i + spatial])) for i in range(spatial)]


def _conv(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x, w = ins[0], ins[1]
    spatial = w.ndim - 2
    strides = list(attrs.get("strides", [1] * spatial))
    dilations = list(attrs.get("dilations", [1] * spatial))
    y = _lax().conv_general_dilated(
        x,
        w,
        window_strides=tuple(strides),
        padding=_pads(attrs, x.shape[2:], w.shape[2:], strides, dilations),
        rhs_dilation=tuple(dilations),
        feature_group_count=int(attrs.get("group", 1)),
    )
    if len(ins) > 2 and ins[2] is not None:
        y = y + ins[2].reshape((1, -1) + (1,) * spatial)
    return [y]


def _window(
    x: Any, attrs: dict[str, Any]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], list[tuple[int, int]], list[tuple[int, int]]]:
    """Window dims, strides, dilations, padding (ceil_mode's extra included) and the explicit
    padding alone, of a pool over x's spatial axes."""
    kernel = [int(k) for k in attrs["kernel_shape"]]
    spatial = len(kernel)
    strides = [int(s) for s in attrs.get("strides", [1] * spatial)]
    dilations = [int(d) for d in attrs.get("dilations", [1] * spatial)]
    explicit = _pads(attrs, x.shape[2:], kernel, strides, dilations)
    pads = list(explicit)
    if attrs.get("ceil_mode", 0):
        for i in range(spatial):
            span = (kernel[i] - 1) * dilations[i] + 1
            n = x.shape[2 + i] + pads[i][0] + pads[i][1]
            out = -(-(n - span) // strides[i]) + 1
            # (the last window must start inside the input or its left padding)
            if (out - 1) * strides[i] >= x.shape[2 + i] + pads[i][0]:
                out -= 1
            extra = max((out - 1) * strides[i] + span - n, 0)
            pads[i] = (pads[i][0], pads[i][1] + extra)
    return (
        (1, 1, *kernel),
        (1, 1, *strides),
        (1, 1, *dilations),
        [(0, 0), (0, 0), *pads],
        explicit,
    )


def _max_pool(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    dims, strides, dil, pads, _ = _window(x, attrs)
    lax = _lax()
    return [lax.reduce_window(x, -np.inf, lax.max, dims, strides, pads, window_dilation=dil)]


def _average_pool(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    jnp, lax = _jnp(), _lax()
    x = ins[0]
    dims, strides, dil, pads, explicit = _window(x, attrs)
    total = lax.reduce_window(x, 0.0, lax.add, dims, strides, pads, window_dilation=dil)
    if attrs.get("count_include_pad", 0):
        # Every element of the explicitly padded input counts (ceil_mode's extra padding not).
        padded = jnp.ones(tuple(n + a + b for n, (a, b) in zip(x.shape[2:], explicit, strict=True)), x.dtype)
        count = lax.reduce_window(
            padded,
            0.0,
            lax.add,
            dims[2:],
            strides[2:],
            [(0, p[1] - e[1]) for p, e in zip(pads[2:], explicit, strict=True)],
            window_dilation=dil[2:],
        )
    else:
        count = lax.reduce_window(
            jnp.ones(x.shape[2:], x.dtype),
            0.0,
            lax.add,
            dims[2:],
            strides[2:],
            pads[2:],
            window_dilation=dil[2:],
        )
    return [total / count]


def _global(name: str) -> Op:
    def op(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
        x = ins[0]
        return [getattr(xp, name)(x, axis=tuple(range(2, x.ndim)), keepdims=True)]

    return op


# --------------------------------------------------------------------------------------------
# Shapes, indexing, reductions


def _reshape(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    shape = _ints(ins[1]) if len(ins) > 1 else [int(d) for d in attrs["shape"]]
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


def _flatten(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    axis = int(attrs.get("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape((int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))))]


def _transpose(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    return [xp.transpose(x, [int(p) for p in attrs.get("perm", list(range(x.ndim))[::-1])])]


def _squeeze(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    axes = _axes(ins, attrs)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    return [xp.squeeze(x, axis=tuple(a % x.ndim for a in axes))] if axes else [x]


def _unsqueeze(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    axes = _axes(ins, attrs) or []
    rank = x.ndim + len(axes)
    for a in sorted(a % rank for a in axes):
        x = xp.expand_dims(x, a)
    return [x]


def _concat(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    return [xp.concatenate([v for v in ins if v is not None], axis=int(attrs["axis"]))]


def _split(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    axis = int(attrs.get("axis", 0)) % x.ndim
    n = x.shape[axis]
    if len(ins) > 1 and ins[1] is not None:
        sizes = _ints(ins[1])
    elif "split" in attrs:
        sizes = [int(s) for s in attrs["split"]]
    else:
        count = int(attrs.get("num_outputs", ctx.outputs))
        chunk = -(-n // count)
        sizes = [min(chunk, n - i * chunk) for i in range(count)]
    bounds = np.cumsum(sizes)[:-1].tolist()
    return list(xp.split(x, bounds, axis=axis))


def _slice(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    if len(ins) > 1:
        starts, ends = _ints(ins[1]), _ints(ins[2])
        axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    else:
        starts, ends = [int(s) for s in attrs["starts"]], [int(e) for e in attrs["ends"]]
        axes = [int(a) for a in attrs.get("axes", range(len(starts)))]
        steps = [1] * len(starts)
    index: list[slice] = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a %= x.ndim
        dim = x.shape[a]
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
            index[a] = slice(s, e, st)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
            index[a] = slice(s, None if e < 0 else e, st)
    return [x[tuple(index)]]


def _normalized(xp: Any, idx: Any, size: int) -> Any:
    return xp.where(idx < 0, idx + size, idx)


def _gather(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x, idx = ins
    axis = int(attrs.get("axis", 0)) % x.ndim
    return [xp.take(x, _normalized(xp, idx, x.shape[axis]), axis=axis)]


def _gather_elements(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x, idx = ins
    axis = int(attrs.get("axis", 0)) % x.ndim
    # (indices may be shorter than the data along the other axes: no broadcasting)
    grids: list[Any] = list(np.meshgrid(*[np.arange(n) for n in idx.shape], indexing="ij"))
    grids[axis] = _normalized(xp, idx, x.shape[axis])
    return [x[tuple(grids)]]


def _gather_nd(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    data, idx = ins
    b = int(attrs.get("batch_dims", 0))
    bshape = tuple(data.shape[:b])
    count = int(np.prod(bshape)) if b else 1
    d = data.reshape((count, *data.shape[b:]))
    i = idx.reshape((count, *idx.shape[b:]))
    k = i.shape[-1]
    rows = xp.arange(count).reshape((count,) + (1,) * (i.ndim - 2))
    picks = tuple(_normalized(xp, i[..., j], d.shape[1 + j]) for j in range(k))
    out = d[(rows, *picks)]
    return [out.reshape(bshape + tuple(idx.shape[b:-1]) + tuple(data.shape[b + k :]))]


def _scatter_apply(target: Any, where: tuple[Any, ...], updates: Any, reduction: Any) -> Any:
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    at = _jnp().asarray(target).at[where]
    return {
        "none": at.set,
        "add": at.add,
        "mul": at.multiply,
        "max": at.max,
        "min": at.min,
    }[reduction](updates)


def _scatter_elements(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    jnp = _jnp()
    data, idx, upd = ins
    axis = int(attrs.get("axis", 0)) % data.ndim
    grids = list(jnp.meshgrid(*[jnp.arange(n) for n in idx.shape], indexing="ij"))
    grids[axis] = _normalized(jnp, jnp.asarray(idx), data.shape[axis])
    return [_scatter_apply(data, tuple(grids), upd, attrs.get("reduction", "none"))]


def _scatter_nd(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    jnp = _jnp()
    data, idx, upd = ins
    idx = jnp.asarray(idx)
    where = tuple(_normalized(jnp, idx[..., j], data.shape[j]) for j in range(idx.shape[-1]))
    return [_scatter_apply(data, where, upd, attrs.get("reduction", "none"))]


def _expand(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    shape = np.broadcast_shapes(tuple(x.shape), tuple(_ints(ins[1])))
    return [xp.broadcast_to(x, shape)]


def _tile(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    return [xp.tile(ins[0], _ints(ins[1]))]


def _pad(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    pads = _ints(ins[1]) if len(ins) > 1 else [int(p) for p in attrs["pads"]]
    axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(x.ndim))
    if any(p < 0 for p in pads):
        raise NotImplementedError("Pad with negative pads")
    width = [(0, 0)] * x.ndim
    for k, a in enumerate(axes):
        width[a % x.ndim] = (pads[k], pads[k + len(axes)])
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode == "constant":
        value = ins[2] if len(ins) > 2 and ins[2] is not None else attrs.get("value", 0)
        return [xp.pad(x, width, mode="constant", constant_values=xp.asarray(value).reshape(()))]
    if mode in ("reflect", "edge"):
        return [xp.pad(x, width, mode=mode)]
    raise NotImplementedError(f"Pad mode {mode}")


def _range(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    start, limit, delta = (np.asarray(v).reshape(()) for v in ins)
    return [np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype)]


def _constant_of_shape(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    value = attrs.get("value")
    fill = np.zeros(1, np.float32) if value is None else numpy_helper.to_array(value).reshape(-1)
    fill = _widen(fill) if ctx.widen else fill
    return [np.full(_ints(ins[0]), fill[0], fill.dtype)]


def _shape(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    shape = np.asarray(ins[0].shape, np.int64)
    start, end = attrs.get("start", 0), attrs.get("end")
    return [shape[start:end]]


def _constant(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    if "value" in attrs:
        v = numpy_helper.to_array(attrs["value"])
    elif "value_float" in attrs:
        v = np.asarray(attrs["value_float"], np.float32)
    elif "value_floats" in attrs:
        v = np.asarray(attrs["value_floats"], np.float32)
    elif "value_int" in attrs:
        v = np.asarray(attrs["value_int"], np.int64)
    elif "value_ints" in attrs:
        v = np.asarray(attrs["value_ints"], np.int64)
    else:
        raise NotImplementedError("Constant without a dense value")
    return [_widen(v) if ctx.widen else v]


def _reduce(name: str, axes_input_from: int) -> Op:
    def op(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
        x = ins[0]
        axes = _axes(ins, attrs) if ctx.opset >= axes_input_from else _axes([x], attrs)
        keep = bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.ndim))
        ax = tuple(a % x.ndim for a in axes) if x.ndim else None
        if name == "l2":
            return [xp.sqrt(xp.sum(x * x, axis=ax, keepdims=keep))]
        if name == "sumsquare":
            return [xp.sum(x * x, axis=ax, keepdims=keep)]
        if name == "logsumexp":
            return [_jax().scipy.special.logsumexp(x, axis=ax, keepdims=keep)]
        if name == "logsum":
            return [xp.log(xp.sum(x, axis=ax, keepdims=keep))]
        if name == "l1":
            return [xp.sum(xp.abs(x), axis=ax, keepdims=keep)]
        return [getattr(xp, name)(x, axis=ax, keepdims=keep)]

    return op


def _arg(name: str) -> Op:
    def op(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
        x = ins[0]
        axis = int(attrs.get("axis", 0)) % x.ndim
        if attrs.get("select_last_index", 0):
            flipped = xp.flip(x, axis=axis)
            r = x.shape[axis] - 1 - getattr(xp, name)(flipped, axis=axis)
        else:
            r = getattr(xp, name)(x, axis=axis)
        if attrs.get("keepdims", 1):
            r = xp.expand_dims(r, axis)
        return [r.astype(np.int64)]

    return op


def _cumsum(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    x = ins[0]
    axis = int(np.asarray(ins[1]).reshape(())) % x.ndim
    if attrs.get("reverse", 0):
        x = xp.flip(x, axis=axis)
    y = xp.cumsum(x, axis=axis)
    if attrs.get("exclusive", 0):
        y = y - x
    if attrs.get("reverse", 0):
        y = xp.flip(y, axis=axis)
    return [y]


def _one_hot(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    idx, depth, values = ins
    n = int(np.asarray(depth).reshape(()))
    axis = int(attrs.get("axis", -1))
    idx = _normalized(xp, idx, n)
    hot = xp.expand_dims(idx, -1) == xp.arange(n)
    out = xp.where(hot, values[1], values[0])
    axis = axis % out.ndim
    return [xp.moveaxis(out, -1, axis)]


def _nll(xp: Any, logp: Any, labels: Any, weights: Any, attrs: dict[str, Any]) -> Any:
    """Shared by NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss: ``logp`` [N, C, ...]."""
    jnp = _jnp()
    ignore = attrs.get("ignore_index")
    valid = jnp.ones(labels.shape, bool) if ignore is None else labels != ignore
    safe = jnp.where(valid, labels, 0)
    picked = jnp.take_along_axis(logp, jnp.expand_dims(safe, 1), axis=1).squeeze(1)
    w = jnp.where(valid, 1.0 if weights is None else jnp.take(weights, safe), 0.0)
    loss = -picked * w
    reduction = attrs.get("reduction", b"mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    return jnp.sum(loss) / jnp.sum(w)


def _sce_loss(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    scores, labels = ins[0], ins[1]
    weights = ins[2] if len(ins) > 2 else None
    logp = _jax().nn.log_softmax(scores, axis=1)
    return [_nll(xp, logp, labels, weights, attrs), logp]


def _nll_loss(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    weights = ins[2] if len(ins) > 2 else None
    return [_nll(xp, ins[0], ins[1], weights, attrs)]


# --------------------------------------------------------------------------------------------
# Control flow (concrete trip counts and conditions only)


def _concrete_bool(v: Any, what: str) -> bool:
    try:
        return bool(np.asarray(v).reshape(()))
    except Exception as err:
        raise NotImplementedError(f"{what} that depends on float data") from err


def _loop(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    body = attrs["body"]
    trip = None if not ins or ins[0] is None else int(np.asarray(ins[0]).reshape(()))
    cond = True if len(ins) < 2 or ins[1] is None else _concrete_bool(ins[1], "a Loop condition")
    state = list(ins[2:])
    n_state = len(state)
    scans: list[list[Any]] = [[] for _ in range(len(body.output) - 1 - n_state)]
    i = 0
    while cond and (trip is None or i < trip):
        if i >= 100_000:
            raise NotImplementedError("a Loop of more than 100000 iterations")
        outs = ctx.run_graph(body, {}, [np.asarray(i, np.int64), np.asarray(cond), *state])
        cond = _concrete_bool(outs[0], "a Loop condition")
        state = outs[1 : 1 + n_state]
        for acc, v in zip(scans, outs[1 + n_state :], strict=True):
            acc.append(v)
        i += 1
    if scans and i == 0:
        raise NotImplementedError("a Loop with scan outputs that runs no iteration")
    stacked = [(np if all(_concrete(v) for v in acc) else _jnp()).stack(acc) for acc in scans]
    return [*state, *stacked]


def _if(xp: Any, ins: list[Any], attrs: dict[str, Any], ctx: Ctx) -> list[Any]:
    branch = attrs["then_branch"] if _concrete_bool(ins[0], "an If condition") else attrs["else_branch"]
    return ctx.run_graph(branch, {}, [])


OPS: dict[str, Op] = {
    **ELEMENTWISE,
    "MatMul": _binary("matmul"),
    "Gemm": _gemm,
    "Einsum": _einsum,
    "Softmax": _softmax,
    "LogSoftmax": _log_softmax,
    "LayerNormalization": _layer_norm,
    "BatchNormalization": _batch_norm,
    "InstanceNormalization": _instance_norm,
    "LRN": _lrn,
    "Conv": _conv,
    "MaxPool": _max_pool,
    "AveragePool": _average_pool,
    "GlobalAveragePool": _global("mean"),
    "GlobalMaxPool": _global("max"),
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Concat": _concat,
    "Split": _split,
    "Slice": _slice,
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "GatherND": _gather_nd,
    "ScatterElements": _scatter_elements,
    "ScatterND": _scatter_nd,
    "Expand": _expand,
    "Tile": _tile,
    "Pad": _pad,
    "Range": _range,
    "ConstantOfShape": _constant_of_shape,
    "Shape": _shape,
    "Size": lambda xp, ins, a, c: [np.asarray(int(np.prod(ins[0].shape)), np.int64)],
    "Constant": _constant,
    "ReduceSum": _reduce("sum", 13),
    "ReduceMean": _reduce("mean", 18),
    "ReduceMax": _reduce("max", 18),
    "ReduceMin": _reduce("min", 18),
    "ReduceProd": _reduce("prod", 18),
    "ReduceL1": _reduce("l1", 18),
    "ReduceL2": _reduce("l2", 18),
    "ReduceSumSquare": _reduce("sumsquare", 18),
    "ReduceLogSum": _reduce("logsum", 18),
    "ReduceLogSumExp": _reduce("logsumexp", 18),
    "ArgMax": _arg("argmax"),
    "ArgMin": _arg("argmin"),
    "CumSum": _cumsum,
    "OneHot": _one_hot,
    "SoftmaxCrossEntropyLoss": _sce_loss,
    "NegativeLogLikelihoodLoss": _nll_loss,
    "Loop": _loop,
    "If": _if,
}

# Ops whose NumPy evaluation is not the ONNX semantics (or that only JAX provides): always JAX.
_JAX_ONLY = {
    "Conv",
    "MaxPool",
    "AveragePool",
    "Softmax",
    "LogSoftmax",
    "ScatterElements",
    "ScatterND",
    "SoftmaxCrossEntropyLoss",
    "NegativeLogLikelihoodLoss",
    "Loop",  # (subgraphs may read traced values from the enclosing graph)
    "If",
}


def prepared(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its model-local functions inlined (ONNX's inliner)."""
    if not model.functions:
        return model
    import onnx.inliner

    return onnx.inliner.inline_local_functions(model)


def missing_ops(model: onnx.ModelProto) -> list[str]:
    """The ops of ``model`` (subgraphs and local functions included) this interpreter lacks,
    sorted; non-default domains are named ``domain::Op``."""
    model = prepared(model)
    missing: set[str] = set()
    for g in graphs(model.graph):
        for n in g.node:
            if n.domain not in ("", "ai.onnx"):
                missing.add(f"{n.domain}::{n.op_type}")
            elif n.op_type not in OPS:
                missing.add(n.op_type)
            elif n.op_type == "Scan":
                missing.add("Scan")
    if model.graph.sparse_initializer:
        missing.add("sparse initializers")
    return sorted(missing)


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class _Interpreter:
    def __init__(self, model: onnx.ModelProto, widen: bool) -> None:
        self.model = prepared(model)
        missing = missing_ops(self.model)
        if missing:
            raise NotImplementedError(f"ops without a JAX counterpart here: {missing}")
        opset = next((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.ctx = Ctx(int(opset), widen, self.run_graph)
        self.widen = widen
        self.stored = {
            t.name: _widen(numpy_helper.to_array(t)) if widen else numpy_helper.to_array(t)
            for t in self.model.graph.initializer
        }
        self._scopes: list[Mapping[str, Any]] = []

    def run_graph(self, graph: onnx.GraphProto, extra: Mapping[str, Any], inputs: Sequence[Any]) -> list[Any]:
        """Runs a subgraph in the scope of the node being run (its outer names visible)."""
        env: dict[str, Any] = dict(self._scopes[-1]) if self._scopes else {}
        env.update(extra)
        for t in graph.initializer:
            v = numpy_helper.to_array(t)
            env[t.name] = _widen(v) if self.widen else v
        for vi, v in zip(graph.input, inputs, strict=False):
            env[vi.name] = v
        return self._nodes(graph, env)

    def _nodes(self, graph: onnx.GraphProto, env: dict[str, Any]) -> list[Any]:
        for n in graph.node:
            ins = [env[i] if i else None for i in n.input]
            attrs = _attrs(n)
            concrete = n.op_type not in _JAX_ONLY and all(_concrete(v) for v in ins)
            xp = np if concrete else _jnp()
            self.ctx.outputs = len(n.output)
            self._scopes.append(env)
            try:
                results = OPS[n.op_type](xp, ins, attrs, self.ctx)
            finally:
                self._scopes.pop()
            for name, v in zip(n.output, results, strict=False):
                if name:
                    env[name] = np.asarray(v) if concrete and not isinstance(v, np.ndarray) else v
        return [env[o.name] for o in graph.output]

    def __call__(self, values: Mapping[str, Any]) -> list[Any]:
        env: dict[str, Any] = {**self.stored, **values}
        return self._nodes(self.model.graph, env)


def interpret(model: onnx.ModelProto, widen: bool = True) -> Callable[[Mapping[str, Any]], list[Any]]:
    """``f(values) -> outputs``: the graph with its runtime inputs (and any initializers to
    override) taken from ``values`` by name; other initializers at their stored values, float
    ones widened to float64 (unless ``widen`` is false: the model's own precision).

    Raises ``NotImplementedError`` naming the ops this interpreter lacks."""
    return _Interpreter(model, widen)
