"""An ONNX graph evaluated by JAX in float64: a reference for models without their framework.

The onnx package's light architectures (AlexNet, DenseNet-121, Inception, ResNet-50, ...) come
as ONNX graphs only, and ONNX Runtime has no float64 Conv kernel, so neither the framework nor
float64 finite differences can give their derivatives. Here each node is run by a jax.numpy /
jax.lax function with the op's ONNX semantics (opset 18), so ``jax.grad``, ``jax.jvp``,
``jax.vjp`` and ``jax.vmap`` of the interpreted graph are the independent float64 answers
onnax's float32 graphs are measured against. Only the ops those models use are covered; any
other op raises. Integer tensors (shapes, axes) stay NumPy arrays, so shapes stay static.

``interpret`` checks nothing about the semantics itself: the corpus generator compares the
interpreted forward pass with ONNX Runtime's before it trusts the derivatives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

Op = Callable[[list[Any], dict[str, Any]], list[Any]]


def _jnp() -> Any:
    import jax.numpy as jnp

    return jnp


def _lax() -> Any:
    from jax import lax

    return lax


def _widen(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a


def _spatial_pads(attrs: Mapping[str, Any], spatial: int) -> list[tuple[int, int]]:
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotImplementedError("auto_pad")
    pads = list(attrs.get("pads", [0] * (2 * spatial)))
    return [(pads[i], pads[i + spatial]) for i in range(spatial)]


def _conv(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x, w = ins[0], ins[1]
    spatial = w.ndim - 2
    y = _lax().conv_general_dilated(
        x,
        w,
        window_strides=tuple(attrs.get("strides", [1] * spatial)),
        padding=_spatial_pads(attrs, spatial),
        rhs_dilation=tuple(attrs.get("dilations", [1] * spatial)),
        dimension_numbers=("NCHW", "OIHW", "NCHW") if spatial == 2 else None,
        feature_group_count=int(attrs.get("group", 1)),
    )
    if len(ins) > 2 and ins[2] is not None:
        y = y + ins[2].reshape((1, -1) + (1,) * spatial)
    return [y]


def _window(x: Any, attrs: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...], list[tuple[int, int]]]:
    """Window dims, strides and padding of a pool over x's spatial axes (ceil_mode as padding)."""
    kernel = list(attrs["kernel_shape"])
    spatial = len(kernel)
    strides = list(attrs.get("strides", [1] * spatial))
    if list(attrs.get("dilations", [1] * spatial)) != [1] * spatial:
        raise NotImplementedError("pool dilations")
    pads = _spatial_pads(attrs, spatial)
    if attrs.get("ceil_mode", 0):
        for i in range(spatial):
            n = x.shape[2 + i] + pads[i][0] + pads[i][1]
            out = -(-(n - kernel[i]) // strides[i]) + 1
            # (the last window must start inside the input or its left padding)
            if (out - 1) * strides[i] >= x.shape[2 + i] + pads[i][0]:
                out -= 1
            extra = max((out - 1) * strides[i] + kernel[i] - n, 0)
            pads[i] = (pads[i][0], pads[i][1] + extra)
    return (1, 1, *kernel), (1, 1, *strides), [(0, 0), (0, 0), *pads]


def _max_pool(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    dims, strides, pads = _window(x, attrs)
    return [_lax().reduce_window(x, -np.inf, _lax().max, dims, strides, pads)]


def _average_pool(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    jnp = _jnp()
    x = ins[0]
    dims, strides, pads = _window(x, attrs)
    total = _lax().reduce_window(x, 0.0, _lax().add, dims, strides, pads)
    if attrs.get("count_include_pad", 0):
        # Every element of the explicitly padded input counts (ceil_mode's extra padding not).
        explicit = _spatial_pads(attrs, x.ndim - 2)
        padded = jnp.ones(tuple(n + a + b for n, (a, b) in zip(x.shape[2:], explicit, strict=True)), x.dtype)
        count = _lax().reduce_window(
            padded,
            0.0,
            _lax().add,
            dims[2:],
            strides[2:],
            [(0, p[1] - e[1]) for p, e in zip(pads[2:], explicit, strict=True)],
        )
    else:
        count = _lax().reduce_window(
            jnp.ones(x.shape[2:], x.dtype), 0.0, _lax().add, dims[2:], strides[2:], pads[2:]
        )
    return [total / count]


def _batch_norm(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    if attrs.get("training_mode", 0):
        raise NotImplementedError("BatchNormalization training_mode")
    jnp = _jnp()
    x, scale, bias, mean, var = ins[:5]
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / jnp.sqrt(var + attrs.get("epsilon", 1e-5))
    return [(x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)]


def _lrn(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    jnp = _jnp()
    x = ins[0]
    size = int(attrs["size"])
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = jnp.pad(x * x, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    window = sum(sq[:, k : k + x.shape[1]] for k in range(size))
    return [x / (bias + alpha / size * window) ** beta]


def _gemm(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    a, b = ins[0], ins[1]
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    y = attrs.get("alpha", 1.0) * (a @ b)
    if len(ins) > 2 and ins[2] is not None:
        y = y + attrs.get("beta", 1.0) * ins[2]
    return [y]


def _reshape(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x, shape = ins[0], [int(d) for d in np.asarray(ins[1])]
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


def _flatten(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    axis = int(attrs.get("axis", 1)) % (x.ndim + 1) if x.ndim else 0
    return [x.reshape((int(np.prod(x.shape[:axis])), -1))]


def _reduce_sum(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    axes = None if len(ins) < 2 or ins[1] is None else tuple(int(a) for a in np.asarray(ins[1]))
    if axes == () and attrs.get("noop_with_empty_axes", 0):
        return [x]
    return [_jnp().sum(x, axis=axes or None, keepdims=bool(attrs.get("keepdims", 1)))]


def _unsqueeze(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    axes = sorted(int(a) % (x.ndim + len(ins[1])) for a in np.asarray(ins[1]))
    for a in axes:
        x = _jnp().expand_dims(x, a) if not isinstance(x, np.ndarray) else np.expand_dims(x, a)
    return [x]


def _shape(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    shape = np.asarray(ins[0].shape, np.int64)
    start, end = attrs.get("start", 0), attrs.get("end")
    return [shape[start:end]]


def _constant(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    if "value" not in attrs:
        raise NotImplementedError("Constant without a tensor value")
    return [_widen(numpy_helper.to_array(attrs["value"]))]


def _concat(ins: list[Any], attrs: dict[str, Any]) -> list[Any]:
    if all(isinstance(v, np.ndarray) and not np.issubdtype(v.dtype, np.floating) for v in ins):
        return [np.concatenate(ins, axis=int(attrs["axis"]))]
    return [_jnp().concatenate(ins, axis=int(attrs["axis"]))]


OPS: dict[str, Op] = {
    "Conv": _conv,
    "Relu": lambda ins, attrs: [_jnp().maximum(ins[0], 0.0)],
    "MaxPool": _max_pool,
    "AveragePool": _average_pool,
    "GlobalAveragePool": lambda ins, attrs: [
        _jnp().mean(ins[0], axis=tuple(range(2, ins[0].ndim)), keepdims=True)
    ],
    "BatchNormalization": _batch_norm,
    "LRN": _lrn,
    "Gemm": _gemm,
    "Softmax": lambda ins, attrs: [_softmax(ins[0], int(attrs.get("axis", -1)))],
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Concat": _concat,
    "Transpose": lambda ins, attrs: [
        _jnp().transpose(ins[0], attrs.get("perm", list(range(ins[0].ndim))[::-1]))
    ],
    "Unsqueeze": _unsqueeze,
    "Shape": _shape,
    "Dropout": lambda ins, attrs: [ins[0], _jnp().ones(ins[0].shape, bool)],
    "Identity": lambda ins, attrs: [ins[0]],
    "Constant": _constant,
    "Sum": lambda ins, attrs: [sum(ins[1:], ins[0])],
    "Add": lambda ins, attrs: [ins[0] + ins[1]],
    "Sub": lambda ins, attrs: [ins[0] - ins[1]],
    "Mul": lambda ins, attrs: [ins[0] * ins[1]],
    "ReduceSum": _reduce_sum,
}


def _softmax(x: Any, axis: int) -> Any:
    import jax

    return jax.nn.softmax(x, axis=axis)


def _initializers(model: onnx.ModelProto, widen: bool) -> dict[str, np.ndarray]:
    """Stored initializer values, float ones widened to float64 when ``widen``."""
    return {
        t.name: _widen(numpy_helper.to_array(t)) if widen else numpy_helper.to_array(t)
        for t in model.graph.initializer
    }


class Selected:
    """The interpreted graph as ``run(params, inputs)`` over the selected initializers and
    runtime inputs (by position), with the loss gradient over the parameters."""

    def __init__(
        self,
        model: onnx.ModelProto,
        loss: str,
        params: Sequence[str],
        inputs: Sequence[str],
        widen: bool = True,
    ) -> None:
        self.f = interpret(model, widen)
        self.params, self.inputs = list(params), list(inputs)
        self.loss = [o.name for o in model.graph.output].index(loss)
        stored = _initializers(model, widen)
        self.initial = [stored[p] for p in params]  # the parameters' stored values

    def run(self, ps: Sequence[Any], xs: Sequence[Any]) -> list[Any]:
        return self.f({**dict(zip(self.params, ps, strict=True)), **dict(zip(self.inputs, xs, strict=True))})

    def loss_grad(self, ps: Sequence[Any], xs: Sequence[Any]) -> Any:
        import jax

        return jax.grad(lambda p: self.run(p, xs)[self.loss])(list(ps))


def interpret(model: onnx.ModelProto, widen: bool = True) -> Callable[[Mapping[str, Any]], list[Any]]:
    """``f(values) -> outputs``: the graph with its runtime inputs (and any initializers to
    override) taken from ``values`` by name; other initializers at their stored values, float
    ones widened to float64 (unless ``widen`` is false: the model's own float32)."""
    graph = model.graph
    if graph.sparse_initializer or model.functions:
        raise NotImplementedError("sparse initializers or model functions")
    stored = _initializers(model, widen)
    missing = sorted({n.op_type for n in graph.node} - set(OPS))
    if missing:
        raise NotImplementedError(f"ops without a JAX counterpart here: {missing}")
    nodes = [
        (
            n.op_type,
            list(n.input),
            list(n.output),
            {a.name: helper.get_attribute_value(a) for a in n.attribute},
        )
        for n in graph.node
    ]
    outputs = [o.name for o in graph.output]

    def f(values: Mapping[str, Any]) -> list[Any]:
        env: dict[str, Any] = {**stored, **values}
        for op, ins, outs, attrs in nodes:
            results = OPS[op]([env[i] if i else None for i in ins], attrs)
            for name, v in zip(outs, results, strict=False):
                if name:
                    env[name] = v
        return [env[o] for o in outputs]

    return f


class KinkCheck:
    """Whether an example sits on a kink: ReLU inputs and max-pool windows so close to a tie
    that float32 rounding in the tested graph may take the other branch than the float64
    reference, and the derivatives differ by O(1) somewhere. Such an example's float64 loss
    gradient jumps under a perturbation of the input far below float32 rounding (relative
    ``rel``), where a smooth point's moves by about ``rel`` times its curvature."""

    def __init__(
        self, model: onnx.ModelProto, loss: str, params: Sequence[str], inputs: Sequence[str]
    ) -> None:
        import jax

        jax.config.update("jax_enable_x64", True)
        selected = Selected(model, loss, params, inputs)
        self.params, self.inputs = selected.initial, selected.inputs
        self.grad = jax.jit(selected.loss_grad)

    def __call__(
        self, example: Mapping[str, np.ndarray], rel: float = 1e-6, tol: float = 1e-5, directions: int = 4
    ) -> bool:
        # (Several random directions: one may move along a tie instead of across it.)
        xs = [np.asarray(example[n], np.float64) for n in self.inputs]
        rng = np.random.default_rng(0)
        g0 = [np.asarray(g) for g in self.grad(self.params, xs)]
        scale = max(float(np.max(np.abs(g))) for g in g0)
        for _ in range(directions):
            moved = [x * (1 + rel * rng.standard_normal(x.shape)) for x in xs]
            g1 = [np.asarray(g) for g in self.grad(self.params, moved)]
            change = max(float(np.max(np.abs(a - b))) for a, b in zip(g1, g0, strict=True))
            if change > tol * max(scale, 1e-3):
                return True
        return False


def references(
    model: onnx.ModelProto,
    loss: str,
    params: Sequence[str],
    inputs: Sequence[str],
    base: Mapping[str, np.ndarray],
    batch: Sequence[Mapping[str, np.ndarray]],
    seed: int,
) -> tuple[dict[str, np.ndarray], dict[str, list[np.ndarray]]]:
    """Every transform's inputs and expected outputs (corpus layout, see artifacts): the loss
    gradient over ``params``; jvp and vjp over the runtime ``inputs`` (every output); the HVP
    along a parameter direction; vmap and vmap(grad) over ``batch``. Expected values are
    stored in float32 (they are compared at float32 tolerances; the largest models' per-example
    gradients run to hundreds of MB).

    Also every transform's outputs as JAX computes them in the model's own float32: how far
    those land from the float64 answers is the error float32 itself allows (deep networks with
    random weights are ill-conditioned in the input: a float32 jvp through ResNet-50 may be
    off by 1e-3 in any implementation)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    outputs = [o.name for o in model.graph.output]
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    feeds32 = [np.asarray(base[n]) for n in inputs]
    stacked = {n: np.stack([ex[n] for ex in batch]) for n in inputs}
    # (Directions drawn in float32, the values the onnax graphs are fed.)
    t_x = [rng.standard_normal(x.shape).astype(np.float32) for x in feeds32]
    cts: list[np.ndarray] | None = None
    v_p = [rng.standard_normal(shapes[p]).astype(np.float32) for p in params]

    def evaluate(widen: bool) -> dict[str, list[np.ndarray]]:
        """Every transform's outputs, in float64 (widen) or in the model's float32."""
        nonlocal cts
        selected = Selected(model, loss, params, inputs, widen)
        run, loss_grad = selected.run, selected.loss_grad
        cast = _widen if widen else (lambda a: a)

        # Compiled (op-by-op dispatch of a large network's derivatives takes minutes), with the
        # parameters as arguments: jit would embed closed-over arrays as constants.
        p0 = selected.initial
        x0 = [cast(x) for x in feeds32]
        like = [np.asarray(x).dtype for x in x0]
        out: dict[str, list[np.ndarray]] = {}
        primal = jax.jit(run)(p0, x0)
        out["grad"] = [*primal, *jax.jit(loss_grad)(p0, x0)]
        ts = [t.astype(d) for t, d in zip(t_x, like, strict=True)]
        _, tangents = jax.jit(lambda ps, xs, ts: jax.jvp(lambda *a: tuple(run(ps, a)), tuple(xs), tuple(ts)))(
            p0, x0, ts
        )
        out["jvp"] = [*primal, *tangents]
        if cts is None:
            cts = [rng.standard_normal(np.shape(o)).astype(np.float32) for o in primal]
        c = [ct.astype(np.asarray(o).dtype) for ct, o in zip(cts, primal, strict=True)]
        pullback = jax.jit(lambda ps, xs, c: jax.vjp(lambda *a: tuple(run(ps, a)), *xs)[1](tuple(c)))
        out["vjp"] = [*primal, *pullback(p0, x0, c)]
        vs = [v.astype(np.asarray(p).dtype) for v, p in zip(v_p, p0, strict=True)]
        g, hvp = jax.jit(lambda ps, xs, vs: jax.jvp(lambda p: loss_grad(p, xs), (ps,), (vs,)))(p0, x0, vs)
        out["jvp_grad"] = [*primal, *g, *hvp]
        xs_b = [cast(stacked[n]) for n in inputs]
        outs_b = jax.jit(jax.vmap(lambda xs, ps: tuple(run(ps, xs)), in_axes=(0, None)))(xs_b, p0)
        out["vmap"] = list(outs_b)
        grads_b = jax.jit(jax.vmap(lambda xs, ps: loss_grad(ps, xs), in_axes=(0, None)))(xs_b, p0)
        out["vmap_grad"] = [*outs_b, *grads_b]
        return {t: [np.asarray(v, np.float64) for v in vals] for t, vals in out.items()}

    exact = evaluate(widen=True)
    for t, vals in exact.items():
        for n, v in (stacked if t.startswith("vmap") else base).items():
            arrays[f"{t}/feed/{n}"] = np.asarray(v)
        for k, v in enumerate(vals):
            arrays[f"{t}/out/{k}"] = v.astype(np.float32)
    for n, v in zip(inputs, t_x, strict=True):
        arrays[f"jvp/tangent/{n}"] = v.astype(np.float32)
    assert cts is not None
    for o, c in zip(outputs, cts, strict=True):
        arrays[f"vjp/cotangent/{o}"] = c.astype(np.float32)
    for n, v in zip(params, v_p, strict=True):
        arrays[f"jvp_grad/tangent/{n}"] = v.astype(np.float32)

    return arrays, evaluate(widen=False)
